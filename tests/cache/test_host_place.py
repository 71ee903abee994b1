"""`HostTable.place` (find, then claim, in one njit call) and `check_declaration`'s one-pass
check of an id array or list, each held to the path it replaced.

- place: two host tables driven alike by random verbs; one places each step with `place`,
  the other with `find_cells` then `claim`. After every verb: the same cells and positions,
  the same snapshot, the same cells of every sequence, the same counts, and both tables'
  invariants. A small table with clones and removals makes the arena compact inside place.
- check_declaration: random id arrays (every integer dtype) and lists, valid and not, give
  what the id-by-id check gives: the same int32 array, or the same error class and message.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.cache.arena import Segments
from numbakv.cache.table import HostTable
from numbakv.core import calls
from numbakv.core.calls import check_declaration
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CacheError, CapacityError
from numbakv.reference.table import CellTable

from helpers import stable_id
from table_pair import assert_same, config, step

# -- place against find_cells + claim ------------------------------------------------


def placed(table: HostTable, seq_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(cells, positions) of `place`, written into views of one buffer, as a step's are."""
    n = len(seq_ids)
    buffer = np.full((4, n + 2), -7, dtype=np.int32)
    table.place(np.array(seq_ids, np.int32), buffer)
    assert buffer[2, :n].tolist() == list(seq_ids)
    assert (buffer[:, n:] == -7).all() and (buffer[3] == -7).all()  # nothing else written
    return buffer[0, :n].copy(), buffer[1, :n].copy()


def found_and_claimed(table: HostTable, seq_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    cells = table.find_cells(len(seq_ids))
    return cells, table.claim(cells, np.array(seq_ids, dtype=np.int32))


def assert_twins(got: HostTable, expect: HostTable) -> None:
    """Everything of the two host tables is equal, indexes included."""
    assert got.snapshot(rows=0) == expect.snapshot(rows=0)
    assert (got.read_len, got.used_cells, got.free_cells) == (
        expect.read_len,
        expect.used_cells,
        expect.free_cells,
    )
    for seq in range(got.config.max_seqs):
        assert got.length(seq) == expect.length(seq)
        np.testing.assert_array_equal(got.cells_of(seq), expect.cells_of(seq))
    np.testing.assert_array_equal(got._n_owners, expect._n_owners)
    np.testing.assert_array_equal(got._trees, expect._trees)
    got.check_invariants()
    expect.check_invariants()


def random_verb(rng: np.random.Generator, ref: CellTable, max_width: int) -> tuple[str, tuple]:
    """(name, args) of one verb the tables accept, drawn from the reference's state."""
    live = np.flatnonzero(ref.live).tolist()
    has_free_id = len(live) < ref.config.max_seqs
    kind = rng.choice(["new", "step", "step", "step", "prefill", "clone", "rewind", "rm"])
    if not live or (kind == "new" and has_free_id):
        return "new", ()
    if kind in ("step", "prefill") and ref.free_cells:
        n = int(rng.integers(1, min(max_width, ref.free_cells) + 1))
        if kind == "prefill":  # one sequence's tokens
            return "step", ([int(rng.choice(live))] * n,)
        return "step", (rng.choice(live, n).tolist(),)  # a mix, sequences repeating
    seq = int(rng.choice(live))
    if kind == "clone" and has_free_id:
        return "clone", (seq, int(rng.integers(ref.length(seq) + 1)))
    if kind == "rewind":
        return "rewind", (seq, int(rng.integers(ref.length(seq) + 1)))
    return "rm", (seq,)


def run_verb(table, name: str, args: tuple, place_step):
    """The verb's result: (cells, positions) of a step, the id of new and clone, the cells
    rm and rewind return (None from the reference)."""
    if name == "step":
        return place_step(table, *args)
    verb = {"new": "seq_new", "clone": "seq_clone", "rewind": "rewind", "rm": "seq_rm"}[name]
    got = getattr(table, verb)(*args)
    return got[0] if isinstance(got, tuple) else got


def drive(seed: int, capacity: int, max_seqs: int, max_width: int, n_verbs: int) -> None:
    """Runs n_verbs random verbs on a placing, a find+claim and a reference table, comparing
    them after each."""
    cfg = config(capacity, max_seqs, max_width)
    got, expect, ref = HostTable(cfg), HostTable(cfg), CellTable(cfg)
    rng = np.random.default_rng(seed)
    for _ in range(n_verbs):
        name, args = random_verb(rng, ref, cfg.max_width)
        expect_result = run_verb(expect, name, args, found_and_claimed)
        got_result = run_verb(got, name, args, placed)
        ref_result = run_verb(ref, name, args, step)
        if name == "step":  # find+claim shares claim with place: the reference has its own
            for g, e, r in zip(got_result, expect_result, ref_result, strict=True):
                np.testing.assert_array_equal(g, e)
                np.testing.assert_array_equal(g, r)
        elif isinstance(expect_result, np.ndarray):
            np.testing.assert_array_equal(got_result, expect_result)
        else:
            assert got_result == expect_result
        assert_twins(got, expect)
        assert_same(got, ref)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.sampled_from([8, 63, 64, 65, 200, 64 * 64 + 1]),
    max_seqs=st.sampled_from([1, 3, 64, 65, 130]),
    max_width=st.sampled_from([1, 7, 64, 65]),
)
def test_place_equals_find_then_claim(seed, capacity, max_seqs, max_width):
    drive(seed, capacity, max_seqs, max_width, n_verbs=30)


