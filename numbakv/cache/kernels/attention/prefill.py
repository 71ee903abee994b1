"""The prefill-shaped attention kernels: a tile of tokens x heads per block, K/V tiles shared.

Grid (token tiles, n_kv_heads x head chunks): each block takes PREFILL_ROWS query rows
(PREFILL_ROWS // group tokens x group heads, or PREFILL_ROWS heads of one token when
group >= PREFILL_ROWS) and loads every K/V tile of PREFILL_TILE cells once for all of
them. It sweeps one key at a time over the union of its tokens' ranges: the consecutive
tokens of a prefill share their sequence's cells (gathered), and every token of a masked
view sweeps [0, read_len) as one key. One body, made once per view (`views`). Shared
memory ~34 KB.
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import device_function
from numbakv.cache.kernels.attention import tiles, views
from numbakv.cache.kernels.attention.tiles import (
    HEAD_DIM_MAX,
    HI,
    K_STRIDE,
    KEY,
    LO,
    MAX_TOKENS,
    PREFILL_ROWS,
    PREFILL_TILE,
    TOKEN_ROWS,
    T,
)
from numbakv.cache.kernels.placement import KV_SCALES
from numbakv.cache.kernels.step_buffer import SCALARS, STEP, WIDTH


def signatures(view: str, pools: list[tuple[str, str]], q: str, out: str) -> list[str]:
    """q, k_pool, v_pool, kv_scales, step, view, scale, out;
    per (K pool dtype, V pool dtype)."""
    return [
        f"void({q}, {ks}[:, :, ::1], {vs}[:, :, ::1], {KV_SCALES}, {STEP}, {view}, float32, {out})"
        for ks, vs in pools
    ]


@device_function
def next_sweep(tok_s, is_todo_s, sweep_s, n_tok):
    """(key, lo, hi) of the block's next sweep: the key of its first token still to do, over
    the union of the ranges of that key's tokens, which are then done; key -1 when none is
    left. Thread 0 decides, every thread gets the same answer."""
    if cuda.threadIdx.x == 0:
        key, lo, hi = -1, 0, 0
        for k in range(n_tok):
            if is_todo_s[k] != 0 and (key < 0 or tok_s[KEY, k] == key):
                if key < 0:
                    key, lo, hi = tok_s[KEY, k], tok_s[LO, k], tok_s[HI, k]
                lo = min(lo, tok_s[LO, k])
                hi = max(hi, tok_s[HI, k])
                is_todo_s[k] = 0
        sweep_s[0] = key
        sweep_s[1] = lo
        sweep_s[2] = hi
    cuda.syncthreads()
    key, lo, hi = sweep_s[0], sweep_s[1], sweep_s[2]
    cuda.syncthreads()  # all have read the sweep before thread 0 writes the next
    return key, lo, hi


def make_prefill(token, flags, load_tile, start_rows, write_rows):
    """The prefill kernel over the view that `token` and `flags` read (see `views`), for the
    storage kind `load_tile` reads (`tiles.make_load_tile`) and the q and out that
    `start_rows` and `write_rows` read and write (`tiles.make_start_rows`, `make_write_rows`)."""

    def attend_prefill(q, k_pool, v_pool, kv_scales, step, view, scale, out):
        """Attention of a tile of tokens x heads of one KV group over the cells they see."""
        # q, out: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
        q_s = cuda.shared.array((PREFILL_ROWS, K_STRIDE), np.float32)
        acc_s = cuda.shared.array((PREFILL_ROWS, HEAD_DIM_MAX), np.float32)
        k_s = cuda.shared.array((PREFILL_TILE, K_STRIDE), np.float32)
        v_s = cuda.shared.array((PREFILL_TILE, HEAD_DIM_MAX), np.float32)
        s_s = cuda.shared.array((PREFILL_ROWS, PREFILL_TILE), np.float32)
        ok_s = cuda.shared.array((MAX_TOKENS, PREFILL_TILE), np.uint8)
        cell_s = cuda.shared.array(PREFILL_TILE, np.int32)
        m_s = cuda.shared.array(PREFILL_ROWS, np.float32)
        l_s = cuda.shared.array(PREFILL_ROWS, np.float32)
        alpha_s = cuda.shared.array(PREFILL_ROWS, np.float32)
        tok_s = cuda.shared.array((TOKEN_ROWS, MAX_TOKENS), np.int32)
        is_todo_s = cuda.shared.array(MAX_TOKENS, np.uint8)
        sweep_s = cuda.shared.array(3, np.int32)  # key, first and end index of a sweep
        head_dim = q.shape[2]
        group = q.shape[1] // k_pool.shape[1]
        n_hb = min(group, PREFILL_ROWS)
        n_tb = PREFILL_ROWS // n_hb  # tokens per block
        n_head_blocks = tiles.n_head_blocks(q.shape[1], k_pool.shape[1], n_hb)
        width = min(step[SCALARS, WIDTH], np.int32(q.shape[0]), np.int32(out.shape[0]))
        n_token_blocks = (width + n_tb - 1) // n_tb
        for hy in range(cuda.blockIdx.y, n_head_blocks, cuda.gridDim.y):
            kv_head, h0, n_heads_here = tiles.heads_of(hy, group, n_hb)
            for tx in range(cuda.blockIdx.x, n_token_blocks, cuda.gridDim.x):
                t0 = tx * n_tb
                n_tok = min(n_tb, width - t0)
                for k in range(cuda.threadIdx.x, n_tok, cuda.blockDim.x):
                    key, lo, hi = token(view, step, t0 + k)
                    tok_s[T, k] = t0 + k
                    tok_s[KEY, k] = key
                    tok_s[LO, k] = lo
                    tok_s[HI, k] = hi
                    is_todo_s[k] = 1 if lo < hi else 0  # a token that sees nothing gives 0
                cuda.syncthreads()
                n_rows = n_tok * n_heads_here
                start_rows(q_s, acc_s, m_s, l_s, q, tok_s, n_rows, n_heads_here, h0, head_dim)
                key, lo, hi = next_sweep(tok_s, is_todo_s, sweep_s, n_tok)
                while key >= 0:
                    for j0 in range(lo, hi, PREFILL_TILE):
                        if flags(view, ok_s, cell_s, tok_s, n_tok, key, j0, k_pool.shape[0]):
                            load_tile(
                                k_s, v_s, cell_s, k_pool, v_pool, kv_scales, kv_head, head_dim
                            )
                            tiles.tile_update(
                                q_s, acc_s, k_s, v_s, s_s, ok_s, m_s, l_s, alpha_s,
                                n_rows, n_heads_here, head_dim, scale,
                            )  # fmt: skip
                    key, lo, hi = next_sweep(tok_s, is_todo_s, sweep_s, n_tok)
                write_rows(out, acc_s, m_s, l_s, tok_s, n_rows, n_heads_here, h0, head_dim)

    return attend_prefill


# (mode, K kind, V kind, q kind, out kind) -> kernel, e.g. KERNELS("gathered", "q8_0", "q8_0")
KERNELS = views.build(make_prefill, signatures, "prefill", ("bfloat16", "bfloat16"))
