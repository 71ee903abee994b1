"""The decode-shaped attention kernels: one token x one head chunk x one split per block.

Grid (n_splits, n_kv_heads x head chunks, width): each block takes one token, up to
DECODE_ROWS query heads of one KV group, and one of n_splits near-equal parts of the
token's sweep range, in tiles of DECODE_TILE cells; it writes a partial (acc, m, l) that
`merge.merge_splits` combines. n_splits is fixed by the grid (by the config and the width);
each token uses as many of them as its own range fills (`tiles.split_range`), and a block
whose split is empty only marks it empty (l = EMPTY) and moves on. One body, made once per view
(`views`): masked and gathered differ only in which cells a token sees. Shared memory
~42 KB: K/V tiles 32 x 129 / 32 x 128 float32, q and acc 8 x 128.
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels.attention import tiles, views
from numbakv.cache.kernels.attention.tiles import (
    DECODE_ROWS,
    DECODE_TILE,
    EMPTY,
    HEAD_DIM_MAX,
    HI,
    K_STRIDE,
    KEY,
    LO,
    PARTIALS,
    TOKEN_ROWS,
    T,
)
from numbakv.cache.kernels.placement import KV_SCALES
from numbakv.cache.kernels.step_buffer import SCALARS, STEP, WIDTH


def signatures(view: str, pools: list[tuple[str, str]], q: str, out: str) -> list[str]:
    """q, k_pool, v_pool, kv_scales, step, view, scale, n_splits, part_acc, part_m, part_l;
    per (K pool dtype, V pool dtype); `out` unused (the merge writes it)."""
    return [
        f"void({q}, {ks}[:, :, ::1], {vs}[:, :, ::1], {KV_SCALES}, {STEP}, {view}, float32, "
        f"int32, {PARTIALS})"
        for ks, vs in pools
    ]


def make_decode(token, flags, load_tile, start_rows, write_rows):
    """The decode kernel over the view that `token` and `flags` read (see `views`), for the
    storage kind `load_tile` reads (`tiles.make_load_tile`) and the q `start_rows` reads
    (`tiles.make_start_rows`); it writes partials, not out (`write_rows` unused)."""

    def attend_decode(
        q, k_pool, v_pool, kv_scales, step, view, scale, n_splits, part_acc, part_m, part_l
    ):
        """Partial attention of one token over one split of the cells it sees, per block."""
        # q: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
        # part_acc: [>= width, n_heads, >= n_splits, head_dim]
        # part_m, part_l: [>= width, n_heads, >= n_splits]
        q_s = cuda.shared.array((DECODE_ROWS, K_STRIDE), np.float32)
        acc_s = cuda.shared.array((DECODE_ROWS, HEAD_DIM_MAX), np.float32)
        k_s = cuda.shared.array((DECODE_TILE, K_STRIDE), np.float32)
        v_s = cuda.shared.array((DECODE_TILE, HEAD_DIM_MAX), np.float32)
        s_s = cuda.shared.array((DECODE_ROWS, DECODE_TILE), np.float32)
        ok_s = cuda.shared.array((1, DECODE_TILE), np.uint8)
        cell_s = cuda.shared.array(DECODE_TILE, np.int32)
        m_s = cuda.shared.array(DECODE_ROWS, np.float32)
        l_s = cuda.shared.array(DECODE_ROWS, np.float32)
        alpha_s = cuda.shared.array(DECODE_ROWS, np.float32)
        tok_s = cuda.shared.array((TOKEN_ROWS, 1), np.int32)
        head_dim = q.shape[2]
        group = q.shape[1] // k_pool.shape[1]
        n_hb = min(group, DECODE_ROWS)
        n_head_blocks = tiles.n_head_blocks(q.shape[1], k_pool.shape[1], n_hb)
        width = min(step[SCALARS, WIDTH], np.int32(q.shape[0]), np.int32(part_acc.shape[0]))
        for t in range(cuda.blockIdx.z, width, cuda.gridDim.z):
            key, lo, hi = token(view, step, t)
            for hy in range(cuda.blockIdx.y, n_head_blocks, cuda.gridDim.y):
                kv_head, h0, n_rows = tiles.heads_of(hy, group, n_hb)
                for split in range(cuda.blockIdx.x, n_splits, cuda.gridDim.x):
                    start, end = tiles.split_range(lo, hi, split, n_splits)
                    if start >= end:  # an empty split (the grid's splits are fixed): only
                        # its l = EMPTY, which merge reads first (acc, m never read then)
                        for r in range(cuda.threadIdx.x, n_rows, cuda.blockDim.x):
                            part_l[t, h0 + r, split] = EMPTY
                    else:
                        if cuda.threadIdx.x == 0:
                            tok_s[T, 0] = t
                            tok_s[KEY, 0] = key
                            tok_s[LO, 0] = start
                            tok_s[HI, 0] = end
                        cuda.syncthreads()
                        # one token: every row is a head, so n_rows heads per token
                        start_rows(q_s, acc_s, m_s, l_s, q, tok_s, n_rows, n_rows, h0, head_dim)
                        for j0 in range(start, end, DECODE_TILE):
                            if flags(view, ok_s, cell_s, tok_s, 1, key, j0, k_pool.shape[0]):
                                load_tile(
                                    k_s, v_s, cell_s, k_pool, v_pool, kv_scales, kv_head, head_dim
                                )
                                tiles.tile_update(
                                    q_s, acc_s, k_s, v_s, s_s, ok_s, m_s, l_s, alpha_s,
                                    n_rows, n_rows, head_dim, scale,
                                )  # fmt: skip
                        tiles.write_partial(
                            part_acc, part_m, part_l, acc_s, m_s, l_s, t, split, n_rows, h0,
                            head_dim,
                        )  # fmt: skip

    return attend_decode


# (mode, K kind, V kind, q kind, out kind) -> kernel, e.g. KERNELS("gathered", "q8_0", "q8_0")
KERNELS = views.build(make_decode, signatures, "decode", ("bfloat16", "float"))