def test_place_compacts_the_arena_and_still_equals_find_then_claim(monkeypatch):
    calls = []
    original = Segments._compact

    def counted(self, short):
        calls.append(short)
        original(self, short)

    monkeypatch.setattr(Segments, "_compact", counted)
    in_place = []
    original_place = HostTable.place

    def counted_place(self, *args):
        before = len(calls)
        original_place(self, *args)
        in_place.append(len(calls) - before)

    monkeypatch.setattr(HostTable, "place", counted_place)
    for seed in range(6):
        drive(seed, capacity=40, max_seqs=3, max_width=8, n_verbs=300)
    assert sum(in_place) > 0  # the kernel came up short, Python compacted, the kernel ran again


def test_place_writes_the_worked_step():
    host = HostTable(config(16, 4))
    a, b = host.seq_new(), host.seq_new()
    assert [x.tolist() for x in placed(host, [a, a, a, b, b])] == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert [x.tolist() for x in placed(host, [b, a])] == [[5, 6], [2, 3]]
    host.seq_rm(a)
    assert [x.tolist() for x in placed(host, [b])] == [[0], [3]]  # the hole refills first
    host.check_invariants()


def test_place_refusals_change_nothing():
    host = HostTable(config(8, 2))
    a = host.seq_new()
    placed(host, [a] * 6)
    before = host.snapshot(rows=0), host._segments.seg.copy(), host._segments.arena.copy()
    ids = np.full(3, a, dtype=np.int32)
    with pytest.raises(CapacityError, match="3 tokens with only 2 free cells"):
        host.place(ids, np.zeros((3, 3), np.int32))
    with pytest.raises(ValueError, match=r"2 ids into rows of shape \(3, 1\)"):
        host.place(ids[:2], np.zeros((3, 1), np.int32))
    with pytest.raises(ValueError, match=r"rows of shape \(2, 4\)"):
        host.place(ids[:2], np.zeros((2, 4), np.int32))
    after = host.snapshot(rows=0), host._segments.seg.copy(), host._segments.arena.copy()
    assert after[0] == before[0]
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[2], before[2])
    host.check_invariants()


# -- check_declaration's one pass against the id-by-id check ---------------------------

MAX_SEQS = 70
MAX_WIDTH = 6


def declaration_config(max_seq_len: int | None = None) -> CacheConfig:
    return CacheConfig(
        n_layers=1,
        n_kv_heads=1,
        head_dim=4,
        capacity=64,
        max_width=MAX_WIDTH,
        max_seqs=MAX_SEQS,
        max_seq_len=max_seq_len,
    )


def outcome(call):
    """('ok', array) or (error class, message)."""
    try:
        return "ok", call()
    except CacheError as error:
        return type(error), str(error)


def assert_same_outcome(table, cfg: CacheConfig, seq_ids) -> None:
    """check_declaration gives for seq_ids what the id-by-id check gives."""
    got = outcome(lambda: check_declaration(table, cfg, seq_ids))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(calls, "_admitted_at_once", lambda *args: None)  # id by id, and
        # lengths counted with NumPy
        expect = outcome(lambda: check_declaration(table, cfg, seq_ids))
    assert got[0] == expect[0]
    if got[0] != "ok":
        assert got[1] == expect[1]
        return
    ids = got[1]
    np.testing.assert_array_equal(ids, expect[1])
    assert ids.dtype == np.int32 and ids.flags.c_contiguous and ids.ndim == 1
    if isinstance(seq_ids, np.ndarray):
        assert not np.shares_memory(ids, seq_ids)  # a fresh array: the caller keeps theirs


def tables(cfg: CacheConfig, live: list[int], filled: int):
    """A host and a reference table with ids `live` live, holding `filled` cells."""
    for table in (HostTable(cfg), CellTable(cfg)):
        for _ in range(max(live, default=-1) + 1):
            table.seq_new()
        for seq in range(max(live, default=-1) + 1):
            if seq not in live:
                table.seq_rm(seq)
        for start in range(0, filled, MAX_WIDTH):
            step(table, [live[0]] * min(MAX_WIDTH, filled - start))
        yield table


INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
EDGE_IDS = [-1, MAX_SEQS - 1, MAX_SEQS, 127, 128, 255, 2**31 - 1, 2**31, 2**62, 2**63 - 1]


