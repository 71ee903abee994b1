"""The device model's kernels: the embedding gather and the four tile kernels of a layer.

Everything that changes from step to step is read from device buffers, never from launch
arguments, so a recorded launch serves every later step of its width
(`docs/contract.md §8.2`):

    inputs[TOKENS, t]       token t of the step, t < width
    inputs[LOGITS_AT, 0]    the number n of tokens whose logits are asked for;
                            inputs[LOGITS_AT, 1 + i] the i-th of them (`logits_at`), i < n
    inputs[LIVE, 0]         the tokens the layers compute, [0, live): the step's tokens and
                            every token of logits_at; inputs[LIVE, 1 + t] = t
    step[POSITIONS, t]      token t's position (the cache's step buffer; -1 on padding: 0)

`inputs` is [3, max_width + 1] int32. The tile kernels (`tiles`) take `token_map`, a
[>= 1 + n] int32 map whose token_map[0] = n: inputs[LIVE] for the layers (tokens past
`live` are padding no one asked for, whose K/V the cache never stores: they are skipped)
or inputs[LOGITS_AT] for the LM head. Each is `tiles.make_tile_loop` over its own device
functions: a source (`tiles.NORMED` or `tiles.AS_IS`), the weight columns of an item
(`tiles.column_dot` or `tiles.pair_dot`) and the writes of its outputs (`*_store`).
Scalar arguments are constants of the model (eps). Every index read from a buffer is
clamped into its array: a GPU checks no bounds. Per layer: `qkv_rotary`, the cache's write
and attend, `residual_matmul` (wo), `swiglu`, `residual_matmul` (w_down); per forward
also `embed` first and `lm_head` last. A tensor-parallel shard's layer runs `matmul` and
`add_rows` instead of each `residual_matmul`, its partial sums added up over the ranks
between them.
"""

import math

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import device_function, kernel
from numbakv.cache.kernels.step_buffer import POSITIONS, STEP
from numbakv.device_model.tiles import AS_IS, NORMED, column_dot, make_tile_loop, pair_dot

TOKENS, LOGITS_AT, LIVE = 0, 1, 2  # rows of the inputs buffer
INPUTS = "int32[:, ::1]"
TOKEN_MAP = "int32[::1]"
F1, F2, F3 = "float32[::1]", "float32[:, ::1]", "float32[:, :, ::1]"


@kernel([f"void({INPUTS}, {F2}, {F2})"])
def embed(inputs, table, x):
    """x[t] = table[inputs[TOKENS, t]] for t < min(inputs[LIVE, 0], len(x)).

    inputs: [3, max_width + 1] int32; table: [vocab_size, d_model] float32; x: [width,
    d_model] float32 (a token outside the table is clamped into it)."""
    d_model, last = x.shape[1], table.shape[0] - 1
    n_tokens = min(inputs[LIVE, 0], x.shape[0])
    for i in range(cuda.grid(1), n_tokens * d_model, cuda.gridsize(1)):
        t = i // d_model
        j = i - t * d_model
        x[t, j] = table[min(max(inputs[TOKENS, t], 0), last), j]


@device_function
def qkv_store(out, acc_a, acc_b, item, r0, n):
    """The rotary pair of item (head g, i) of tokens r0 .. r0 + n - 1, out = (rot, step, q,
    k, v): q and k heads rotated at the tokens' positions as `numbakv.serve.model.rotate`,
    v heads as they are."""
    rot, step, q, k, v = out
    n_q, n_kv, half, last_pos = q.shape[1], k.shape[1], q.shape[2] // 2, rot.shape[1] - 1
    g = item // half
    i = item - g * half
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


@device_function
def add_store(out, acc_a, acc_b, item, r0, n):
    """x[r0 + r, item] += acc_a[r] for r < n, out = (x,)."""
    (x,) = out
    for r in range(n):
        x[r0 + r, item] = x[r0 + r, item] + acc_a[r]


@device_function
def swiglu_store(out, acc_a, acc_b, item, r0, n):
    """h[r0 + r, item] = silu(acc_a[r]) * acc_b[r] for r < n, out = (h,)."""
    (h,) = out
    for r in range(n):
        g = acc_a[r]
        h[r0 + r, item] = g / (np.float32(1) + math.exp(-g)) * acc_b[r]


@device_function
def put_store(out, acc_a, acc_b, item, r0, n):
    """y[r0 + r, item] = acc_a[r] for r < n, out = (y,)."""
    (y,) = out
    for r in range(n):
        y[r0 + r, item] = acc_a[r]


qkv_loop = make_tile_loop(NORMED, pair_dot, qkv_store)
residual_loop = make_tile_loop(AS_IS, column_dot, add_store)
swiglu_loop = make_tile_loop(NORMED, pair_dot, swiglu_store)
head_loop = make_tile_loop(NORMED, column_dot, put_store)
product_loop = make_tile_loop(AS_IS, column_dot, put_store)


