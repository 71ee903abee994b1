"""The prefill kernel's data movement: its queries and K/V tiles into shared memory, its rows
out, and the integer helpers of its indexing (`tiles` has the geometry and the layout).

    stage_q     q_s [PREFILL_ROWS, qk_stride] <- the block's query rows (float32, bfloat16
                patterns widened), zeros past head_dim and past its rows
    stage_kv    k_s, v_s [PREFILL_TILE, stride] <- the tile's K and V rows as float32 by
                `lanes`' 16-byte loads, dequantized (code x scale: exact, the reference's
                value), zeros for the cells no token sees; flags_s[VIS] <- who sees each cell
    write_rows  out[t, h] <- a thread's 4 rows x `Layout.dims` accumulators (0 for a row that
                saw nothing, NaN for one whose max is not finite), float32 or bfloat16
"""

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR
from numbakv.cache.kernels import device_function, quant, storage, wide
from numbakv.cache.kernels.attention.tiles import (
    EMPTY,
    NAN,
    NEG_INF,
    POS_INF,
    PREFILL_ROWS,
    PREFILL_TILE,
    ROW_LANES,
    THREAD_ROWS,
    THREADS,
    VEC,
    VIS,
    ZERO,
    Layout,
    T,
    index,
)


def _quotient_sim(a, b):
    return a // b


@device_function
def _quotient(a, b):
    return np.int32(np.uint32(a) // np.uint32(b))


# a // b of int32 a >= 0 and b > 0, as an int32: numba divides int32 in 64 bits (a call on a
# GPU), where an unsigned 32-bit division is one short instruction sequence
quotient = _quotient_sim if IS_SIMULATOR else _quotient


@device_function
def tile_tokens(words, row):
    """The OR of words[row, :PREFILL_TILE]: the tokens that see some index of a tile."""
    bits = np.uint32(0)
    for jj in range(PREFILL_TILE):
        bits = np.uint32(bits | words[row, jj])
    return bits


def make_stage_q(lay: Layout, q_code: int):
    """`stage_q` of a q of code q_code (`storage.IO_KINDS`)."""
    cols, dim, stride = np.int32(lay.cols), np.int32(lay.head_dim), np.int32(lay.qk_stride)
    lanes = min(THREADS, 32)  # threads along a row (a warp reads consecutive elements)
    n_lanes, row_step = np.int32(lanes), np.int32(THREADS // lanes)

    def stage_q(q_s, q, tok_s, n_rows, n_here, h0, q_head, tid):
        """q_s[r, d] = q[the step row of row r's token, its head, d], 0 for d >= head_dim
        and rows r >= n_rows."""
        # q: [>= width, n_heads, head_dim], q_head its head stride (elements)
        for r in range(quotient(tid, n_lanes), np.int32(PREFILL_ROWS), row_step):
            k = quotient(r, n_here)
            t = tok_s[T, k] if r < n_rows else np.int32(0)
            at = np.int32((h0 + r - k * n_here) * q_head)
            for d in range(tid & np.int32(lanes - 1), cols, n_lanes):
                x = ZERO
                if r < n_rows and d < dim:
                    raw = wide.item(q, t, np.int32(at + d))
                    if q_code == quant.BFLOAT16:  # noqa: SIM108 (a constant: one branch compiled)
                        x = quant.widen_bfloat16(raw)
                    else:
                        x = np.float32(raw)
                q_s[index(r * stride + d)] = x

    return device_function(stage_q)


def make_stage_kv(lay: Layout, k_loader, v_loader, scaled: tuple[bool, bool], tile_cell):
    """`stage_kv` of pools read by `lanes` loaders (load, value) whose values are multiplied
    by their scale where `scaled` says (K, V), cells found by the view's `tile_cell`."""
    load_k, k_value = k_loader
    load_v, v_value = v_loader
    k_scaled, v_scaled = scaled
    n_vectors, vectors = np.int32(PREFILL_TILE * lay.vectors), np.int32(lay.vectors)
    qk_stride, v_stride, vec = np.int32(lay.qk_stride), np.int32(lay.v_stride), np.int32(VEC)
    per_thread = lay.per_thread

    def stage_kv(k_s, v_s, flags_s, parity, k_pool, v_pool, view, key, j0, rows, k_at, v_at,
                 k_scale, v_scale, tid):  # fmt: skip
        """Vector (cell jj, d0) of K and V into k_s and v_s as float32, per thread, for the
        cells some token sees (flags_s[parity, jj] != 0: their bits), zeros for the rest;
        flags_s[VIS, jj] = those bits, 0 where the cell is outside the pool. Returns 1 where
        a staged V value is not finite (or their sum overflows), else 0."""
        # k_pool, v_pool: [rows, n_kv_heads, row_width]; k_at, v_at: the KV head's offset
        bad = np.int32(0)
        for u in range(per_thread):
            v = np.int32(tid + u * THREADS)
            if v < n_vectors:
                jj = quotient(v, vectors)
                d0 = np.int32((v - jj * vectors) * vec)
                bits = flags_s[parity, jj]
                c = np.int32(-1)
                if bits != 0:  # the view's cell table is read only where a token looks
                    c = tile_cell(view, key, np.int32(j0 + jj), rows)
                k_raw, k_sc = load_k(k_pool, c, k_at, d0, k_scale)
                v_raw, v_sc = load_v(v_pool, c, v_at, d0, v_scale)
                kb = index(jj * qk_stride + d0)
                vb = index(jj * v_stride + d0)
                total = ZERO
                for e in range(VEC):
                    x = k_value(k_raw, e)
                    y = v_value(v_raw, e)
                    if k_scaled:  # code x d: exact in float32, the reference's value
                        x = x * k_sc
                    if v_scaled:
                        y = y * v_sc
                    k_s[kb + index(e)] = x
                    v_s[vb + index(e)] = y
                    total += y
                if total - total != ZERO:  # NaN or inf among them (or a sum past float32)
                    bad = np.int32(1)
                if d0 == 0:
                    flags_s[VIS, jj] = bits if c >= 0 else np.uint32(0)
        return bad

    return device_function(stage_kv)


def make_write_rows(lay: Layout, out_code: int):
    """`write_rows` of an out of code out_code (`storage.IO_KINDS`: float32, or bfloat16
    patterns rounded to nearest even as a bfloat16 pool stores)."""
    lanes, chunk, dim = np.int32(ROW_LANES), np.int32(lay.chunk), np.int32(lay.head_dim)
    n_chunks, width = lay.dims // lay.chunk, lay.chunk

    def write_rows(out, acc, m, total, tok_s, r0, tx, n_rows, n_here, h0, out_head):
        """out[t, h] of the thread's rows: the weighted mean, 0 where the row saw nothing,
        NaN where its max is not finite (a NaN or an infinite score)."""
        # out: [>= width, n_heads, head_dim], out_head its head stride (elements)
        for i in range(THREAD_ROWS):
            r = np.int32(r0 + i)
            if r < n_rows:
                k = quotient(r, n_here)
                t, h = tok_s[T, k], np.int32(h0 + r - k * n_here)
                is_finite = NEG_INF < m[i] < POS_INF
                for hh in range(n_chunks):
                    for e in range(width):
                        d = np.int32((hh * lanes + tx) * chunk + e)
                        value = acc[i, hh * width + e]
                        if total[i] == EMPTY:
                            value = ZERO
                        elif not is_finite:
                            value = NAN
                        if d < dim:
                            if out_code == quant.BFLOAT16:
                                value = storage.narrow_bfloat16(value)
                            wide.put(out, t, np.int32(h * out_head + d), value)

    return device_function(write_rows)
