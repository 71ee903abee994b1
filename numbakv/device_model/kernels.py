"""The device model's kernels: the embedding gather and the four tile kernels of a layer.

Everything that changes from step to step is read from device buffers, never from launch
arguments, so a recorded launch serves every later step of its width:

    inputs[TOKENS, t]      token t of the step, t < width
    inputs[ROWS, 0]        the number of requested rows n; inputs[ROWS, 1 + i] row i, i < n
    inputs[LIVE, 0]        the rows the layers compute, [0, live): the step's tokens and every
                           requested row; inputs[LIVE, 1 + t] = t
    step[POSITIONS, t]     token t's position (the cache's step buffer; -1 on padding: 0)

`inputs` is [3, max_width + 1] int32. The tile kernels (`tiles`) take `rows`, a [>= 1 + n]
int32 map whose rows[0] = n: inputs[LIVE] for the layers (rows past `live` are padding no
one asked for, whose K/V the cache never stores: they are skipped) or inputs[ROWS] for the
LM head. Scalar arguments are constants of the model (eps). Every index read from a buffer
is clamped into its array: a GPU checks no bounds. Per layer: `qkv_rotary`, the cache's
write and attend, `residual_matmul` (wo), `swiglu`, `residual_matmul` (w_down); per
forward also `embed` first and `lm_head` last.
"""

import math

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel
from numbakv.cache.kernels.step_buffer import POSITIONS, STEP
from numbakv.device_model.tiles import (
    CHUNK,
    THREADS,
    TILE,
    clear,
    dot_rows,
    dot_rows2,
    load_column,
    stage_normed,
    stage_rows,
    tile_scales,
)

TOKENS, ROWS, LIVE = 0, 1, 2  # rows of the inputs buffer
INPUTS = "int32[:, ::1]"
ROW_MAP = "int32[::1]"
F1, F2, F3 = "float32[::1]", "float32[:, ::1]", "float32[:, :, ::1]"


@kernel([f"void({INPUTS}, {F2}, {F2})"])
def embed(inputs, table, x):
    """x[t] = table[inputs[TOKENS, t]] for t < min(inputs[LIVE, 0], len(x)).

    inputs: [3, max_width + 1] int32; table: [vocab_size, d_model] float32; x: [width,
    d_model] float32 (a token outside the table is clamped into it)."""
    d_model, last = x.shape[1], table.shape[0] - 1
    n_rows = min(inputs[LIVE, 0], x.shape[0])
    for i in range(cuda.grid(1), n_rows * d_model, cuda.gridsize(1)):
        t = i // d_model
        j = i - t * d_model
        x[t, j] = table[min(max(inputs[TOKENS, t], 0), last), j]


