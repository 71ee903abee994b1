"""The host table and the reference table driven alike: configs, a step's placement on
either, comparisons of everything observable of the two, and `TablePair`, which applies
the conformance kit's ops (`numbakv.testing.check.decode`) to both tables."""

import numpy as np

from numbakv.cache.table import HostTable
from numbakv.core.calls import check_declaration
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CacheError
from numbakv.reference.table import CellTable
from numbakv.testing import Op

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


def cells_by_seq(snap) -> list[np.ndarray]:
    """Per sequence id, [pos(seq)] int32: its cells ordered by position, read off a reference
    snapshot in one pass (the owner bits of every cell, sorted by sequence, then position)."""
    n_seqs = len(snap.live)
    words = snap.owners.astype("<u8", copy=False).view(np.uint8)  # bit s of a row: sequence s
    bits = np.unpackbits(words, axis=1, bitorder="little")[:, :n_seqs]
    cells, seqs = np.nonzero(bits)
    order = np.lexsort((snap.pos[cells], seqs))
    cells, bounds = cells[order].astype(np.int32), np.searchsorted(seqs[order], range(n_seqs + 1))
    return [cells[bounds[s] : bounds[s + 1]] for s in range(n_seqs)]


def ref_cells(snap, seq: int) -> np.ndarray:
    """[pos(seq)] int32: `seq`'s cells ordered by position, read off a reference snapshot."""
    return cells_by_seq(snap)[seq]


def step(table, seq_ids) -> tuple[np.ndarray, np.ndarray]:
    """A step's placement, as prepare_step does it: find, then claim; (cells, positions)."""
    seq_ids = np.asarray(seq_ids, dtype=np.int32)
    cells = table.find_cells(len(seq_ids))
    if isinstance(table, HostTable):
        return cells, table.claim(cells, seq_ids)
    positions = table.positions_of(seq_ids)
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
    by_seq = cells_by_seq(expect)
    for seq in np.flatnonzero(ref.live).tolist():
        assert host.length(seq) == ref.length(seq)
        cells = host.cells_of(seq)
        assert cells.tolist() == by_seq[seq].tolist(), (seq, cells, by_seq[seq])


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


class TablePair:
    """HostTable and CellTable under the kit's ops, compared after each (`run`).

    A verb runs on both (`refuse_both`: the same refusal, nothing changed); an accepted one
    gives the same id, and the cells it touched are the ones the reference snapshot taken
    before it names (a clone's shared prefix, the cells `seq_rm` freed of its bit, those a
    rewind dropped), as int32. A step op is its declaration checked against each table
    (`check_declaration`), then `find_cells` (equal on both, and pure) and the claim: the
    same cells and positions. After every op: `assert_same`, both `check_invariants()`, and
    `find_cells` of every free cell (whose prefixes are the lowest n), equal and pure.
    """

    def __init__(self, cfg: CacheConfig):
        self.cfg, self.host, self.ref = cfg, HostTable(cfg), CellTable(cfg)

    # what `decode` reads of the state: the reference table's
    @property
    def live_seqs(self) -> list[int]:
        return np.flatnonzero(self.ref.live).tolist()

    def pos(self, seq: int) -> int:
        return self.ref.length(seq)

    @property
    def used_cells(self) -> int:
        return self.ref.used_cells

    def open(self, n: int) -> None:
        """Opens n sequences on both (the same ids), compared once after the last."""
        for _ in range(n):
            assert self.host.seq_new() == self.ref.seq_new()
        self.compare()

    def run(self, op: Op) -> None:
        getattr(self, "_" + op.verb)(self.ref.snapshot(rows=0), *op.args)
        self.compare()

    def compare(self) -> None:
        assert_same(self.host, self.ref)
        self.host.check_invariants()
        self.ref.check_invariants()
        free, before = self.ref.free_cells, self.ref.snapshot(rows=0)
        np.testing.assert_array_equal(self.host.find_cells(free), self.ref.find_cells(free))
        assert self.host.snapshot(rows=0) == before

    def _both(self, verb: str, *args):
        host, ref = getattr(self.host, verb), getattr(self.ref, verb)
        return refuse_both(lambda: host(*args), lambda: ref(*args), self.host, self.ref)

    def _seq_new(self, before) -> None:
        got = self._both("seq_new")
        if got is None:
            assert len(self.live_seqs) == self.cfg.max_seqs
        else:
            assert got[0] == got[1]

    def _seq_clone(self, before, src, upto=None) -> None:
        got = self._both("seq_clone", src, upto)
        if got is not None:
            (seq, shared), expect_seq = got
            assert seq == expect_seq
            cells = ref_cells(before, int(src))
            np.testing.assert_array_equal(shared, cells[: len(cells) if upto is None else upto])
            assert shared.dtype == np.int32

    def _seq_rm(self, before, seq) -> None:
        got = self._both("seq_rm", seq)
        if got is not None:
            np.testing.assert_array_equal(got[0], ref_cells(before, int(seq)))
            assert got[0].dtype == np.int32

    def _rewind(self, before, seq, position) -> None:
        got = self._both("rewind", seq, position)
        if got is not None:
            np.testing.assert_array_equal(got[0], ref_cells(before, int(seq))[position:])
            assert got[0].dtype == np.int32

    def _clear(self, before) -> None:
        self.host.clear()
        self.ref.clear()

    def _step(self, before, seq_ids, *_) -> None:
        """The declaration (its width, queries and K/V are the caches' business)."""
        got = refuse_both(
            lambda: check_declaration(self.host, self.cfg, list(seq_ids)),
            lambda: check_declaration(self.ref, self.cfg, list(seq_ids)),
            self.host,
            self.ref,
        )
        if got is None:
            return
        ids, expect_ids = got
        np.testing.assert_array_equal(ids, expect_ids)
        expect = self.ref.find_cells(len(ids))
        np.testing.assert_array_equal(self.host.find_cells(len(ids)), expect)
        assert self.host.snapshot(rows=0) == before  # find_cells is pure
        for got_part, expect_part in zip(step(self.host, ids), step(self.ref, ids), strict=True):
            np.testing.assert_array_equal(got_part, expect_part)
