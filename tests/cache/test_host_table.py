"""`numbakv.cache.table.HostTable` held to the reference `CellTable`, verb by verb.

A hypothesis state machine runs the same random verbs on both tables (new, clone at a
random `upto`, rm, rewind, clear, steps (`place`), and refused
calls) and after every rule compares the snapshots, each live sequence's length and cells
in position order, read_len / used / free, and the cells each verb returned. The cells a
verb must return are derived from the reference snapshot taken before it.

Then the worked cases and the edges of the host table's bit trees: a capacity that is not
a multiple of 64, one of exactly 64 * 64 + 1, filling to exactly capacity, and sequence
ids past 63 and 127 carrying tokens.
"""

from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from numbakv.cache.arena import Segments
from numbakv.cache.bittree import (
    highest_bit,
    lowest_bit,
    new_tree,
    tree_clear,
    tree_next,
    tree_prev,
    tree_set,
)
from numbakv.cache.table import HostTable
from numbakv.config import CacheConfig
from numbakv.errors import CacheError, CapacityError, SequenceError
from numbakv.reference.table import CellTable

MAX_SEQS = (1, 3, 64, 65, 130)


def config(capacity: int, max_seqs: int, max_width: int = 8) -> CacheConfig:
    return CacheConfig(
        n_layers=1,
        n_kv_heads=1,
        head_dim=4,
        capacity=capacity,
        max_width=min(max_width, capacity),
        max_seqs=max_seqs,
    )


def ref_cells(snap, seq: int) -> np.ndarray:
    """[pos(seq)] int32: `seq`'s cells ordered by position, read off a reference snapshot."""
    word, bit = divmod(seq, 64)
    held = np.flatnonzero((snap.owners[:, word] >> np.uint64(bit)) & np.uint64(1))
    return held[np.argsort(snap.pos[held], kind="stable")].astype(np.int32)


def step(table, seq_ids) -> tuple[np.ndarray, np.ndarray]:
    """A step's placement, as prepare_step does it: (cells, positions)."""
    seq_ids = np.asarray(seq_ids, dtype=np.int32)
    if isinstance(table, HostTable):
        return table.place(seq_ids)
    positions = table.positions_of(seq_ids)
    cells = table.find_cells(len(seq_ids))
    table.claim(cells, positions, seq_ids)
    return cells, positions


def assert_same(host: HostTable, ref: CellTable) -> None:
    """Everything observable of the two tables is equal."""
    expect = ref.snapshot(rows=0)
    assert host.snapshot(rows=0) == expect
    assert (host.read_len, host.used_cells, host.free_cells) == (
        ref.read_len,
        ref.used_cells,
        ref.free_cells,
    )
    np.testing.assert_array_equal(host.live, ref.live)
    for seq in np.flatnonzero(ref.live).tolist():
        assert host.length(seq) == ref.length(seq)
        np.testing.assert_array_equal(host.cells_of(seq), ref_cells(expect, seq))


def refuse_both(host_call, ref_call, host: HostTable, ref: CellTable):
    """Runs both calls; if either raises, both must raise the same class and change nothing.

    Returns (host result, ref result), or None when both refused.
    """
    before = ref.snapshot(rows=0)
    errors = []
    results = []
    for call in (host_call, ref_call):
        try:
            results.append(call())
            errors.append(None)
        except CacheError as exc:
            errors.append(type(exc))
    assert errors[0] == errors[1]
    if errors[0] is None:
        return tuple(results)
    assert host.snapshot(rows=0) == before
    assert ref.snapshot(rows=0) == before
    return None


# -- the state machine -----------------------------------------------------------


def live_args(live: list[int]):
    """A live id, often one of the highest (live must not be empty)."""
    return st.sampled_from(live) | st.sampled_from(live[-3:])


def seq_args(live: list[int], max_seqs: int):
    """Mostly a live id (sometimes as np.int64), else something that is not one."""
    not_live = st.one_of(
        st.integers(-2, max_seqs + 1).filter(lambda s: s not in live),
        st.sampled_from([1.5, "0", None]),
    )
    if not live:
        return not_live
    live_ids = live_args(live)
    return st.one_of(live_ids, live_ids, live_ids, live_ids.map(np.int64), not_live)


def position_args(n: int):
    """Mostly a position in [0, n], else one just outside or not an integer."""
    inside = st.integers(0, n)
    return st.one_of(inside, inside, inside, st.sampled_from([-1, n + 1, 0.5]))