@kernel([f"void({F2}, {ROW_MAP}, {F1}, float32, {F2}, {F3}, {STEP}, {F3}, {F3}, {F3})"])
def qkv_rotary(x, rows, norm_w, eps, w, rot, step, q, k, v):
    """q, k, v = heads(rms_norm(x) @ w), q and k rotated at the tokens' positions.

    x      : [width, d_model] float32; rows: inputs[LIVE], rows [0, rows[0]) are made
    norm_w : [d_model] float32; eps: float32
    w      : [d_model, (n_heads + 2 n_kv_heads) head_dim] float32, wq | wk | wv
    rot    : [2, max_seq_len, head_dim / 2] float32, cos then sin of each position's angles
    step   : the cache's step buffer [4, columns] int32 (positions)
    q      : [width, n_heads, head_dim] float32; k, v: [width, n_kv_heads, head_dim] float32

    One item per (head, i < head_dim / 2) of the concatenated heads: columns i and
    i + head_dim / 2 of the head, the rotary pair, rotated as `numbakv.serve.model.rotate`.
    """
    xs = cuda.shared.array((TILE, CHUNK), np.float32)
    part_s = cuda.shared.array((TILE, THREADS), np.float32)
    scale_s = cuda.shared.array(TILE, np.float32)
    src_s = cuda.shared.array(TILE, np.int32)
    acc_a = cuda.local.array(TILE, np.float32)
    acc_b = cuda.local.array(TILE, np.float32)
    w_a = cuda.local.array(CHUNK, np.float32)
    w_b = cuda.local.array(CHUNK, np.float32)
    n_q, n_kv, head_dim = q.shape[1], k.shape[1], q.shape[2]
    half = head_dim // 2
    n_items, k_len, last_pos = (n_q + 2 * n_kv) * half, x.shape[1], rot.shape[1] - 1
    n_rows = min(rows[0], q.shape[0], k.shape[0], v.shape[0])
    for r0 in range(cuda.blockIdx.y * TILE, n_rows, cuda.gridDim.y * TILE):
        n = min(TILE, n_rows - r0)
        tile_scales(scale_s, src_s, part_s, x, rows, r0, n, eps)
        staged = False
        for c0 in range(cuda.blockIdx.x * THREADS, n_items, cuda.gridDim.x * THREADS):
            item = c0 + cuda.threadIdx.x
            g = item // half
            i = item - g * half
            col = g * head_dim + i
            clear(acc_a, n)
            clear(acc_b, n)
            for k0 in range(0, k_len, CHUNK):
                kn = min(CHUNK, k_len - k0)
                staged = stage_normed(xs, x, src_s, scale_s, norm_w, n, k0, kn, staged)
                if item < n_items:
                    load_column(w_a, w, col, k0, kn)
                    load_column(w_b, w, col + half, k0, kn)
                    dot_rows2(acc_a, acc_b, xs, w_a, w_b, n, kn)
            if item < n_items:
                for r in range(n):
                    t = r0 + r
                    a, b = acc_a[r], acc_b[r]
                    if g < n_q + n_kv:
                        p = min(max(step[POSITIONS, t], 0), last_pos)
                        cos, sin = rot[0, p, i], rot[1, p, i]
                        a, b = a * cos - b * sin, b * cos + a * sin
                    if g < n_q:
                        q[t, g, i], q[t, g, i + half] = a, b
                    elif g < n_q + n_kv:
                        k[t, g - n_q, i], k[t, g - n_q, i + half] = a, b
                    else:
                        v[t, g - n_q - n_kv, i], v[t, g - n_q - n_kv, i + half] = a, b


@kernel([f"void({F2}, {ROW_MAP}, {F2}, {F2})"])
def residual_matmul(a, rows, w, x):
    """x[t] += a[t] @ w in place for t < rows[0] (inputs[LIVE]): a [width, K] float32, w
    [K, d_model] float32, x [width, d_model] float32 (each element read and written by one
    thread)."""
    xs = cuda.shared.array((TILE, CHUNK), np.float32)
    acc = cuda.local.array(TILE, np.float32)
    w_col = cuda.local.array(CHUNK, np.float32)
    n_items, k_len, n_rows = x.shape[1], a.shape[1], min(rows[0], a.shape[0], x.shape[0])
    for r0 in range(cuda.blockIdx.y * TILE, n_rows, cuda.gridDim.y * TILE):
        n = min(TILE, n_rows - r0)
        staged = False
        for c0 in range(cuda.blockIdx.x * THREADS, n_items, cuda.gridDim.x * THREADS):
            col = c0 + cuda.threadIdx.x
            clear(acc, n)
            for k0 in range(0, k_len, CHUNK):
                kn = min(CHUNK, k_len - k0)
                staged = stage_rows(xs, a, r0, n, k0, kn, staged)
                if col < n_items:
                    load_column(w_col, w, col, k0, kn)
                    dot_rows(acc, xs, w_col, n, kn)
            if col < n_items:
                for r in range(n):
                    x[r0 + r, col] = x[r0 + r, col] + acc[r]


