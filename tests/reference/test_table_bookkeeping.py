"""The reference table's bookkeeping (per-sequence cell lists, owner counts, used count, the
hole search's start, the touched cells) held to the cells by `check_invariants` on random
workloads with every verb, and each of its pieces shown to be checked."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from numbakv.core.config import CacheConfig
from numbakv.reference.table import CellTable

CONFIG = CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, capacity=24, max_width=6, max_seqs=70)


def naive_positions(table: CellTable, seq_ids: np.ndarray) -> list[int]:
    """Token by token: pos(s) plus the tokens of s before it."""
    seen: dict[int, int] = {}
    out = []
    for seq in seq_ids.tolist():
        seen[seq] = seen.get(seq, table.length(seq)) + 1
        out.append(seen[seq] - 1)
    return out


class TableMachine(RuleBasedStateMachine):
    """Every verb on one CellTable; after each, the bookkeeping agrees with the cells and
    every cell whose position or owners changed is among the cells the table says it
    touched."""

    def __init__(self):
        super().__init__()
        self.table = CellTable(CONFIG)
        self.before = self.state()

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        return self.table.pos.copy(), self.table.owners.copy()

    def live(self) -> list[int]:
        return np.flatnonzero(self.table.live).tolist()

    def touched_cover_the_changes(self) -> None:
        pos, owners = self.state()
        changed = (pos != self.before[0]) | (owners != self.before[1]).any(axis=1)
        touched = self.table.take_touched()
        assert set(np.flatnonzero(changed).tolist()) <= set(touched.tolist())
        assert self.table.take_touched().size == 0
        self.before = pos, owners

    @precondition(lambda self: not self.table.live.all())
    @rule()
    def seq_new(self):
        self.table.seq_new()

    @precondition(lambda self: self.live() and not self.table.live.all())
    @rule(data=st.data())
    def seq_clone(self, data):
        src = data.draw(st.sampled_from(self.live()))
        upto = data.draw(st.integers(0, self.table.length(src)))
        seq = self.table.seq_clone(src, upto)
        assert self.table.cells_of(seq).tolist() == self.table.cells_of(src)[:upto].tolist()

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def seq_rm(self, data):
        self.table.seq_rm(data.draw(st.sampled_from(self.live())))

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def rewind(self, data):
        seq = data.draw(st.sampled_from(self.live()))
        self.table.rewind(seq, data.draw(st.integers(0, self.table.length(seq))))

    @rule()
    def clear(self):
        self.table.clear()

    @precondition(lambda self: self.live() and self.table.free_cells)
    @rule(data=st.data())
    def place(self, data):
        table = self.table
        n = data.draw(st.integers(1, min(CONFIG.max_width, table.free_cells)))
        seq_ids = np.array(data.draw(st.lists(st.sampled_from(self.live()), min_size=n,
                                              max_size=n)), dtype=np.int32)  # fmt: skip
        positions = table.positions_of(seq_ids)
        assert positions.tolist() == naive_positions(table, seq_ids)
        cells = table.find_cells(n)
        lowest = np.flatnonzero(table.pos < 0)[:n]
        assert cells.tolist() == lowest.tolist() and cells.dtype == np.int32
        table.claim(cells, positions, seq_ids)

    @invariant()
    def bookkeeping_agrees(self):
        self.table.check_invariants()
        self.touched_cover_the_changes()


TestTableMachine = TableMachine.TestCase
TestTableMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def filled_table() -> CellTable:
    """Sequence 0 at positions 0-3 (cells 0, 1, 3, 4), sequence 1 at position 0 (cell 5),
    sequence 2 a clone of 0's first two (cells 0 and 1, shared), and a hole at cell 2
    (where a removed sequence's token was)."""
    table = CellTable(CONFIG)
    a, b, c = table.seq_new(), table.seq_new(), table.seq_new()
    for seq_ids in ([a, a], [c], [a, a], [b]):
        ids = np.array(seq_ids, dtype=np.int32)
        table.claim(table.find_cells(len(ids)), table.positions_of(ids), ids)
    table.seq_rm(c)
    assert table.seq_clone(a, 2) == c
    table.check_invariants()
    return table


def break_cells_list(table):
    table._cells[0][1] = 3


def break_owner_count(table):
    table.n_owners[0] = 1


def break_used(table):
    table.used_cells += 1


def break_hole_start(table):
    table._no_hole_below = 4


def break_length(table):
    table.lengths[1] = 2


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (break_cells_list, "sequence 0's cells are not kept"),
        (break_owner_count, "a cell's owner count is not kept"),
        (break_used, "used_cells is not kept"),
        (break_hole_start, "a free cell below _no_hole_below"),
        (break_length, "sequence 1's length is not kept"),
    ],
)
def test_check_invariants_catches_broken_bookkeeping(corrupt, match):
    table = filled_table()
    corrupt(table)
    with pytest.raises(AssertionError, match=match):
        table.check_invariants()


def test_verbs_touch_only_what_they_change():
    table = filled_table()
    table.take_touched()
    table.rewind(0, 3)
    assert sorted(table.take_touched().tolist()) == [4]
    seq = table.seq_clone(0, 2)
    assert sorted(table.take_touched().tolist()) == [0, 1]
    table.seq_rm(seq)
    assert sorted(table.take_touched().tolist()) == [0, 1]
    table.seq_rm(1)
    assert sorted(table.take_touched().tolist()) == [5]
