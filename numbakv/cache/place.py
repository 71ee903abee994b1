"""The njit kernels of the host table's placement (docs/contract.md §2): find the cells,
then claim them.

`place` is what a step costs the host: one njit call that reserves arena room, finds the
lowest free cells and claims them, so that a 256-token decode step pays one numba dispatch
instead of four. `claim` alone serves `HostTable.claim` (cells found earlier).

The table's arrays, as `HostTable` keeps them:

    pos      : [capacity] int32, -1 = free
    owners   : [capacity, n_owner_words] uint64
    n_owners : [capacity] int32
    trees    : [2, words] uint64, rows FREE and OCC (`bittree`), levels at `offs`
    meta     : [4] int64, READ_LEN, USED, then the arena's TOP and GARBAGE (`arena.Segments`
               keeps a view of meta[ARENA:])
    arena, seg : `arena.Segments`' cell arena and segments

Every array an njit call takes costs dispatch time (some 0.1 µs with cold caches), hence
one `meta` for the table's and the arena's counters.
"""

import numbakv.cache.device  # noqa: F401, I001  (sets numba's simulator flag before numba is imported)

import numba
import numpy as np

from numbakv.cache import arena
from numbakv.cache.bittree import ONE, ZERO, lowest_set_bits_into, tree_clear_word, tree_set_word

FREE, OCC = 0, 1  # rows of `trees`: 1 = free, 1 = occupied
READ_LEN, USED, ARENA = 0, 1, 2  # slots of `meta`, updated in place; the arena's from ARENA


# not cached (cache=True): numba's cache notices changes to this file only, and both
# kernels call into bittree and arena
@numba.njit
def place(seq_ids, rows, pos, owners, n_owners, trees, offs, meta, cell_arena, seg):
    """Places token t of sequence seq_ids[t]: rows[0, t] its cell, rows[1, t] its position,
    rows[2, t] = seq_ids[t] (rows: [>= 3, >= n] int32, a step buffer's first three rows);
    `bittree.lowest_set_bits` of the free cells, then `claim`.

    Returns 0 once placed; -1, with nothing changed, when n > free cells or `rows` is too
    small; else the arena words still missing, with nothing placed (the caller compacts
    the arena and calls again).
    """
    n = len(seq_ids)
    if n > len(pos) - meta[USED] or rows.shape[0] < 3 or rows.shape[1] < n:
        return -1
    short = arena.reserve_room(cell_arena, seg, meta[ARENA:], seq_ids)
    if short == 0:
        cells, positions, ids = rows[0, :n], rows[1, :n], rows[2, :n]
        ids[:] = seq_ids  # may be the same memory: then this writes what is there
        lowest_set_bits_into(trees[FREE], offs, cells)
        claim(cells, positions, ids, pos, owners, n_owners, trees, offs, meta, cell_arena, seg)
    return short


@numba.njit
def claim(cells, positions, seq_ids, pos, owners, n_owners, trees, offs, meta, cell_arena, seg):
    """Claims cells[t] for token t: position, owner bit, the cell appended to its sequence's
    segment (which has room). Writes positions[t] = pos(s) + earlier tokens of s in the step.

    `cells` are free and distinct; the trees are updated a word at a time where neighbours
    share one (ascending cells, as `find_cells` gives them, share 64 to a word).
    """
    free, occupied = trees[FREE], trees[OCC]
    read_len = meta[READ_LEN]
    w, mask = np.int64(-1), ZERO  # the tree word of the cells claimed last, and their bits
    for t in range(len(cells)):
        c, s = np.int64(cells[t]), seq_ids[t]
        position = seg[arena.LEN, s]  # each earlier token of s appended one
        positions[t] = position
        pos[c] = position
        owners[c, s >> 6] |= ONE << np.uint64(s & 63)
        n_owners[c] += 1
        arena.append(cell_arena, seg, s, c)
        read_len = max(read_len, c + 1)
        if c >> 6 != w:
            _occupy(free, occupied, offs, w, mask)
            w, mask = c >> 6, ZERO
        mask |= ONE << np.uint64(c & 63)
    _occupy(free, occupied, offs, w, mask)
    meta[READ_LEN] = read_len
    meta[USED] += len(cells)


@numba.njit(cache=True)
def _occupy(free, occupied, offs, w, mask):
    """Marks the cells `mask` of tree word w occupied (nothing when w < 0)."""
    if w >= 0:
        tree_clear_word(free, offs, w, mask)
        tree_set_word(occupied, offs, w, mask)
