"""The tile engine every attention kernel shares: device functions over one block's rows.

Rows of a block: row r is token k = r // n_hb of the block (its step row tok_s[T, k]) and
query head h0 + r % n_hb; n_rows = n_tok * n_hb. Arrays suffixed _s live in shared memory.
Per block the token table `tok_s` ([TOKEN_ROWS, tokens] int32) holds, per token k: T its step
row, KEY the sequence whose sweep indices it reads (0 for every token of a masked view),
and [LO, HI) the sweep indices it may see (`views`).

A tile is a run of sweep indices: flags (who sees which cell, `views`) -> K/V of the
needed cells into shared memory as float32 (zeros for the others; `make_load_tile`, one per
pair of storage kinds, dequantizing quantized pools on the way) -> scores of the rows that
see each cell -> per row: max, rescale, exp, sum -> acc[row, d] += p * V[c, d].

The accumulator holds the weighted mean of the V rows seen so far (weights p / l, the old
mean rescaled by l_old * alpha / l_new), as the reference normalises its weights before
the product: finite V as large as float32 allows never overflows a sum.

NaN and inf follow the reference's float32 softmax (docs/contract.md §5, `reference.attention`): the
running max m propagates NaN; a row whose max is not finite once it saw a cell gives NaN;
a seen cell of weight 0 still adds 0 * V (so a NaN or inf in V spreads as in the
reference); l = EMPTY marks a row that has seen no cell, which gives 0. One case differs:
an inf in V whose weight the reference rounds to 0 (its score ~100 below the max) but which
an earlier tile's max weighed above 0 gives inf, not NaN (0 · inf): the running product
of rescale factors does not underflow where exp(s - max) does.
"""

import math

import numpy as np

from numbakv.cache.cuda import cuda, int_as_float
from numbakv.cache.kernels import device_function, quant, storage

HEAD_DIM_MAX = 128  # the largest head_dim; shared arrays are sized for it
K_STRIDE = HEAD_DIM_MAX + 1  # K and q rows padded by one word: no shared bank conflicts
PREFILL_TILE = 16  # cells per K/V tile of the prefill kernels
PREFILL_ROWS = 16  # query rows (tokens x heads) per prefill block
MAX_TOKENS = PREFILL_ROWS  # tokens per block, at most (one head each)
T, KEY, LO, HI = 0, 1, 2, 3  # rows of the token table tok_s
TOKEN_ROWS = 4  # ... of which there are four

NEG_INF = np.float32(-np.inf)  # the running max before any cell
POS_INF = np.float32(np.inf)
NAN = np.float32(np.nan)
EMPTY = np.float32(-1.0)  # l of a row that has seen no cell (a seen cell makes l >= 0)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
SHIFT = quant.SHIFT  # a bfloat16 pattern's place in a float32

STORAGE = storage.STORAGE  # pool dtypes the kernels compile for (uint16: bfloat16, uint8)


def io_signature(io_kind: str) -> str:
    """The signature of a q or out of `io_kind` made at import: [>= width, n_heads, head_dim]
    float32, or uint16 (bfloat16 patterns)."""
    return f"{storage.IO_KINDS[io_kind][1][0]}[:, :, ::1]"


PARTIALS = "float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1]"  # acc, m, l