@kernel([f"void({F2}, {TOKEN_MAP}, {F1}, float32, {F2}, {F3}, {STEP}, {F3}, {F3}, {F3})"])
def qkv_rotary(x, token_map, norm_w, eps, w, rot, step, q, k, v):
    """q, k, v = heads(rms_norm(x) @ w), q and k rotated at the tokens' positions.

    x         : [width, d_model] float32
    token_map : inputs[LIVE]: tokens [0, token_map[0]) are made
    norm_w    : [d_model] float32; eps: float32
    w         : [d_model, (n_heads + 2 n_kv_heads) head_dim] float32, wq | wk | wv
    rot       : [2, max_seq_len, head_dim / 2] float32, cos then sin of each position's
                angles
    step      : the cache's step buffer [4, columns] int32 (positions)
    q         : [width, n_heads, head_dim] float32; k, v: [width, n_kv_heads, head_dim]
                float32

    One item per (head, i < head_dim / 2) of the concatenated heads: columns i and
    i + head_dim / 2 of the head, the rotary pair, rotated as `numbakv.serve.model.rotate`.
    """
    half = q.shape[2] // 2
    n_items = (q.shape[1] + 2 * k.shape[1]) * half
    n_tokens = min(token_map[0], q.shape[0], k.shape[0], v.shape[0])
    pairs = (w, w, half, half)  # head g's columns g head_dim + i and g head_dim + i + half
    qkv_loop((x, norm_w, eps), token_map, pairs, (rot, step, q, k, v), n_tokens, n_items)


@kernel([f"void({F2}, {TOKEN_MAP}, {F2}, {F2})"])
def residual_matmul(a, token_map, w, x):
    """x[t] += a[t] @ w in place for t < token_map[0] (inputs[LIVE]): a [width, K] float32,
    w [K, d_model] float32, x [width, d_model] float32 (each element read and written by
    one thread)."""
    n_tokens = min(token_map[0], a.shape[0], x.shape[0])
    residual_loop((a,), token_map, (w,), (x,), n_tokens, x.shape[1])


@kernel([f"void({F2}, {TOKEN_MAP}, {F2}, {F2})"])
def matmul(a, token_map, w, y):
    """y[t] = a[t] @ w for t < token_map[0] (inputs[LIVE]): a [width, K] float32, w [K,
    d_model] float32, y [width, d_model] float32: a tensor-parallel shard's partial sum,
    which the ranks add up before `add_rows` adds it to the residual."""
    n_tokens = min(token_map[0], a.shape[0], y.shape[0])
    product_loop((a,), token_map, (w,), (y,), n_tokens, y.shape[1])


@kernel([f"void({TOKEN_MAP}, {F2}, {F2})"])
def add_rows(token_map, y, x):
    """x[t] += y[t] for t < token_map[0] (inputs[LIVE]): y, x [width, d_model] float32."""
    n_tokens, d_model = min(token_map[0], y.shape[0], x.shape[0]), x.shape[1]
    for i in range(cuda.grid(1), n_tokens * d_model, cuda.gridsize(1)):
        t = i // d_model
        j = i - t * d_model
        x[t, j] = x[t, j] + y[t, j]


@kernel([f"void({F2}, {TOKEN_MAP}, {F1}, float32, {F2}, {F2}, {F2})"])
def swiglu(x, token_map, norm_w, eps, w_gate, w_up, h):
    """h = silu(rms_norm(x) @ w_gate) * (rms_norm(x) @ w_up), silu(g) = g / (1 + exp(-g)).

    x: [width, d_model] float32; token_map: inputs[LIVE]; norm_w: [d_model] float32;
    w_gate, w_up: [d_model, d_ff] float32; h: [width, d_ff] float32."""
    n_tokens, n_items = min(token_map[0], h.shape[0]), h.shape[1]
    pairs = (w_gate, w_up, n_items, 0)  # column j of each
    swiglu_loop((x, norm_w, eps), token_map, pairs, (h,), n_tokens, n_items)


@kernel([f"void({F2}, {TOKEN_MAP}, {F1}, float32, {F2}, {F2})"])
def lm_head(x, token_map, norm_w, eps, w, out):
    """out[i] = rms_norm(x[token_map[1 + i]]) @ w for i < min(token_map[0], len(out)).

    x: [width, d_model] float32; token_map: inputs[LOGITS_AT], the tokens of logits_at
    (clamped into x); norm_w: [d_model] float32; w: [d_model, vocab_size] float32; out:
    [max_width, vocab_size] float32 (rows past the count untouched)."""
    n_logits = min(token_map[0], out.shape[0])
    head_loop((x, norm_w, eps), token_map, (w,), (out,), n_logits, out.shape[1])
