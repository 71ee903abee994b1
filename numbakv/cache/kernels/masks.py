"""Masks (SPEC §3, §5): each window's uint8 mask, from the table mirror and the step buffers.

Token t (sequence s = seq_ids[t], position p = positions[t]) attends cell c iff
cell_pos[c] >= 0, s owns c, cell_pos[c] <= p and, for a window W > 0,
cell_pos[c] > p - W. Only rows t < width and columns c < read_len are written; the rest
of the mask keeps what an earlier step left there.
"""

import numpy as np

from numbakv.cache._cuda import cuda
from numbakv.cache.kernels import kernel, owner_bit
from numbakv.cache.kernels.launch import check_extent, launch_dims

# mask, cell_pos, cell_owners, seq_ids, positions, width, read_len, window
WRITE_MASK_SIGNATURES = [
    "void(uint8[:, ::1], int32[::1], uint64[:, ::1], int32[::1], int32[::1], int32, int32, int32)"
]


@kernel(WRITE_MASK_SIGNATURES)
def write_mask(mask, cell_pos, cell_owners, seq_ids, positions, width, read_len, window):
    """Writes mask[t, c] for t < width, c < read_len: 1 iff token t attends cell c, else 0."""
    # mask: [max_width, capacity] uint8  cell_pos: [capacity] int32
    # cell_owners: [capacity, n_words] uint64  seq_ids, positions: [max_width] int32
    # y strides over tokens (rows), x over cells (columns), so stores coalesce along a row
    for t in range(cuda.blockIdx.y, width, cuda.gridDim.y):
        seq = seq_ids[t]
        newest = positions[t]  # t sees positions in (oldest, newest]
        oldest = -1  # free cells hold -1: never seen
        if window > 0:
            oldest = max(oldest, newest - window)
        if seq < 0:  # padding: an empty range, an all-zero row
            seq = 0
            newest = -1
        word = seq >> 6
        bit = owner_bit(seq)
        for c in range(cuda.grid(1), read_len, cuda.gridsize(1)):
            pos = cell_pos[c]
            sees = oldest < pos <= newest and (cell_owners[c, word] & bit) != np.uint64(0)
            mask[t, c] = 1 if sees else 0


def launch_write_mask(
    mask,
    cell_pos,
    cell_owners,
    seq_ids,
    positions,
    width: int,
    read_len: int,
    window: int,
    stream=0,
) -> None:
    """Writes one window's mask, rows [0, width) and columns [0, read_len) only.

    mask        : device array, shape [max_width, capacity], uint8; 1 = attend
    cell_pos    : device array, shape [capacity], int32, -1 = free
    cell_owners : device array, shape [capacity, n_words], uint64
    seq_ids     : device array, shape [max_width], int32, -1 = padding (an all-zero row)
    positions   : device array, shape [max_width], int32
    width       : rows to write; read_len: columns to write; window: 0 = global, W > 0
    """
    check_extent("width", width, mask.shape[0], len(seq_ids), len(positions))
    check_extent("read_len", read_len, mask.shape[1], len(cell_pos), len(cell_owners))
    if window < 0:
        raise ValueError(f"window={window} must be 0 (global) or positive")
    if width == 0 or read_len == 0:
        return
    grid, threads = launch_dims(read_len, n_rows=width)
    write_mask[grid, threads, stream](
        mask,
        cell_pos,
        cell_owners,
        seq_ids,
        positions,
        np.int32(width),
        np.int32(read_len),
        np.int32(window),
    )
