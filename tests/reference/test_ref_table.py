"""The reference table's own checks: `check_invariants` catches a broken table, and each
verb says it touched exactly the cells it changed (docs/contract.md §7.1).

Its behaviour under random workloads is held to the naive model (test_ref_workload.py) and
its touched cells to whole-table snapshots (tests/viz/test_recorder_touched.py)."""

import numpy as np
import pytest

from numbakv.core.config import CacheConfig
from numbakv.reference import CellCache
from numbakv.reference.table import CellTable

CONFIG = CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, capacity=16, max_width=4, max_seqs=4)


def corrupt_position(table):
    table.pos[1] = 0  # sequence 0 holds position 0 twice


def corrupt_owner(table):
    table.owners[0, 0] |= np.uint64(1 << 3)  # a dead id owns a cell


def corrupt_read_len(table):
    table.read_len = 5  # cells 3 and 4 are free


def corrupt_length(table):
    table.lengths[0] = 2  # sequence 0 holds 3 positions


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (corrupt_position, "sequence 0 does not hold positions"),
        (corrupt_owner, "sequence 3 owns cells but is not live"),
        (corrupt_read_len, "read_len is not trimmed"),
        (corrupt_length, "sequence 0's length is not kept"),
    ],
)
def test_check_invariants_catches_a_broken_table(corrupt, match):
    cache = CellCache(CONFIG)
    a = cache.seq_new()
    cache.declare_step([a, a, a])
    cache.prepare_step()
    cache.check_invariants()
    corrupt(cache._table)
    with pytest.raises(AssertionError, match=f"invariant broken: {match}"):
        cache.check_invariants()


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
    assert table.cells_of(a).tolist() == [0, 1, 3, 4] and table.cells_of(c).tolist() == [0, 1]
    return table


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
    assert table.read_len == 4 and table.take_touched().dtype == np.int32
    ids = np.array([0, 3, 0], dtype=np.int32)
    table.seq_new()
    cells = table.find_cells(3)
    assert cells.tolist() == [2, 4, 5]  # the hole first, then from read_len on
    table.claim(cells, table.positions_of(ids), ids)
    assert table.take_touched().tolist() == [2, 4, 5]
    table.clear()
    assert table.take_touched().tolist() == list(range(6))
