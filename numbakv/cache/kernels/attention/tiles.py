"""The tile engine every attention kernel shares: device functions over one block's rows.

Rows of a block: row r is token k = r // n_hb of the block (its step row tok_s[T, k]) and
query head h0 + r % n_hb; n_rows = n_tok * n_hb. Arrays suffixed _s live in shared memory.
Per block the token table `tok_s` ([TOKEN_ROWS, tokens] int32) holds, per token k: T its step
row, KEY the sequence whose sweep indices it reads (0 for every token of a masked view),
and [LO, HI) the sweep indices it may see (`views`).

A tile is a run of sweep indices: flags (who sees which cell, `views`) -> K/V of the
needed cells into shared memory as float32 (zeros for the others) -> scores of the rows
that see each cell -> per row: max, rescale, exp, sum -> acc[row, d] += p * V[c, d].
"""

import math

import numpy as np

from numbakv.cache._cuda import cuda
from numbakv.cache.kernels import device_function

HEAD_DIM_MAX = 128  # the largest head_dim; shared arrays are sized for it
K_STRIDE = HEAD_DIM_MAX + 1  # K and q rows padded by one word: no shared bank conflicts
DECODE_TILE = 32  # cells per K/V tile of the decode kernels
DECODE_ROWS = 8  # query heads per decode block (a GQA group of up to 8 in one block)
PREFILL_TILE = 16  # cells per K/V tile of the prefill kernels
PREFILL_ROWS = 16  # query rows (tokens x heads) per prefill block
MAX_TOKENS = PREFILL_ROWS  # tokens per block, at most (one head each)
T, KEY, LO, HI = 0, 1, 2, 3  # rows of the token table tok_s
TOKEN_ROWS = 4  # ... of which there are four

NEG_BIG = np.float32(-3.0e38)  # the running max before any cell: finite, so exp(m_old - m_new)
# never sees inf - inf (and the simulator never exp(-inf))
ZERO = np.float32(0.0)

STORAGE = ("float32", "float16")  # storage dtypes every kernel compiles for
Q = "float32[:, :, ::1]"  # signature of q and out: [>= width, n_heads, head_dim]
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


@device_function
def split_range(lo, hi, split, n_splits):
    """[start, end) of split `split` of [lo, hi): n_splits near-equal parts, some maybe empty."""
    size = (hi - lo + n_splits - 1) // n_splits
    start = min(hi, lo + split * size)
    return start, min(hi, start + size)


@device_function
def start_rows(q_s, acc_s, m_s, l_s, q, tok_s, n_rows, n_hb, h0, head_dim):
    """Loads the rows' queries, zeroes their accumulators, m = NEG_BIG and l = 0."""
    # q: [>= width, n_heads, head_dim]  q_s: [rows, K_STRIDE]  acc_s: [rows, HEAD_DIM_MAX]
    tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
    for i in range(tid, n_rows * head_dim, n_threads):
        r = i // head_dim
        d = i - r * head_dim
        q_s[r, d] = q[tok_s[T, r // n_hb], h0 + r % n_hb, d]
        acc_s[r, d] = ZERO
    for r in range(tid, n_rows, n_threads):
        m_s[r] = NEG_BIG
        l_s[r] = ZERO
    cuda.syncthreads()


@device_function
def tile_update(
    q_s, acc_s, k_s, v_s, s_s, ok_s, cell_s, m_s, l_s, alpha_s,
    k_pool, v_pool, kv_head, n_rows, n_hb, head_dim, scale,
):  # fmt: skip
    """One K/V tile into every row's online softmax: load, score, rescale, accumulate."""
    # k_pool, v_pool: [rows, n_kv_heads, head_dim]  k_s: [tile, K_STRIDE]  v_s: [tile, HEAD_DIM_MAX]
    # s_s: [rows, tile] scores, then weights  m_s, l_s, alpha_s: [rows]
    tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
    tile = cell_s.shape[0]
    # K/V of the cells some row sees, as float32; zeros for the rest (never garbage)
    for i in range(tid, tile * head_dim, n_threads):
        jj = i // head_dim
        d = i - jj * head_dim
        c = cell_s[jj]
        if c >= 0:
            k_s[jj, d] = np.float32(k_pool[c, kv_head, d])
            v_s[jj, d] = np.float32(v_pool[c, kv_head, d])
        else:
            k_s[jj, d] = ZERO
            v_s[jj, d] = ZERO
    cuda.syncthreads()
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
    # per row: the new max, the rescale factor, the weights and their sum
    for r in range(tid, n_rows, n_threads):
        k = r // n_hb
        m_old = m_s[r]
        m_new = m_old
        for jj in range(tile):
            if ok_s[k, jj] != 0:
                m_new = max(m_new, s_s[r, jj])
        total = ZERO
        for jj in range(tile):
            p = ZERO
            if ok_s[k, jj] != 0:
                p = math.exp(s_s[r, jj] - m_new)  # <= 0: no overflow
            s_s[r, jj] = p
            total += p
        alpha = math.exp(m_old - m_new)  # both finite: 1 when the max stays
        alpha_s[r] = alpha
        m_s[r] = m_new
        l_s[r] = l_s[r] * alpha + total
    cuda.syncthreads()
    # acc[r, d] = acc[r, d] * alpha + sum of p * V over the cells the row sees
    for i in range(tid, n_rows * head_dim, n_threads):
        r = i // head_dim
        d = i - r * head_dim
        a = acc_s[r, d] * alpha_s[r]
        for jj in range(tile):
            p = s_s[r, jj]
            if p != ZERO:  # select: a cell the row does not see is never in the sum
                a += p * v_s[jj, d]
        acc_s[r, d] = a
    cuda.syncthreads()


@device_function
def write_rows(out, acc_s, l_s, tok_s, n_rows, n_hb, h0, head_dim):
    """out[t, h] = acc / l for each row, 0 where the row saw nothing."""
    # out: [>= width, n_heads, head_dim]
    for i in range(cuda.threadIdx.x, n_rows * head_dim, cuda.blockDim.x):
        r = i // head_dim
        d = i - r * head_dim
        total = l_s[r]
        out[tok_s[T, r // n_hb], h0 + r % n_hb, d] = acc_s[r, d] / total if total > ZERO else ZERO
    cuda.syncthreads()


@device_function
def write_partial(part_acc, part_m, part_l, acc_s, m_s, l_s, t, split, n_rows, h0, head_dim):
    """The split's unnormalised (acc, m, l) of each row (one token, n_rows heads)."""
    # part_acc: [>= width, n_heads, >= n_splits, head_dim]  part_m, part_l: [.., .., >= n_splits]
    tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
    for i in range(tid, n_rows * head_dim, n_threads):
        r = i // head_dim
        d = i - r * head_dim
        part_acc[t, h0 + r, split, d] = acc_s[r, d]
    for r in range(tid, n_rows, n_threads):
        part_m[t, h0 + r, split] = m_s[r]
        part_l[t, h0 + r, split] = l_s[r]
    cuda.syncthreads()