@st.composite
def declarations(draw, live: list[int]):
    """Mostly live ids (an array of some integer dtype, a list or a tuple of ints), sometimes
    with a bad one, an empty or too long one."""
    ids_of = st.sampled_from(live) | st.just(live[0])  # live[0] holds the filled cells
    bad = st.one_of(st.integers(-3, MAX_SEQS + 3), st.sampled_from(EDGE_IDS))
    size = st.sampled_from([0, 1, MAX_WIDTH - 1, MAX_WIDTH, MAX_WIDTH + 1])
    ids = draw(st.lists(st.one_of(ids_of, ids_of, ids_of, bad), min_size=0, max_size=8))
    ids = ids if draw(st.booleans()) else (ids * 8)[: draw(size)]
    form = draw(st.sampled_from(["list", "tuple", *range(len(INT_DTYPES))]))
    if form == "list":
        return ids
    if form == "tuple":
        return tuple(ids)
    dtype = INT_DTYPES[form]
    info = np.iinfo(dtype)
    fits = [x for x in ids if info.min <= x <= info.max]
    return np.array(fits, dtype=dtype)


@settings(max_examples=300, deadline=None)
@given(
    live=st.lists(st.integers(0, MAX_SEQS - 1), min_size=1, max_size=6, unique=True),
    filled=st.sampled_from([0, 5, 7, 8, 61]),
    max_seq_len=st.sampled_from([None, 8]),
    data=st.data(),
)
def test_one_pass_check_equals_id_by_id(live, filled, max_seq_len, data):
    cfg = declaration_config(max_seq_len)
    filled = min(filled, cfg.max_seq_len)
    seq_ids = data.draw(declarations(sorted(live)))
    for table in tables(cfg, sorted(live), filled):
        assert_same_outcome(table, cfg, seq_ids)


def test_the_one_pass_length_check_at_max_seq_len():
    cfg = declaration_config(max_seq_len=5)
    for table in tables(cfg, [0, 1], 3):  # sequence 0 holds 3 positions
        for seq_ids in ([0, 0], [1, 0, 0, 1], [0, 0, 0], [1, 0, 1, 0, 0]):
            assert_same_outcome(table, cfg, seq_ids)
        assert check_declaration(table, cfg, np.array([1, 0, 0, 1])).tolist() == [1, 0, 0, 1]
        with pytest.raises(CapacityError, match="sequence 0 holds 3 positions; 3 more"):
            check_declaration(table, cfg, np.array([1, 0, 1, 0, 0]))


LIVE = [0, 1, 64, 69]
ODD_DECLARATIONS = [
    [True, 1],  # bools are no ids, even beside ints
    [1, True],
    np.array([True, False]),
    [np.int64(1), 0],  # NumPy integers take the id-by-id path, and pass
    (np.uint8(64),),
    [1.0],
    np.array([0.0, 1.0]),
    [0, 2**70],
    [-(2**70)],
    [-1, 0],  # -1 would index live[69], which is live
    np.array([0, -1], dtype=np.int8),
    np.array([-70], dtype=np.int64),
    np.array([1, 0], dtype=">i4"),  # not native order
    np.array([[0, 1]]),
    np.array([0, 1, 64, 69, 0, 1], dtype=np.int64)[::2],  # strided
    np.arange(2, dtype=np.uint64),
    np.array([2**64 - 1], dtype=np.uint64),
    np.array([], dtype=np.int32),
    [],
    range(2),
    "01",
    iter([0]),
    5,
    None,
    [[0]],
    [0] * (MAX_WIDTH + 1),
    [2] * (MAX_WIDTH + 1),  # too long, and a dead id: the id is named first
]


@pytest.mark.parametrize("seq_ids", ODD_DECLARATIONS, ids=stable_id)
def test_odd_declarations_get_the_id_by_id_answer(seq_ids):
    cfg = declaration_config()
    for table in tables(cfg, LIVE, 10):
        if isinstance(seq_ids, type(iter([]))):
            seq_ids = iter([0])  # each table consumes its own
        assert_same_outcome(table, cfg, seq_ids)


def test_read_only_arrays_and_every_dtype_take_the_one_pass(monkeypatch):
    cfg = declaration_config()
    for table in tables(cfg, LIVE, 0):
        monkeypatch.setattr(table, "check_live", None)  # the id-by-id path would fail
        for dtype in INT_DTYPES:
            ids = np.array(LIVE, dtype=dtype)
            ids.flags.writeable = False
            assert check_declaration(table, cfg, ids[:MAX_WIDTH]).tolist() == LIVE
        ids = np.array(LIVE, dtype=np.int32)
        got = check_declaration(table, cfg, ids)
        assert got.tolist() == LIVE and not np.shares_memory(got, ids)
        assert check_declaration(table, cfg, LIVE).tolist() == LIVE
        assert check_declaration(table, cfg, tuple(LIVE)).tolist() == LIVE
