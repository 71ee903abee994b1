"""Placement (SPEC §5): a step's K/V rows into their cells, and its tokens into the table mirror.

Both kernels read the step buffers (`cells`, `positions`, `seq_ids`: [max_width] int32)
and act on rows t < width whose cell is placed (`cells[t] >= 0`); padded rows
(`cells[t] = -1`) are skipped, and nothing else is read or written.
"""

import numpy as np

from numbakv.cache._cuda import cuda
from numbakv.cache.kernels import kernel, owner_bit
from numbakv.cache.kernels.launch import check_extent, launch_dims
from numbakv.cache.kernels.storage import (
    BFLOAT16_STORAGE,
    FLOAT_STORAGE,
    kind,
    narrow_bfloat16,
)

FLOATS = FLOAT_STORAGE  # the step's K/V dtypes: the float storage dtypes


def scatter_signatures(storage: tuple[str, ...]) -> list[str]:
    """Every (input dtype, storage dtype) pair: k, v, k_pool, v_pool, cells, width."""
    return [
        f"void({x}[:, :, ::1], {x}[:, :, ::1], {s}[:, :, ::1], {s}[:, :, ::1], int32[::1], int32)"
        for x in FLOATS
        for s in storage
    ]


SCATTER_KV_SIGNATURES = scatter_signatures(FLOAT_STORAGE)
# cells, positions, seq_ids, width, cell_pos, cell_owners
PLACE_TOKENS_SIGNATURES = [
    "void(int32[::1], int32[::1], int32[::1], int32, int32[::1], uint64[:, ::1])"
]


def make_scatter(is_bfloat16):
    """The scatter kernel of float pools (the store casts) or of bfloat16 pools (rounded by
    `storage.narrow_bfloat16`): a closure constant, so the compiler keeps one branch."""

    def scatter_kv(k, v, k_pool, v_pool, cells, width):
        """Copies K and V of each token t < width into pool row cells[t], rounded to the
        storage dtype (to nearest even); skips cells[t] < 0."""
        # k, v: [>= width, n_kv_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
        # cells: [max_width] int32; one item per (t, h, d), d fastest, so stores coalesce
        head_dim = k_pool.shape[2]
        row = k_pool.shape[1] * head_dim
        for i in range(cuda.grid(1), width * row, cuda.gridsize(1)):
            t = i // row
            cell = cells[t]
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


@kernel(PLACE_TOKENS_SIGNATURES)
def place_tokens(cells, positions, seq_ids, width, cell_pos, cell_owners):
    """Writes each placed token's position and owner bit into its cell of the table mirror."""
    # cells, positions, seq_ids: [max_width] int32
    # cell_pos: [capacity] int32  cell_owners: [capacity, n_words] uint64
    # a step's tokens have distinct cells, so no two threads touch one cell
    for t in range(cuda.grid(1), width, cuda.gridsize(1)):
        cell = cells[t]
        seq = seq_ids[t]
        if cell >= 0 and seq >= 0:
            cell_pos[cell] = positions[t]
            cell_owners[cell, seq >> 6] |= owner_bit(seq)


def launch_scatter_kv(k, v, k_pool, v_pool, cells, width: int, stream=0) -> None:
    """Writes the step's K and V rows into `pool[cells[t]]` for t < width, skipping cells -1.

    k, v           : device array, shape [>= width, n_kv_heads, head_dim], float32 or float16
                     (both the same)
    k_pool, v_pool : device array, shape [rows, n_kv_heads, head_dim], float32, float16 or
                     uint16 (bfloat16 bit patterns); values are rounded to this storage dtype
                     (to nearest even)
    cells          : device array, shape [max_width], int32, each in [-1, rows)
    width          : rows of the step to place, <= len(cells)
    """
    check_extent("width", width, len(cells), len(k), len(v))
    n_items = width * k_pool.shape[1] * k_pool.shape[2]
    if n_items == 0:
        return
    grid, threads = launch_dims(n_items)
    scatter = scatter_kv_bf16 if kind(k_pool.dtype) == "bfloat16" else scatter_kv
    scatter[grid, threads, stream](k, v, k_pool, v_pool, cells, np.int32(width))


def launch_place_tokens(
    cells, positions, seq_ids, width: int, cell_pos, cell_owners, stream=0
) -> None:
    """Records the step's placed tokens in the table mirror: position and owner bit per cell.

    cells, positions, seq_ids : device array, shape [max_width], int32 (the step buffers)
    width                     : rows of the step, <= max_width
    cell_pos                  : device array, shape [capacity], int32
    cell_owners               : device array, shape [capacity, n_words], uint64
    """
    check_extent("width", width, len(cells), len(positions), len(seq_ids))
    if width == 0:
        return
    grid, threads = launch_dims(width)
    place_tokens[grid, threads, stream](
        cells, positions, seq_ids, np.int32(width), cell_pos, cell_owners
    )