@device_function
def n_head_blocks(n_heads, n_kv_heads, n_hb):
    """Head blocks of a grid: KV heads x chunks of at most n_hb query heads of one group."""
    group = n_heads // n_kv_heads
    return n_kv_heads * ((group + n_hb - 1) // n_hb)


@device_function
def heads_of(hy, group, n_hb):
    """(KV head, first query head, heads in this chunk) of head block `hy`."""
    n_chunks = (group + n_hb - 1) // n_hb
    kv_head = hy // n_chunks
    g0 = (hy - kv_head * n_chunks) * n_hb
    return kv_head, kv_head * group + g0, min(n_hb, group - g0)


def make_start_rows(q_kind: str):
    """The row starter of a q of `q_kind` (`storage.IO_KINDS`: float, or bfloat16 patterns
    widened inline, where a device function call would cost the simulator a module swap)."""
    q_code = storage.IO_KINDS[q_kind][0]

    def start_rows(q_s, acc_s, m_s, l_s, q, tok_s, n_rows, n_hb, h0, head_dim):
        """Loads the rows' queries, zeroes their accumulators, m = -inf and l = EMPTY."""
        # q: [>= width, n_heads, head_dim]  q_s: [rows, K_STRIDE]  acc_s: [rows, HEAD_DIM_MAX]
        tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
        for i in range(tid, n_rows * head_dim, n_threads):
            r = i // head_dim
            d = i - r * head_dim
            x = q[tok_s[T, r // n_hb], h0 + r % n_hb, d]
            if q_code == quant.FLOAT:
                q_s[r, d] = x
            else:
                q_s[r, d] = int_as_float(np.int32(np.int32(x) << SHIFT))
            acc_s[r, d] = ZERO
        for r in range(tid, n_rows, n_threads):
            m_s[r] = NEG_INF
            l_s[r] = EMPTY
        cuda.syncthreads()

    return device_function(start_rows)


def make_load_tile(k_kind: str, v_kind: str):
    """The tile loader of pools of (k_kind, v_kind) (`storage.KINDS`): float pools cast,
    bfloat16 pools widen their bit patterns, quantized pools dequantize (`quant`). Closure
    constants, so the compiler keeps one branch each for K and V. Float and bfloat16 loads
    call no device function: each call costs the simulator a module swap (60x slower)."""
    k_code, v_code = storage.KINDS[k_kind][0], storage.KINDS[v_kind][0]

    def load_tile(k_s, v_s, cell_s, k_pool, v_pool, kv_scales, kv_head, head_dim):
        """K/V of the cells some row sees into shared memory as float32; zeros for the rest
        (never garbage)."""
        # k_pool, v_pool: [rows, n_kv_heads, row_width]  k_s: [tile, K_STRIDE]
        # v_s: [tile, HEAD_DIM_MAX]  cell_s: [tile] int32, -1 = seen by no row
        # kv_scales: [2, n_kv_heads] float32, fp8's K and V scales
        tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
        k_scale, v_scale = kv_scales[0, kv_head], kv_scales[1, kv_head]
        for i in range(tid, cell_s.shape[0] * head_dim, n_threads):
            jj = i // head_dim
            d = i - jj * head_dim
            c = cell_s[jj]
            if c < 0:
                k_s[jj, d] = ZERO
                v_s[jj, d] = ZERO
            else:
                if k_code == quant.FLOAT:
                    k_s[jj, d] = np.float32(k_pool[c, kv_head, d])
                elif k_code == quant.BFLOAT16:  # the pattern is the top half of the float32
                    k_s[jj, d] = int_as_float(np.int32(np.int32(k_pool[c, kv_head, d]) << SHIFT))
                else:
                    k_s[jj, d] = quant.load_quantized(k_pool, c, kv_head, d, k_code, k_scale)
                if v_code == quant.FLOAT:
                    v_s[jj, d] = np.float32(v_pool[c, kv_head, d])
                elif v_code == quant.BFLOAT16:
                    v_s[jj, d] = int_as_float(np.int32(np.int32(v_pool[c, kv_head, d]) << SHIFT))
                else:
                    v_s[jj, d] = quant.load_quantized(v_pool, c, kv_head, d, v_code, v_scale)
        cuda.syncthreads()

    return device_function(load_tile)


@device_function
def tile_update(
    q_s, acc_s, k_s, v_s, s_s, ok_s, m_s, l_s, alpha_s, n_rows, n_hb, head_dim, scale
):  # fmt: skip
    """One loaded K/V tile into every row's online softmax: score, rescale, accumulate."""
    # k_s: [tile, K_STRIDE]  v_s: [tile, HEAD_DIM_MAX]  s_s: [rows, tile] scores, then weights
    # ok_s: [tokens, tile] who sees which cell  m_s, l_s, alpha_s: [rows]
    tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
    tile = ok_s.shape[1]
    # scores, only where the row sees the cell (the others are never read)
    for i in range(tid, n_rows * tile, n_threads):
        r = i // tile
        jj = i - r * tile
        if ok_s[r // n_hb, jj] != 0:
            dot = ZERO
            for d in range(head_dim):
                dot += q_s[r, d] * k_s[jj, d]
            s_s[r, jj] = dot * scale
    cuda.syncthreads()
    # per row: the new max, the rescale factor, the weights and their sum; an exp runs
    # only on finite differences <= 0 (no inf - inf, no overflow in the simulator)
    for r in range(tid, n_rows, n_threads):
        k = r // n_hb
        m_old = m_s[r]
        m_new = m_old
        is_seen = False
        for jj in range(tile):
            if ok_s[k, jj] != 0:
                score = s_s[r, jj]
                if score > m_new or score != score:  # a max that keeps a NaN
                    m_new = score
                is_seen = True
        is_usable = NEG_INF < m_new < POS_INF  # else the row ends NaN (or all -inf so far)
        total = ZERO
        for jj in range(tile):
            p = ZERO
            if ok_s[k, jj] != 0 and is_usable and s_s[r, jj] > NEG_INF:
                p = math.exp(s_s[r, jj] - m_new)
            s_s[r, jj] = p
            total += p
        alpha = math.exp(m_old - m_new) if (is_usable and m_old < m_new) else ONE
        m_s[r] = m_new
        keep = ONE  # acc stays the weighted mean of what the row saw: no overflow in sums
        if is_seen:
            kept = max(l_s[r], ZERO) * alpha
            l_new = kept + total
            if is_usable:  # then l_new >= 1: the max's own weight is 1
                inv = ONE / l_new
                keep = kept * inv
                for jj in range(tile):
                    s_s[r, jj] = s_s[r, jj] * inv
            l_s[r] = l_new
        alpha_s[r] = keep
    cuda.syncthreads()
    # acc[r, d] = acc[r, d] * keep + sum of (p / l) * V over the cells the row sees
    for i in range(tid, n_rows * head_dim, n_threads):
        r = i // head_dim
        d = i - r * head_dim
        k = r // n_hb
        a = acc_s[r, d] * alpha_s[r]
        for jj in range(tile):
            if ok_s[k, jj] != 0:  # select: a cell the row does not see is never in the sum
                a += s_s[r, jj] * v_s[jj, d]
        acc_s[r, d] = a
    cuda.syncthreads()


def make_write_rows(out_kind: str):
    """The row writer of an out of `out_kind` (`storage.IO_KINDS`: float, or bfloat16
    patterns, rounded to nearest even as a bfloat16 pool stores)."""
    out_code = storage.IO_KINDS[out_kind][0]

    def write_rows(out, acc_s, m_s, l_s, tok_s, n_rows, n_hb, h0, head_dim):
        """out[t, h] = the row's weighted mean; 0 where the row saw nothing, NaN where its
        max is not finite (a NaN or an infinite score)."""
        # out: [>= width, n_heads, head_dim]
        for i in range(cuda.threadIdx.x, n_rows * head_dim, cuda.blockDim.x):
            r = i // head_dim
            d = i - r * head_dim
            value = acc_s[r, d]
            if l_s[r] == EMPTY:
                value = ZERO
            elif not NEG_INF < m_s[r] < POS_INF:
                value = NAN
            t, h = tok_s[T, r // n_hb], h0 + r % n_hb
            if out_code == quant.FLOAT:
                out[t, h, d] = value
            else:
                out[t, h, d] = storage.narrow_bfloat16(value)
        cuda.syncthreads()

    return device_function(write_rows)
