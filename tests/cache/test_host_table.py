"""`numbakv.cache.table.HostTable` held to the reference `CellTable`, verb by verb.

A hypothesis state machine runs the same random verbs on both tables (new, clone at a
random `upto`, rm, rewind, clear, steps (`place`), and refused
calls) and after every rule compares the snapshots, each live sequence's length and cells
in position order, read_len / used / free, and the cells each verb returned. The cells a
verb must return are derived from the reference snapshot taken before it.

Then the worked cases; the edges of the bit trees and the arena are in
`test_host_table_edges.py`.
"""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from numbakv.cache.table import HostTable
from numbakv.errors import CapacityError, SequenceError
from numbakv.reference.table import CellTable

from table_pair import MAX_SEQS, assert_same, config, ref_cells, refuse_both, step

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
