"""The one matmul scheme of the device model: a tile of activation rows in shared memory.

A block takes TILE rows of the activations `x` [rows, K] float32 at a time (grid-stride over
row tiles on y) and strides over the output items on x, one thread per item (an output
column, or a pair of them). For each CHUNK of K the tile's slice is staged in shared memory
`xs` [TILE, CHUNK] float32; each thread reads its column's weights of the chunk once per
tile into a local [CHUNK] array (consecutive threads read consecutive columns, so the
reads coalesce) and adds their dot products with the tile's rows to its [TILE] float32
accumulators (`column_dot`, `pair_dot`: summing over K in order, in float32). When K fits
in one chunk the tile is staged once per row tile, not once per group of items.
`make_tile_loop` is that loop, made once per kernel over the kernel's device functions.

A tile's rows come from a source: `NORMED` fuses an RMSNorm into the load (`tile_scales`
computes each tile row's 1 / sqrt(mean(x^2) + eps) with a shared-memory reduction, and
`stage_normed` stages x * scale * weight, the float32 operations of
`numbakv.serve.model.rms_norm` in its order) and gathers: tile row r reads row
`token_map[1 + r0 + r]` of x, where token_map[0] is the row count (the live tokens
[0, live) for the layers, the tokens of `logits_at` for the LM head). `AS_IS` stages rows
r0 .. r0 + n - 1 of x unchanged.

Every loop that a barrier sits in has bounds uniform over the block. Loops over a tile's
rows stop at its row count n: the simulator runs each iteration as Python, so a decode
step of one row costs one row's work. The device functions are called once per chunk or
per item, never per element: each call costs the simulator a swap of its module's
globals. The geometry is `tile_grid`: one block of SIM_THREADS in the simulator (whose
barriers cost ~0.1 ms per simulated thread, and whose threads share one interpreter),
GPU-sized on a GPU.
"""

import math
from collections.abc import Callable

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
def tile_scales(src, token_map, scale_s, src_s, part_s, r0, n):
    """The normed tile's rows and their RMSNorm scales, for tile rows r < n (two barriers).

    src       : (x, norm_w, eps): x [>= 1, K] float32, norm_w [K] float32, eps float32
    token_map : [>= 1 + r0 + n] int32
    scale_s   : [TILE] float32 shared, out: 1 / sqrt(mean(x[row]^2) + eps)
    src_s     : [TILE] int32 shared, out: row = token_map[1 + r0 + r], clamped into x
    part_s    : [TILE, THREADS] float32 shared scratch of the partial sums
    """
    x, _, eps = src
    tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
    k_len, last = x.shape[1], x.shape[0] - 1
    for r in range(n):
        row = min(max(token_map[1 + r0 + r], 0), last)
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
        src_s[r] = min(max(token_map[1 + r0 + r], 0), last)
        scale_s[r] = np.float32(1) / math.sqrt(s / np.float32(k_len) + eps)
    cuda.syncthreads()


@device_function
def stage_normed(xs, src, src_s, scale_s, r0, n, k0, kn, staged):
    """Stages chunk k0 of the normed tile, xs[r, kk] = x[src_s[r], k0 + kk] * scale_s[r] *
    norm_w[k0 + kk] for r < n, kk < kn, between two barriers; skipped when the tile is
    `staged` already and K is one chunk. Returns True (the tile is staged)."""
    x, norm_w, _ = src
    if not staged or x.shape[1] > CHUNK:
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, n * kn, cuda.blockDim.x):
            r = i // kn
            kk = i - r * kn
            xs[r, kk] = x[src_s[r], k0 + kk] * scale_s[r] * norm_w[k0 + kk]
        cuda.syncthreads()
    return True


@device_function
def no_scales(src, token_map, scale_s, src_s, part_s, r0, n):
    """`tile_scales` of a tile staged as it is: nothing to compute."""


@device_function
def stage_rows(xs, src, src_s, scale_s, r0, n, k0, kn, staged):
    """`stage_normed` of rows r0 .. r0 + n - 1 of x as they are, src = (x,):
    xs[r, kk] = x[r0 + r, k0 + kk]."""
    (x,) = src
    if not staged or x.shape[1] > CHUNK:
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, n * kn, cuda.blockDim.x):
            r = i // kn
            kk = i - r * kn
            xs[r, kk] = x[r0 + r, k0 + kk]
        cuda.syncthreads()
    return True


NORMED = (tile_scales, stage_normed)  # src = (x, norm_w, eps): rms_norm(x[token_map])
AS_IS = (no_scales, stage_rows)  # src = (x,): the rows of x unchanged