class TablePair(RuleBasedStateMachine):
    """HostTable and CellTable, driven alike."""

    @initialize(
        max_seqs=st.sampled_from(MAX_SEQS),
        capacity=st.integers(8, 80),
        max_width=st.integers(1, 12),
        data=st.data(),
    )
    def start(self, max_seqs, capacity, max_width, data):
        self.cfg = config(capacity, max_seqs, max_width)
        self.host, self.ref = HostTable(self.cfg), CellTable(self.cfg)
        n_live = data.draw(st.sampled_from(sorted({0, 1, max_seqs // 2, max_seqs})))
        for _ in range(n_live):  # many ids live at once: ids past 63 and 127 get tokens
            assert self.host.seq_new() == self.ref.seq_new()

    @property
    def live(self) -> list[int]:
        return np.flatnonzero(self.ref.live).tolist()

    @invariant()
    def tables_agree(self):
        if hasattr(self, "host"):
            assert_same(self.host, self.ref)
            self.host.check_invariants()
            self.ref.check_invariants()

    @rule()
    def seq_new(self):
        got = refuse_both(self.host.seq_new, self.ref.seq_new, self.host, self.ref)
        if got is None:
            assert len(self.live) == self.cfg.max_seqs
        else:
            assert got[0] == got[1]

    @rule(data=st.data())
    def seq_clone(self, data):
        src = data.draw(seq_args(self.live, self.cfg.max_seqs))
        n = self.ref.length(src) if src in self.live else 0
        upto = data.draw(st.one_of(st.none(), position_args(n)))
        before = self.ref.snapshot(rows=0)
        got = refuse_both(
            lambda: self.host.seq_clone(src, upto),
            lambda: self.ref.seq_clone(src, upto),
            self.host,
            self.ref,
        )
        if got is not None:
            (seq, shared), expect_seq = got
            assert seq == expect_seq
            expect = ref_cells(before, src)[: n if upto is None else upto]
            np.testing.assert_array_equal(shared, expect)
            assert shared.dtype == np.int32

    @rule(data=st.data())
    def seq_rm(self, data):
        seq = data.draw(seq_args(self.live, self.cfg.max_seqs))
        before = self.ref.snapshot(rows=0)
        got = refuse_both(
            lambda: self.host.seq_rm(seq), lambda: self.ref.seq_rm(seq), self.host, self.ref
        )
        if got is not None:
            np.testing.assert_array_equal(got[0], ref_cells(before, int(seq)))
            assert got[0].dtype == np.int32

    @rule(data=st.data())
    def rewind(self, data):
        seq = data.draw(seq_args(self.live, self.cfg.max_seqs))
        n = self.ref.length(seq) if seq in self.live else 0
        position = data.draw(position_args(n))
        before = self.ref.snapshot(rows=0)
        got = refuse_both(
            lambda: self.host.rewind(seq, position),
            lambda: self.ref.rewind(seq, position),
            self.host,
            self.ref,
        )
        if got is not None:
            np.testing.assert_array_equal(got[0], ref_cells(before, int(seq))[position:])
            assert got[0].dtype == np.int32

    @rule()
    def clear(self):
        self.host.clear()
        self.ref.clear()

    @precondition(lambda self: self.ref.free_cells > 0 and self.ref.live.any())
    @rule(data=st.data())
    def decode_step(self, data):
        n_max = min(self.cfg.max_width, self.ref.free_cells)
        seq_ids = data.draw(st.lists(live_args(self.live), min_size=1, max_size=n_max))
        before = self.ref.snapshot(rows=0)
        expect = self.ref.find_cells(len(seq_ids))
        got = self.host.find_cells(len(seq_ids))
        np.testing.assert_array_equal(got, expect)
        assert self.host.snapshot(rows=0) == before  # find_cells is pure
        got_cells, got_positions = step(self.host, seq_ids)
        expect_cells, expect_positions = step(self.ref, seq_ids)
        np.testing.assert_array_equal(got_cells, expect_cells)
        np.testing.assert_array_equal(got_positions, expect_positions)

    @rule(data=st.data())
    def find_cells(self, data):
        n = data.draw(st.integers(0, self.ref.free_cells))
        before = self.ref.snapshot(rows=0)
        np.testing.assert_array_equal(self.host.find_cells(n), self.ref.find_cells(n))
        assert self.host.snapshot(rows=0) == before


TestTablePair = TablePair.TestCase
TestTablePair.settings = settings(max_examples=200, stateful_step_count=50)


# -- worked cases ------------------------------------------------------------------


@pytest.fixture
def host() -> HostTable:
    return HostTable(config(16, 4))


def test_worked_prefill_then_decode(host):
    a, b = host.seq_new(), host.seq_new()
    cells, positions = step(host, [a, a, a, b, b])
    assert cells.tolist() == [0, 1, 2, 3, 4] and positions.tolist() == [0, 1, 2, 0, 1]
    cells, positions = step(host, [b, a])
    assert cells.tolist() == [5, 6] and positions.tolist() == [2, 3]
    assert host.cells_of(a).tolist() == [0, 1, 2, 6] and host.cells_of(b).tolist() == [3, 4, 5]
    assert (host.read_len, host.used_cells, host.free_cells) == (7, 7, 9)


def test_worked_hole_refills_before_read_len_grows(host):
    a, b = host.seq_new(), host.seq_new()
    step(host, [a, a, a, b])
    assert host.seq_rm(a).tolist() == [0, 1, 2]
    assert host.read_len == 4  # b still holds cell 3
    cells, positions = step(host, [b])
    assert cells.tolist() == [0] and positions.tolist() == [1]
    assert host.read_len == 4 and host.cells_of(b).tolist() == [3, 0]


def test_rm_of_last_cells_trims_read_len(host):
    a, b, c = host.seq_new(), host.seq_new(), host.seq_new()
    step(host, [a, b, b, c, c, c])
    assert host.read_len == 6
    host.seq_rm(b)  # a hole at 1..2: read_len stays
    assert host.read_len == 6
    host.seq_rm(c)  # the last cells: trims past the hole down to a's cell 0
    assert (host.read_len, host.used_cells) == (1, 1)
    host.rewind(a, 0)
    assert (host.read_len, host.used_cells) == (0, 0)
    assert host.snapshot(rows=0).pos.shape == (0,)


def test_clone_shares_until_last_owner_leaves(host):
    a = host.seq_new()
    step(host, [a] * 5)
    c, shared = host.seq_clone(a, upto=3)
    assert c == 1 and shared.tolist() == [0, 1, 2] and host.used_cells == 5
    assert host.seq_rm(a).tolist() == [0, 1, 2, 3, 4]
    assert (host.used_cells, host.read_len) == (3, 3)
    assert host.snapshot(rows=0).pos.tolist() == [0, 1, 2]
    host.seq_rm(c)
    assert (host.used_cells, host.read_len) == (0, 0)


def test_find_cells_is_pure(host):
    a = host.seq_new()
    step(host, [a] * 6)
    host.rewind(a, 2)
    host.seq_new()
    before = host.snapshot(rows=0)
    first = host.find_cells(5)
    assert first.tolist() == [2, 3, 4, 5, 6] and first.dtype == np.int32
    assert host.find_cells(5).tolist() == first.tolist()
    assert host.snapshot(rows=0) == before and host.used_cells == 2


def test_refusals_change_nothing(host):
    a = host.seq_new()
    step(host, [a] * 3)
    before = host.snapshot(rows=0)
    for call in (
        lambda: host.check_live(1),
        lambda: host.check_live("a"),
        lambda: host.check_live(-1),
        lambda: host.seq_rm(4),
        lambda: host.seq_clone(a, upto=4),
        lambda: host.seq_clone(a, upto=-1),
        lambda: host.seq_clone(2),
        lambda: host.rewind(a, 4),
        lambda: host.rewind(a, 1.0),
    ):
        with pytest.raises(SequenceError):
            call()
        assert host.snapshot(rows=0) == before
    for _ in range(3):
        host.seq_new()
    before = host.snapshot(rows=0)
    with pytest.raises(CapacityError):
        host.seq_new()
    with pytest.raises(CapacityError):
        host.seq_clone(a)
    with pytest.raises(SequenceError):  # src is checked before the free id
        host.seq_clone(7)
    assert host.snapshot(rows=0) == before


# -- the edges of the bit trees ------------------------------------------------------


def drive_both(cfg: CacheConfig, ops) -> None:
    """Runs `ops` (callables taking a table, returning plain values) on both tables alike."""
    host, ref = HostTable(cfg), CellTable(cfg)
    for op in ops:
        assert op(host) == op(ref)
        assert_same(host, ref)


def new_id(table) -> int:
    return table.seq_new()


def clone_id(table, src: int, upto: int) -> int:
    """The id seq_clone gave (the host returns (id, cells), the reference the id)."""
    got = table.seq_clone(src, upto)
    return got[0] if isinstance(got, tuple) else got


def step_cells(table, seq_ids) -> list[int]:
    return step(table, seq_ids)[0].tolist()


def remove(table, seq: int) -> None:
    table.seq_rm(seq)


@pytest.mark.parametrize("capacity", [100, 64 * 64 + 1])
def test_fill_to_exactly_capacity_then_refill(capacity):
    cfg = config(capacity, 3, max_width=64)
    host, ref = HostTable(cfg), CellTable(cfg)
    a, b = [(host.seq_new(), ref.seq_new())[0] for _ in range(2)]
    filled = 0
    while filled < capacity:
        n = min(64, capacity - filled)
        seq_ids = [a, b] * (n // 2) + [a] * (n % 2)
        np.testing.assert_array_equal(step(host, seq_ids)[0], step(ref, seq_ids)[0])
        filled += n
    assert (host.free_cells, host.read_len) == (0, capacity)
    assert len(host._segments.arena) <= 4 * capacity  # each sequence's cells, with room to double
    assert host.find_cells(0).tolist() == []
    assert_same(host, ref)
    # free cells around the word and summary edges, then refill them in one step
    for table in (host, ref):
        table.rewind(a, table.length(a) - 3)  # a's last cells: the top of the table
        table.seq_rm(b)  # every other cell
    assert_same(host, ref)
    n = min(64, host.free_cells)
    np.testing.assert_array_equal(host.find_cells(n), ref.find_cells(n))
    seq_ids = [a] * n
    np.testing.assert_array_equal(step(host, seq_ids)[0], step(ref, seq_ids)[0])
    assert_same(host, ref)


def test_holes_at_summary_edges():
    capacity = 64 * 64 + 1
    cfg = config(capacity, 3, max_width=64)
    host, ref = HostTable(cfg), CellTable(cfg)
    for table in (host, ref):
        keep, gone = table.seq_new(), table.seq_new()
        for i in range(capacity // 64 + 1):
            n = min(64, capacity - 64 * i)
            lone = {63, 64, 4095, 4096}  # cells the second sequence takes
            step(table, [gone if 64 * i + j in lone else keep for j in range(n)])
        table.seq_rm(gone)
    assert_same(host, ref)
    assert host.find_cells(4).tolist() == [63, 64, 4095, 4096]
    assert host.read_len == 4095  # trimmed past the freed 4096 and 4095
    for table in (host, ref):
        table.rewind(0, table.length(0) - 1)  # free the top cell, 4094
    assert_same(host, ref)
    assert host.read_len == 4094
    for table in (host, ref):
        table.rewind(0, 1)  # only cell 0 stays: trims across every summary level
    assert_same(host, ref)
    assert host.read_len == 1


@pytest.mark.parametrize("max_seqs", [65, 130])
def test_high_ids_carry_tokens(max_seqs):
    cfg = config(80, max_seqs, max_width=8)
    top = max_seqs - 1
    ids = [63, 64, top, top - 1]
    ops = [new_id] * max_seqs
    ops += [partial(step_cells, seq_ids=[s, s, 63]) for s in ids]
    ops += [partial(remove, seq=63), partial(clone_id, src=top, upto=2)]  # the clone is 63
    ops += [partial(step_cells, seq_ids=[63, top, 64, 63]), partial(remove, seq=top)]
    ops += [partial(step_cells, seq_ids=[63, 0, 63])]
    drive_both(cfg, ops)


def test_arena_compaction_keeps_every_sequence(monkeypatch):
    """Many clones and removals on a small table: segments move and the arena compacts."""
    compactions = []
    original = Segments._compact
    monkeypatch.setattr(
        Segments,
        "_compact",
        lambda self, short: (compactions.append(short), original(self, short)),
    )
    cfg = config(40, 3, max_width=8)
    rng = np.random.default_rng(0)
    host, ref = HostTable(cfg), CellTable(cfg)
    for _ in range(600):
        live = np.flatnonzero(ref.live).tolist()
        kind = rng.integers(4)
        if not live or (kind == 0 and len(live) < 3):
            op = new_id
        elif kind == 1 and len(live) < 3:
            src = live[rng.integers(len(live))]
            upto = int(rng.integers(ref.length(src) + 1))
            op = partial(clone_id, src=src, upto=upto)
        elif kind == 2 and ref.free_cells:
            n = int(rng.integers(1, min(8, ref.free_cells) + 1))
            op = partial(step_cells, seq_ids=rng.choice(live, n).tolist())
        else:
            op = partial(remove, seq=live[rng.integers(len(live))])
        assert op(host) == op(ref)
        assert_same(host, ref)
    assert compactions


# -- the bit tree itself -------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 63, 64, 65, 4095, 4096, 4097, 64**3 + 1])
def test_bit_tree_next_and_prev(n):
    rng = np.random.default_rng(n)
    bits, offs = new_tree(n)
    expect = np.zeros(n, dtype=bool)
    edges = [0, 63, 64, 4095, 4096, n - 1]
    picks = [i for i in edges if i < n] + rng.integers(0, n, 20).tolist()
    for i in picks:
        tree_set(bits, offs, i)
        expect[i] = True
    for i in picks[::3]:
        tree_clear(bits, offs, i)
        expect[i] = False
    on = np.flatnonzero(expect)
    for i in sorted(set(picks) | {0, n - 1}):
        after = on[on >= i]
        below = on[on <= i]
        assert tree_next(bits, offs, i) == (after[0] if len(after) else -1)
        assert tree_prev(bits, offs, i) == (below[-1] if len(below) else -1)
    assert tree_next(bits, offs, n) == -1


@given(st.integers(1, 2**64 - 1))
def test_bit_scans_of_a_word(word):
    assert highest_bit(np.uint64(word)) == word.bit_length() - 1
    assert lowest_bit(np.uint64(word)) == (word & -word).bit_length() - 1
