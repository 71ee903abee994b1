"""Placement (docs/contract.md §2, §8): a step's K/V rows into their cells, and its tokens
into the table mirror and the position -> cell table, in one preparation launch.

Both kernels read the step buffer (`step_buffer`: the tokens' cells, positions and sequences,
and the width) and act on rows t < width whose cell is placed (`cells[t] >= 0`); padded
rows (cell -1) are skipped, and nothing else is read or written.
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel, owner_bit
from numbakv.cache.kernels.launch import check_extent, launch, launch_dims
from numbakv.cache.kernels.step_buffer import CELLS, POSITIONS, SCALARS, SEQ_IDS, STEP, WIDTH
from numbakv.cache.kernels.storage import (
    BFLOAT16_STORAGE,
    FLOAT_STORAGE,
    kind,
    narrow_bfloat16,
)

FLOATS = FLOAT_STORAGE  # the step's K/V dtypes: the float storage dtypes


def scatter_signatures(storage: tuple[str, ...]) -> list[str]:
    """Every (input dtype, storage dtype) pair: k, v, k_pool, v_pool, step."""
    return [
        f"void({x}[:, :, ::1], {x}[:, :, ::1], {s}[:, :, ::1], {s}[:, :, ::1], {STEP})"
        for x in FLOATS
        for s in storage
    ]


SCATTER_KV_SIGNATURES = scatter_signatures(FLOAT_STORAGE)
# step, cell_pos, cell_owners, seq_cells, seq_len
PREPARE_TOKENS_SIGNATURES = [f"void({STEP}, int32[::1], uint64[:, ::1], int32[:, ::1], int32[::1])"]


def make_scatter(is_bfloat16):
    """The scatter kernel of float pools (the store casts) or of bfloat16 pools (rounded by
    `storage.narrow_bfloat16`): a closure constant, so the compiler keeps one branch."""

    def scatter_kv(k, v, k_pool, v_pool, step):
        """Copies K and V of each token t < width into pool row cells[t], rounded to the
        storage dtype (to nearest even); skips cells[t] < 0."""
        # k, v: [>= width, n_kv_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
        # step: [4, columns] int32; one item per (t, h, d), d fastest, so stores coalesce
        head_dim = k_pool.shape[2]
        row = k_pool.shape[1] * head_dim
        width = min(
            step[SCALARS, WIDTH],
            np.int32(k.shape[0]),
            np.int32(v.shape[0]),
            np.int32(step.shape[1]),
        )
        for i in range(cuda.grid(1), width * row, cuda.gridsize(1)):
            t = i // row
            cell = step[CELLS, t]
            if cell >= 0:
                j = i - t * row
                h = j // head_dim
                d = j - h * head_dim
                if is_bfloat16:
                    k_pool[cell, h, d] = narrow_bfloat16(k[t, h, d])
                    v_pool[cell, h, d] = narrow_bfloat16(v[t, h, d])
                else:  # the cast rounds to nearest even, like astype
                    k_pool[cell, h, d] = k[t, h, d]
                    v_pool[cell, h, d] = v[t, h, d]

    return scatter_kv


scatter_kv = kernel(SCATTER_KV_SIGNATURES, name="scatter_kv")(make_scatter(False))
scatter_kv_bf16 = kernel(scatter_signatures(BFLOAT16_STORAGE), name="scatter_kv_bf16")(
    make_scatter(True)
)


@kernel(PREPARE_TOKENS_SIGNATURES)
def prepare_tokens(step, cell_pos, cell_owners, seq_cells, seq_len):
    """Each placed token t < width: its position and owner bit into its cell of the mirror,
    its cell into seq_cells[s, p], and seq_len[s] up to p + 1."""
    # step: [4, columns] int32  cell_pos: [capacity] int32  cell_owners: [capacity, n_words]
    # uint64  seq_cells: [max_seqs, max_seq_len] int32  seq_len: [max_seqs] int32
    # a step's tokens have distinct cells; tokens of one sequence race on its length: atomic max
    width = min(step[SCALARS, WIDTH], np.int32(step.shape[1]))
    for t in range(cuda.grid(1), width, cuda.gridsize(1)):
        cell = step[CELLS, t]
        seq = step[SEQ_IDS, t]
        if cell >= 0 and seq >= 0:
            p = step[POSITIONS, t]
            cell_pos[cell] = p
            cell_owners[cell, seq >> 6] |= owner_bit(seq)
            seq_cells[seq, p] = cell
            cuda.atomic.max(seq_len, seq, p + 1)


def launch_scatter_kv(k, v, k_pool, v_pool, step, width: int, stream=0) -> None:
    """Writes the step's K and V rows into `pool[cells[t]]` for t < width, skipping cells -1.

    k, v           : device array, shape [>= width, n_kv_heads, head_dim], float32 or float16
                     (both the same)
    k_pool, v_pool : device array, shape [rows, n_kv_heads, head_dim], float32, float16 or
                     uint16 (bfloat16 bit patterns); values are rounded to this storage dtype
                     (to nearest even)
    step           : device array, the step buffer [4, columns] int32 (`step_buffer`): cells
                     each in [-1, rows), its width = `width`
    width          : the step's width (the grid's size; the kernel reads the buffer's)
    """
    check_extent("width", width, step.shape[1], len(k), len(v))
    n_items = width * k_pool.shape[1] * k_pool.shape[2]
    if n_items == 0:
        return
    grid, threads = launch_dims(n_items)
    scatter = scatter_kv_bf16 if kind(k_pool.dtype) == "bfloat16" else scatter_kv
    launch(scatter, grid, threads, stream, k, v, k_pool, v_pool, step)


def launch_prepare_tokens(
    step, width: int, cell_pos, cell_owners, seq_cells, seq_len, stream=0
) -> None:
    """Records the step's placed tokens in the table mirror (position and owner bit per cell)
    and in the position -> cell table (seq_cells, seq_len).

    step        : device array, the step buffer [4, columns] int32, its width = `width`
    cell_pos    : device array, shape [capacity], int32
    cell_owners : device array, shape [capacity, n_words], uint64
    seq_cells   : device array, shape [max_seqs, max_seq_len], int32
    seq_len     : device array, shape [max_seqs], int32
    """
    check_extent("width", width, step.shape[1])
    if width == 0:
        return
    grid, threads = launch_dims(width)
    launch(prepare_tokens, grid, threads, stream, step, cell_pos, cell_owners, seq_cells, seq_len)
