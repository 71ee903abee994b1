"""Masks (docs/contract.md §3, §5): every window's uint8 mask, from the table mirror and the
step buffer.

Token t (sequence s = seq_ids[t], position p = positions[t]) attends cell c iff
cell_pos[c] >= 0, s owns c, cell_pos[c] <= p and, for a window W > 0,
cell_pos[c] > p - W. Only rows t < width and columns c < read_len are written (both read
from the step buffer); the rest of the mask keeps what an earlier step left there. A cache
writes the masks, every window's in one launch, only in a step that reads one (masked
attention, `Step.mask`).
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel, owner_bit
from numbakv.cache.kernels.launch import check_extent, launch, launch_dims
from numbakv.cache.kernels.step_buffer import POSITIONS, READ_LEN, SCALARS, SEQ_IDS, STEP, WIDTH

# masks, windows, cell_pos, cell_owners, step
WRITE_MASKS_SIGNATURES = [f"void(uint8[:, :, ::1], int32[::1], int32[::1], uint64[:, ::1], {STEP})"]


@kernel(WRITE_MASKS_SIGNATURES)
def write_masks(masks, windows, cell_pos, cell_owners, step):
    """Writes masks[i, t, c] for every window i, t < width, c < read_len: 1 iff token t
    attends cell c under window windows[i], else 0. One launch for every window: the
    position and owner test of a cell is made once for all of them."""
    # masks: [n_windows, max_width, capacity] uint8  windows: [n_windows] int32
    # cell_pos: [capacity] int32  cell_owners: [capacity, n_words] uint64
    # step: [4, columns] int32; y strides over tokens (rows), x over cells (columns), so
    # stores coalesce along a row; read_len is capped at the capacity (never read past)
    read_len = min(step[SCALARS, READ_LEN], np.int32(cell_pos.shape[0]))
    width = min(step[SCALARS, WIDTH], np.int32(masks.shape[1]), np.int32(step.shape[1]))
    for t in range(cuda.blockIdx.y, width, cuda.gridDim.y):
        seq = step[SEQ_IDS, t]
        newest = step[POSITIONS, t]  # t sees positions <= newest; free cells hold -1
        if seq < 0:  # padding: an empty range, an all-zero row
            seq = 0
            newest = -1
        word = seq >> 6
        bit = owner_bit(seq)
        for c in range(cuda.grid(1), read_len, cuda.gridsize(1)):
            pos = cell_pos[c]
            owned = -1 < pos <= newest and (cell_owners[c, word] & bit) != np.uint64(0)
            for i in range(windows.shape[0]):
                window = windows[i]
                sees = owned and (window == 0 or pos > newest - window)
                masks[i, t, c] = 1 if sees else 0


def launch_write_masks(masks, windows, cell_pos, cell_owners, step, width: int, stream=0) -> None:
    """Writes every window's mask, rows [0, width) and columns [0, read_len) only.

    masks       : device array, shape [n_windows, max_width, capacity], uint8; 1 = attend
    windows     : device array, shape [n_windows], int32: 0 = global, W > 0
    cell_pos    : device array, shape [capacity], int32, -1 = free
    cell_owners : device array, shape [capacity, n_words], uint64
    step        : device array, the step buffer [4, columns] int32 (`step_buffer`), its width
                  = `width`; sequence -1 = padding (a zero row)
    width       : the step's width (the grid's rows)
    The grid depends on the capacity and the width only (the kernel reads read_len).
    """
    check_extent("width", width, masks.shape[1], step.shape[1])
    if len(cell_pos) != masks.shape[2] or len(cell_owners) != masks.shape[2]:
        raise ValueError(
            f"masks {masks.shape}, cell_pos {cell_pos.shape} and cell_owners "
            f"{cell_owners.shape} disagree on the capacity"
        )
    if len(windows) != masks.shape[0]:
        raise ValueError(f"{len(windows)} windows for {masks.shape[0]} masks")
    if width == 0:
        return
    grid, threads = launch_dims(masks.shape[2], n_rows=width)
    launch(write_masks, grid, threads, stream, masks, windows, cell_pos, cell_owners, step)