@device_function
def column_dot(acc_a, acc_b, w_a, w_b, xs, weights, item, k0, kn, n):
    """Item `item` is column `item` of w, weights = (w,), w [K, n_items] float32: chunk k0
    of the column into w_a, w_a[kk] = w[k0 + kk, item] (consecutive threads read
    consecutive columns: coalesced), then acc_a[r] += sum over kk < kn of xs[r, kk] *
    w_a[kk] for r < n in order of kk, the sums starting at 0 with chunk 0 (acc_b, w_b
    unused)."""
    (w,) = weights
    for kk in range(kn):
        w_a[kk] = w[k0 + kk, item]
    for r in range(n):
        s = acc_a[r] if k0 > 0 else np.float32(0)
        for kk in range(kn):
            s += xs[r, kk] * w_a[kk]
        acc_a[r] = s


@device_function
def pair_dot(acc_a, acc_b, w_a, w_b, xs, weights, item, k0, kn, n):
    """Item `item` is two columns, weights = (wa, wb, group, gap): column col = item +
    (item // group) * gap of wa into acc_a and column col + gap of wb into acc_b, each
    `column_dot`, sharing the reads of the tile. The rotary pairs of heads of width 2 half
    are (w, w, half, half); column item of two matrices is (wa, wb, n_items, 0)."""
    wa, wb, group, gap = weights
    col = item + (item // group) * gap
    for kk in range(kn):
        w_a[kk] = wa[k0 + kk, col]
        w_b[kk] = wb[k0 + kk, col + gap]
    for r in range(n):
        s_a = acc_a[r] if k0 > 0 else np.float32(0)
        s_b = acc_b[r] if k0 > 0 else np.float32(0)
        for kk in range(kn):
            value = xs[r, kk]
            s_a += value * w_a[kk]
            s_b += value * w_b[kk]
        acc_a[r], acc_b[r] = s_a, s_b


def make_tile_loop(source: tuple[Callable, Callable], dot: Callable, store: Callable) -> Callable:
    """The tile loop of one kernel, a device function

        tile_loop(src, token_map, weights, out, n_rows, n_items)

    over rows [0, n_rows) of the source and output items [0, n_items), made of the
    kernel's device functions:

        source = (scales, stage)  `NORMED` or `AS_IS`, reading the tuple `src`:
            scales(src, token_map, scale_s, src_s, part_s, r0, n)
                                  per row tile, before its chunks (barriers: every thread)
            stage(xs, src, src_s, scale_s, r0, n, k0, kn, staged) -> True
                                  stages chunk k0 of the tile in xs (barriers: every thread)
        dot(acc_a, acc_b, w_a, w_b, xs, weights, item, k0, kn, n)
                                  adds chunk k0's products of item's weight column(s),
                                  read from the tuple `weights`, to acc_a (and acc_b):
                                  `column_dot` or `pair_dot`
        store(out, acc_a, acc_b, item, r0, n)
                                  writes item's outputs of tile rows r0 .. r0 + n - 1 into
                                  the tuple `out`

    acc_a, acc_b: [TILE] float32 accumulators, which `dot` starts with chunk 0; w_a, w_b:
    [CHUNK] float32 scratch for the chunk's weights; xs: [TILE, CHUNK] float32 shared.
    """
    scales, stage = source

    def tile_loop(src, token_map, weights, out, n_rows, n_items):
        xs = cuda.shared.array((TILE, CHUNK), np.float32)
        part_s = cuda.shared.array((TILE, THREADS), np.float32)
        scale_s = cuda.shared.array(TILE, np.float32)
        src_s = cuda.shared.array(TILE, np.int32)
        acc_a = cuda.local.array(TILE, np.float32)
        acc_b = cuda.local.array(TILE, np.float32)
        w_a = cuda.local.array(CHUNK, np.float32)
        w_b = cuda.local.array(CHUNK, np.float32)
        k_len = src[0].shape[1]
        for r0 in range(cuda.blockIdx.y * TILE, n_rows, cuda.gridDim.y * TILE):
            n = min(TILE, n_rows - r0)
            scales(src, token_map, scale_s, src_s, part_s, r0, n)
            staged = False
            for c0 in range(cuda.blockIdx.x * THREADS, n_items, cuda.gridDim.x * THREADS):
                item = c0 + cuda.threadIdx.x
                for k0 in range(0, k_len, CHUNK):
                    kn = min(CHUNK, k_len - k0)
                    staged = stage(xs, src, src_s, scale_s, r0, n, k0, kn, staged)
                    if item < n_items:
                        dot(acc_a, acc_b, w_a, w_b, xs, weights, item, k0, kn, n)
                if item < n_items:
                    store(out, acc_a, acc_b, item, r0, n)

    return device_function(tile_loop)
