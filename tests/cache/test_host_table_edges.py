"""The host table at the edges of its bit trees and its arena, the bit trees themselves, and
`check_invariants` catching a broken table."""

from functools import partial

import numpy as np
import pytest

from numbakv.cache.bittree import (
    tree_clear,
)
from numbakv.cache.table import HostTable
from numbakv.reference.table import CellTable

from table_pair import assert_same, clone_id, config, drive_both, new_id, remove, step, step_cells

# -- the edges of the bit trees ------------------------------------------------------


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


# -- check_invariants ----------------------------------------------------------------


def corrupt_position(host):
    host._pos[host.cells_of(0)[1]] = 0  # sequence 0 holds position 0 twice


def corrupt_owner(host):
    host._owners[host.cells_of(0)[0], 0] |= np.uint64(1 << 3)  # a dead id owns a cell


def corrupt_tree(host):
    tree_clear(host._trees[1], host._offs, host.cells_of(0)[0])  # an occupied cell looks free


def corrupt_segment(host):
    host._segments.truncate(0, 1)  # the segment forgets a cell


@pytest.mark.parametrize(
    "corrupt", [corrupt_position, corrupt_owner, corrupt_tree, corrupt_segment]
)
def test_check_invariants_catches_a_broken_table(corrupt):
    host = HostTable(config(16, 4))
    a = host.seq_new()
    step(host, [a, a, a])
    host.check_invariants()
    corrupt(host)
    with pytest.raises(AssertionError, match="invariant broken"):
        host.check_invariants()