@kernel([f"void({F2}, {ROW_MAP}, {F1}, float32, {F2}, {F2}, {F2})"])
def swiglu(x, rows, norm_w, eps, w_gate, w_up, h):
    """h = silu(rms_norm(x) @ w_gate) * (rms_norm(x) @ w_up), silu(g) = g / (1 + exp(-g)).

    x: [width, d_model] float32; rows: inputs[LIVE]; norm_w: [d_model] float32;
    w_gate, w_up: [d_model, d_ff] float32; h: [width, d_ff] float32."""
    xs = cuda.shared.array((TILE, CHUNK), np.float32)
    part_s = cuda.shared.array((TILE, THREADS), np.float32)
    scale_s = cuda.shared.array(TILE, np.float32)
    src_s = cuda.shared.array(TILE, np.int32)
    acc_g = cuda.local.array(TILE, np.float32)
    acc_u = cuda.local.array(TILE, np.float32)
    w_g = cuda.local.array(CHUNK, np.float32)
    w_u = cuda.local.array(CHUNK, np.float32)
    n_items, k_len, n_rows = h.shape[1], x.shape[1], min(rows[0], h.shape[0])
    for r0 in range(cuda.blockIdx.y * TILE, n_rows, cuda.gridDim.y * TILE):
        n = min(TILE, n_rows - r0)
        tile_scales(scale_s, src_s, part_s, x, rows, r0, n, eps)
        staged = False
        for c0 in range(cuda.blockIdx.x * THREADS, n_items, cuda.gridDim.x * THREADS):
            col = c0 + cuda.threadIdx.x
            clear(acc_g, n)
            clear(acc_u, n)
            for k0 in range(0, k_len, CHUNK):
                kn = min(CHUNK, k_len - k0)
                staged = stage_normed(xs, x, src_s, scale_s, norm_w, n, k0, kn, staged)
                if col < n_items:
                    load_column(w_g, w_gate, col, k0, kn)
                    load_column(w_u, w_up, col, k0, kn)
                    dot_rows2(acc_g, acc_u, xs, w_g, w_u, n, kn)
            if col < n_items:
                for r in range(n):
                    g = acc_g[r]
                    h[r0 + r, col] = g / (np.float32(1) + math.exp(-g)) * acc_u[r]


@kernel([f"void({F2}, {ROW_MAP}, {F1}, float32, {F2}, {F2})"])
def lm_head(x, rows, norm_w, eps, w, out):
    """out[i] = rms_norm(x[rows[1 + i]]) @ w for i < min(rows[0], len(out)).

    x: [width, d_model] float32; rows: inputs[ROWS], the requested rows (clamped into x);
    norm_w: [d_model] float32; w: [d_model, vocab_size] float32; out: [max_width,
    vocab_size] float32 (rows past the count untouched)."""
    xs = cuda.shared.array((TILE, CHUNK), np.float32)
    part_s = cuda.shared.array((TILE, THREADS), np.float32)
    scale_s = cuda.shared.array(TILE, np.float32)
    src_s = cuda.shared.array(TILE, np.int32)
    acc = cuda.local.array(TILE, np.float32)
    w_col = cuda.local.array(CHUNK, np.float32)
    n_items, k_len, n_rows = out.shape[1], x.shape[1], min(rows[0], out.shape[0])
    for r0 in range(cuda.blockIdx.y * TILE, n_rows, cuda.gridDim.y * TILE):
        n = min(TILE, n_rows - r0)
        tile_scales(scale_s, src_s, part_s, x, rows, r0, n, eps)
        staged = False
        for c0 in range(cuda.blockIdx.x * THREADS, n_items, cuda.gridDim.x * THREADS):
            col = c0 + cuda.threadIdx.x
            clear(acc, n)
            for k0 in range(0, k_len, CHUNK):
                kn = min(CHUNK, k_len - k0)
                staged = stage_normed(xs, x, src_s, scale_s, norm_w, n, k0, kn, staged)
                if col < n_items:
                    load_column(w_col, w, col, k0, kn)
                    dot_rows(acc, xs, w_col, n, kn)
            if col < n_items:
                for r in range(n):
                    out[r0 + r, col] = acc[r]
