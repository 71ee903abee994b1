"""The one matmul scheme of the device model: a tile of activation rows in shared memory.

A block takes TILE rows of the activations `x` [rows, K] float32 at a time (grid-stride over
row tiles on y) and strides over the output items on x, one thread per item (an output
column, or a pair of them). For each CHUNK of K the tile's slice is staged in shared memory
`xs` [TILE, CHUNK] float32; each thread reads its column's weights of the chunk once per
tile into a local [CHUNK] array (`load_column`: consecutive threads read consecutive
columns, so the reads coalesce) and adds their dot products with the tile's rows to its
[TILE] float32 accumulators (`dot_rows`, summing over K in order, in float32). When K fits
in one chunk the tile is staged once per row tile, not once per group of items.

An RMSNorm prologue (`tile_scales`) fuses the norm into the load: it computes each tile
row's 1 / sqrt(mean(x^2) + eps) with a shared-memory reduction, and `load_normed` stages
x * scale * weight, the float32 operations of `numbakv.serve.model.rms_norm` in its order.
Normed tiles also gather: tile row r reads row `rows[1 + r0 + r]` of x, where rows[0] is
the row count (the live rows [0, live) for the layers, the requested rows for the LM head).

Every loop that a barrier sits in has bounds uniform over the block. Loops over a tile's
rows stop at its row count n: the simulator runs each iteration as Python, so a decode
step of one row costs one row's work. The geometry is `tile_grid`: one block of
SIM_THREADS in the simulator (whose barriers cost ~0.1 ms per simulated thread, and whose
threads share one interpreter), GPU-sized on a GPU.
"""

import math

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels import device_function
from numbakv.cache.kernels.launch import BLOCKS_PER_SM, MAX_GRID_YZ, n_sms

TILE = 16  # activation rows per tile (accumulators per thread)
CHUNK = 64  # elements of K staged in shared memory at a time
GPU_THREADS = 128  # threads per block of the tile kernels on a GPU
SIM_THREADS = 4  # ... in the simulator
THREADS = SIM_THREADS if IS_SIMULATOR else GPU_THREADS  # the block every tile kernel runs


def tile_grid(n_rows: int, n_items: int) -> tuple[tuple[int, int], int]:
    """((blocks_x, blocks_y), THREADS) of a tile kernel over `n_rows` rows and `n_items`
    output items (both > 0): one block in the simulator; on a GPU a block row per row tile
    and as many item blocks as fill BLOCKS_PER_SM per multiprocessor."""
    if IS_SIMULATOR:
        return (1, 1), THREADS
    blocks_y = min(-(-n_rows // TILE), MAX_GRID_YZ)
    blocks_x = min(-(-n_items // THREADS), max(1, BLOCKS_PER_SM * n_sms() // blocks_y))
    return (blocks_x, blocks_y), THREADS


@device_function
def tile_scales(scale_s, src_s, part_s, x, rows, r0, n, eps):
    """The tile's rows and their RMSNorm scales, for tile rows r < n (two barriers).

    scale_s : [TILE] float32 shared, out: 1 / sqrt(mean(x[row]^2) + eps)
    src_s   : [TILE] int32 shared, out: row = rows[1 + r0 + r], clamped into x
    part_s  : [TILE, THREADS] float32 shared scratch of the partial sums
    x       : [>= 1, K] float32; rows: [>= 1 + r0 + n] int32; eps: float32
    """
    tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
    k_len, last = x.shape[1], x.shape[0] - 1
    for r in range(n):
        row = min(max(rows[1 + r0 + r], 0), last)
        s = np.float32(0)
        for k in range(tid, k_len, n_threads):
            value = x[row, k]
            s += value * value
        part_s[r, tid] = s
    cuda.syncthreads()
    for r in range(tid, n, n_threads):
        s = np.float32(0)
        for j in range(n_threads):
            s += part_s[r, j]
        src_s[r] = min(max(rows[1 + r0 + r], 0), last)
        scale_s[r] = np.float32(1) / math.sqrt(s / np.float32(k_len) + eps)
    cuda.syncthreads()


@device_function
def stage_normed(xs, x, src_s, scale_s, norm_w, n, k0, kn, staged):
    """Stages chunk k0 of the normed tile, xs[r, kk] = x[src_s[r], k0 + kk] * scale_s[r] *
    norm_w[k0 + kk] for r < n, kk < kn, between two barriers; skipped when the tile is
    `staged` already and K is one chunk. Returns True (the tile is staged)."""
    if not staged or x.shape[1] > CHUNK:
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, n * kn, cuda.blockDim.x):
            r = i // kn
            kk = i - r * kn
            xs[r, kk] = x[src_s[r], k0 + kk] * scale_s[r] * norm_w[k0 + kk]
        cuda.syncthreads()
    return True


@device_function
def stage_rows(xs, x, r0, n, k0, kn, staged):
    """`stage_normed` of rows r0 .. r0 + n - 1 of x as they are: xs[r, kk] = x[r0 + r,
    k0 + kk]."""
    if not staged or x.shape[1] > CHUNK:
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, n * kn, cuda.blockDim.x):
            r = i // kn
            kk = i - r * kn
            xs[r, kk] = x[r0 + r, k0 + kk]
        cuda.syncthreads()
    return True


@device_function
def clear(acc, n):
    """acc[r] = 0 for r < n."""
    for r in range(n):
        acc[r] = np.float32(0)


@device_function
def load_column(w_col, w, col, k0, kn):
    """w_col[kk] = w[k0 + kk, col] for kk < kn: the thread's weights of this chunk, read
    once per tile (consecutive threads read consecutive columns: coalesced)."""
    for kk in range(kn):
        w_col[kk] = w[k0 + kk, col]


@device_function
def dot_rows(acc, xs, w_col, n, kn):
    """acc[r] += sum over kk < kn of xs[r, kk] * w_col[kk] for r < n, in order of kk."""
    for r in range(n):
        s = acc[r]
        for kk in range(kn):
            s += xs[r, kk] * w_col[kk]
        acc[r] = s


@device_function
def dot_rows2(acc_a, acc_b, xs, w_a, w_b, n, kn):
    """`dot_rows` of two weight columns at once (w_a into acc_a, w_b into acc_b), sharing
    the reads of the tile."""
    for r in range(n):
        s_a, s_b = acc_a[r], acc_b[r]
        for kk in range(kn):
            value = xs[r, kk]
            s_a += value * w_a[kk]
            s_b += value * w_b[kk]
        acc_a[r], acc_b[r] = s_a, s_b
