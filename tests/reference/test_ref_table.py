"""The reference table's own checks: `check_invariants` catches a broken table."""

import numpy as np
import pytest

from numbakv.core.config import CacheConfig
from numbakv.reference import CellCache


def corrupt_position(table):
    table.pos[1] = 0  # sequence 0 holds position 0 twice


def corrupt_owner(table):
    table.owners[0, 0] |= np.uint64(1 << 3)  # a dead id owns a cell


def corrupt_read_len(table):
    table.read_len = 5  # cells 3 and 4 are free


@pytest.mark.parametrize("corrupt", [corrupt_position, corrupt_owner, corrupt_read_len])
def test_check_invariants_catches_a_broken_table(corrupt):
    cache = CellCache(
        CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, capacity=16, max_width=4, max_seqs=4)
    )
    a = cache.seq_new()
    cache.declare_step([a, a, a])
    cache.prepare_step()
    cache.check_invariants()
    corrupt(cache._table)
    with pytest.raises(AssertionError, match="invariant broken"):
        cache.check_invariants()
