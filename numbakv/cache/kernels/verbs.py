"""Table verbs (docs/contract.md §2) on the device mirror of the cell table, so it tracks
the host table.

The host table does the bookkeeping and returns the few cells a verb touched; these
kernels apply the same change to the mirror (`cell_pos`: [capacity] int32, -1 = free;
`cell_owners`: [capacity, n_words] uint64) over that uploaded list, `cells[:n]`, and touch
no other cell. `seq_clone` is `add_owner`; `seq_rm` and `rewind` are `drop_owner`; `clear`
is `clear_table`. Each kernel has a launcher, `launch_<kernel>`, that picks the grid.
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel, owner_bit
from numbakv.cache.kernels.launch import check_extent, launch, launch_dims

# cells, n, seq, cell_owners
ADD_OWNER_SIGNATURES = ["void(int32[::1], int32, int32, uint64[:, ::1])"]
# cells, n, seq, cell_pos, cell_owners
DROP_OWNER_SIGNATURES = ["void(int32[::1], int32, int32, int32[::1], uint64[:, ::1])"]
# cell_pos, cell_owners
CLEAR_TABLE_SIGNATURES = ["void(int32[::1], uint64[:, ::1])"]


@kernel(ADD_OWNER_SIGNATURES)
def add_owner(cells, n, seq, cell_owners):
    """Sets `seq`'s owner bit on cells[:n] (skipping entries < 0)."""
    # cells: [>= n] int32, distinct  cell_owners: [capacity, n_words] uint64
    word = seq >> 6
    bit = owner_bit(seq)
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        cell = cells[i]
        if cell >= 0:
            cell_owners[cell, word] |= bit


@kernel(DROP_OWNER_SIGNATURES)
def drop_owner(cells, n, seq, cell_pos, cell_owners):
    """Clears `seq`'s owner bit on cells[:n]; a cell left with no owner gets cell_pos = -1."""
    # cells: [>= n] int32, distinct  cell_pos: [capacity] int32
    # cell_owners: [capacity, n_words] uint64
    word = seq >> 6
    keep = ~owner_bit(seq)
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        cell = cells[i]
        if cell >= 0:
            cell_owners[cell, word] &= keep
            is_owned = False
            for w in range(cell_owners.shape[1]):
                is_owned = is_owned or cell_owners[cell, w] != np.uint64(0)
            if not is_owned:
                cell_pos[cell] = -1


@kernel(CLEAR_TABLE_SIGNATURES)
def clear_table(cell_pos, cell_owners):
    """Frees every cell: cell_pos = -1 and every owner word 0."""
    # cell_pos: [capacity] int32  cell_owners: [capacity, n_words] uint64
    for c in range(cuda.grid(1), cell_pos.shape[0], cuda.gridsize(1)):
        cell_pos[c] = -1
        for w in range(cell_owners.shape[1]):
            cell_owners[c, w] = np.uint64(0)


def launch_add_owner(cells, n: int, seq: int, cell_owners, stream=0) -> None:
    """seq_clone on the mirror: sets `seq`'s owner bit on cells[:n].

    cells       : device array, shape [>= n], int32, distinct cells (entries < 0 are skipped)
    seq         : the clone's id, in [0, 64 * n_words)
    cell_owners : device array, shape [capacity, n_words], uint64
    """
    check_extent("n", n, len(cells))
    if n == 0:
        return
    grid, threads = launch_dims(n)
    launch(add_owner, grid, threads, stream, cells, np.int32(n), np.int32(seq), cell_owners)


def launch_drop_owner(cells, n: int, seq: int, cell_pos, cell_owners, stream=0) -> None:
    """seq_rm or rewind on the mirror: clears `seq`'s bit on cells[:n], frees unowned cells.

    cells       : device array, shape [>= n], int32, distinct cells (entries < 0 are skipped)
    seq         : the id leaving those cells, in [0, 64 * n_words)
    cell_pos    : device array, shape [capacity], int32; a cell left unowned gets -1
    cell_owners : device array, shape [capacity, n_words], uint64
    """
    check_extent("n", n, len(cells))
    if n == 0:
        return
    grid, threads = launch_dims(n)
    launch(
        drop_owner, grid, threads, stream, cells, np.int32(n), np.int32(seq), cell_pos, cell_owners
    )


def launch_clear_table(cell_pos, cell_owners, stream=0) -> None:
    """clear on the mirror: every cell_pos = -1, every owner word 0.

    cell_pos    : device array, shape [capacity], int32
    cell_owners : device array, shape [capacity, n_words], uint64
    """
    if len(cell_pos) == 0:
        return
    grid, threads = launch_dims(len(cell_pos))
    launch(clear_table, grid, threads, stream, cell_pos, cell_owners)
