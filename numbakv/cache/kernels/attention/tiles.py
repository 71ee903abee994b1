"""The prefill kernel's tiles: geometry, shared-memory layout and a tile's arithmetic.

Geometry. A block of THREADS threads holds PREFILL_ROWS query rows (row r: token
r // n_here of the block's tokens, query head h0 + r % n_here of one KV group) and sweeps
K/V tiles of PREFILL_TILE cells. Its threads form row groups of ROW_LANES consecutive lanes
(a warp holds whole groups): group ty owns rows [4 ty, 4 ty + 4) (THREAD_ROWS), and its lane
tx the tile's cells tx + ROW_LANES j (j < THREAD_CELLS) for the scores and the dimensions
(h ROW_LANES + tx) chunk + e (`Layout`) for the output. Each thread so holds a register tile
of 4 x THREAD_CELLS scores and 4 x `Layout.dims` accumulators; its rows' softmax statistics
(max, then sum) meet over the group's lanes by xor shuffles, four rows per shuffle, and are
then the same in every lane of the group. On a GPU: 128 threads, groups of 16 lanes, 32 rows
x 16 cells a tile, a thread 4 x 1 scores and 4 x 8 outputs at head_dim 128 (per tile 512
FFMA for q K and 512 for p V against 20 + 12 16-byte shared loads a 16 columns or 4 cells).
In the simulator (16 threads): groups of 2 lanes, 32 rows x 16 cells, 4 x 8 scores.

Shared memory, float32 in 16-byte aligned rows: q_s [rows, qk_stride] the block's queries,
k_s [tile, qk_stride] and v_s [tile, v_stride] the tile's K and V (dequantized as staged,
zeros for cells no row sees; `staging`), p_s [tile, P_STRIDE] the rows' weights, transposed
so that one 16-byte load gives a thread the weights of its 4 rows for a cell. Rows of q_s,
k_s and p_s are padded by 4 words: 8 lanes loading 16 bytes from 8 rows hit 32 banks.

A tile: flags (`views`: the tokens that see each sweep index, as bits) -> `staging.stage_kv`
-> `scores` -> `softmax` (the weights into p_s, acc rescaled) -> `accumulate` (acc += p V).
The softmax is decode's (docs/contract.md §5) to the special values: the running max keeps
a NaN; a row whose max is not finite once it saw a cell gives NaN; a seen cell of weight 0
still adds 0 V; a row that saw nothing gives exactly 0; acc is the weighted mean (weights
normalised per tile), so finite V never overflows. A row weighs a staged cell it does not
see 0, which adds 0 V = 0 while the tile's V is finite; a tile with a NaN or an inf in V
takes `accumulate`'s second path, which selects per row and cell instead. Scores are in
base 2 (scale log2 e): exp2 and rcp are `wide`'s one-instruction primitives.
"""

from typing import NamedTuple

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels import device_function, storage, wide
from numbakv.cache.kernels.launch import ATTN_THREADS, SIM_ATTN_THREADS

THREADS = SIM_ATTN_THREADS if IS_SIMULATOR else ATTN_THREADS  # per block, as launch gives
ROW_LANES = 2 if IS_SIMULATOR else 16  # lanes of a row group (a power of two, <= 32)
THREAD_ROWS = 4  # rows of a thread: `wide.lane_sum4` and `row_max4` reduce four at once
THREAD_CELLS = 8 if IS_SIMULATOR else 1  # cells of a thread's score tile
PREFILL_ROWS = THREADS // ROW_LANES * THREAD_ROWS  # query rows (tokens x heads) per block
PREFILL_TILE = ROW_LANES * THREAD_CELLS  # cells per K/V tile
P_STRIDE = PREFILL_ROWS + 4  # p_s row stride (words)
FLAG_STRIDE = THREADS // PREFILL_TILE  # threads per cell when flags are computed (>= 1)
FLAG_TOKENS = -(-PREFILL_ROWS // FLAG_STRIDE)  # tokens a thread tests per cell, at most
HEAD_DIM_MAX = 128  # the largest head_dim: q_s, k_s and v_s fill ~36 KB of shared memory
T, KEY, LO, HI = 0, 1, 2, 3  # rows of the token table tok_s: step row, sweep key, [LO, HI)
VIS = 2  # the row of flags_s that holds the tokens that see each cell of the tile
TOKEN_ROWS = 4
VEC = wide.VEC  # elements of a lane's wide load

NEG_INF = np.float32(-np.inf)  # the running max before any cell
POS_INF = np.float32(np.inf)
NAN = np.float32(np.nan)
EMPTY = np.float32(-1.0)  # l of a row that has seen no cell (a seen cell makes l >= 0)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
LOG2E = np.float32(1.4426950408889634)
FULL = np.uint32(0xFFFFFFFF)

STORAGE = storage.STORAGE  # pool dtypes the kernels compile for (uint16: bfloat16, uint8)
# shared-memory indices are unsigned: numba then adds no negative-index wraparound, and LLVM
# merges four loads of consecutive words of a 16-byte aligned row into one LDS.128
index = int if IS_SIMULATOR else np.uint32
# the simulator skips the products of cells no row of a thread sees (their scores are never
# read, their weights are 0 of finite V): dead work a GPU does branch-free
SKIP_UNSEEN = IS_SIMULATOR
ALIGN = None if IS_SIMULATOR else 16  # bytes of a shared array's alignment (the simulator's
# arrays take none, and are NumPy's anyway)


def io_signature(io_kind: str) -> str:
    """The signature of a q or out of `io_kind` made at import: [>= width, n_heads, head_dim]
    float32, or uint16 (bfloat16 patterns)."""
    return f"{storage.IO_KINDS[io_kind][1][0]}[:, :, ::1]"


def kernel_signatures(signatures, view: str, k_kind: str, v_kind: str, q_kind: str,
                      out_kind: str) -> tuple[list, list[str]]:  # fmt: skip
    """(pool dtype pairs, signatures) an attention kernel of these kinds compiles for:
    `signatures(view, pools, q, out)` over the pairs of `storage.pool_dtypes`, only the
    first pair when q or out holds bfloat16 patterns (the io code is one branch)."""
    pools = storage.pool_dtypes(k_kind, v_kind)
    if (q_kind, out_kind) != ("float", "float"):
        pools = pools[:1]
    return pools, signatures(view, pools, io_signature(q_kind), io_signature(out_kind))


PARTIALS = "float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1]"  # acc, m, l


class Layout(NamedTuple):
    """The shared arrays and thread tiles of one head_dim (all in float32 words)."""

    head_dim: int
    cols: int  # columns of q_s and k_s: head_dim rounded up to 16 (zeros past head_dim)
    vectors: int  # lane vectors of a row staged (VEC elements, zeros past head_dim)
    qk_stride: int  # row stride of q_s and k_s
    chunk: int  # accumulator dims a thread reads together (4: one 16-byte load)
    dims: int  # accumulator dims per row of a thread
    v_stride: int  # row stride of v_s: ROW_LANES x dims >= vectors x VEC
    per_thread: int  # K/V vectors a thread stages per tile

    @property
    def words(self) -> tuple[int, int, int, int]:
        """Sizes of q_s, k_s, v_s and p_s."""
        return (PREFILL_ROWS * self.qk_stride, PREFILL_TILE * self.qk_stride,
                PREFILL_TILE * self.v_stride, PREFILL_TILE * P_STRIDE)  # fmt: skip


def layout(head_dim: int) -> Layout:
    """The `Layout` of `head_dim` (1 to HEAD_DIM_MAX)."""
    vectors = -(-head_dim // VEC)
    cols = -(-head_dim // 16) * 16  # `scores` takes 16 columns a step
    dims = -(-vectors * VEC // ROW_LANES)
    per_thread = -(-PREFILL_TILE * vectors // THREADS)
    return Layout(head_dim, cols, vectors, cols + 4, 4 if dims % 4 == 0 else 1, dims,
                  ROW_LANES * dims, per_thread)  # fmt: skip


def _keep_nan_max(x, y):
    """max(x, y), NaN when either is NaN: the running max's rule."""
    return x if (x > y or x != x) else y


keep_nan_max = device_function(_keep_nan_max)


@device_function  # it names `cuda`: the simulator swaps in its own for the call
def _row_reduce4_sim(a, b, c, d, is_max):
    values = (np.float32(a), np.float32(b), np.float32(c), np.float32(d))
    # the row group's lanes meet apart (the GPU's butterfly never leaves a group): a meeting
    # of ROW_LANES threads, not of the whole warp
    mask = ((1 << ROW_LANES) - 1) << (int(cuda.laneid) & -ROW_LANES)
    offset = ROW_LANES >> 1
    while offset > 0:  # the GPU's butterfly, one exchange of the four values a step
        other = cuda.shfl_xor_sync(mask, values, offset)
        if is_max:
            values = tuple(_keep_nan_max(x, y) for x, y in zip(values, other, strict=True))
        else:
            values = tuple(np.float32(x + y) for x, y in zip(values, other, strict=True))
        offset >>= 1
    return values


def _row_max4_sim(a, b, c, d):
    return _row_reduce4_sim(a, b, c, d, True)


def _row_sum4_sim(a, b, c, d, lanes):
    return _row_reduce4_sim(a, b, c, d, False)


@device_function
def _row_max4(a, b, c, d):
    offset = np.int32(ROW_LANES >> 1)
    while offset > 0:
        a = keep_nan_max(a, cuda.shfl_xor_sync(FULL, a, offset))
        b = keep_nan_max(b, cuda.shfl_xor_sync(FULL, b, offset))
        c = keep_nan_max(c, cuda.shfl_xor_sync(FULL, c, offset))
        d = keep_nan_max(d, cuda.shfl_xor_sync(FULL, d, offset))
        offset >>= np.int32(1)
    return a, b, c, d


# (a, b, c, d) -> their NaN-keeping maxima over each row group's ROW_LANES lanes, and
# (a, b, c, d, ROW_LANES) -> their sums (`wide.lane_sum4`), in every lane. Every lane of the
# warp calls them (a full mask in converged code: a partial mask in a branch makes ptxas add
# a slow collective path); the simulator meets once a step for all four values.
row_max4 = device_function(_row_max4_sim) if IS_SIMULATOR else _row_max4
row_sum4 = device_function(_row_sum4_sim) if IS_SIMULATOR else wide.lane_sum4


def make_scores(lay: Layout):
    """`scores` over the staged columns of `lay`."""
    stride, lanes, cols = np.int32(lay.qk_stride), np.int32(ROW_LANES), np.int32(lay.cols)
    sixteen = np.int32(16)

    @device_function
    def score_step(q_s, k_s, s, r0, tx, d, o, need):
        """s[i, j] += q_s[r0 + i, d + o : d + o + 4] . k_s[tx + ROW_LANES j, same]: o is a
        constant, added to unsigned row bases, so that it folds into the loads' offsets. The
        4 rows are written out (THREAD_ROWS): the simulator indexes no array for them.
        need: bit j set where cell j is seen by a row of the thread (`SKIP_UNSEEN`)."""
        at = index(d) + index(o)
        qb = index(r0 * stride) + at
        q00, q01, q02, q03 = q_s[qb], q_s[qb + 1], q_s[qb + 2], q_s[qb + 3]
        qb = qb + index(stride)
        q10, q11, q12, q13 = q_s[qb], q_s[qb + 1], q_s[qb + 2], q_s[qb + 3]
        qb = qb + index(stride)
        q20, q21, q22, q23 = q_s[qb], q_s[qb + 1], q_s[qb + 2], q_s[qb + 3]
        qb = qb + index(stride)
        q30, q31, q32, q33 = q_s[qb], q_s[qb + 1], q_s[qb + 2], q_s[qb + 3]
        for j in range(THREAD_CELLS):
            if SKIP_UNSEEN and (need >> j) & 1 == 0:
                continue
            kb = index((tx + j * lanes) * stride) + at
            k0, k1, k2, k3 = k_s[kb], k_s[kb + 1], k_s[kb + 2], k_s[kb + 3]
            s[0, j] = s[0, j] + q00 * k0 + q01 * k1 + q02 * k2 + q03 * k3
            s[1, j] = s[1, j] + q10 * k0 + q11 * k1 + q12 * k2 + q13 * k3
            s[2, j] = s[2, j] + q20 * k0 + q21 * k1 + q22 * k2 + q23 * k3
            s[3, j] = s[3, j] + q30 * k0 + q31 * k1 + q32 * k2 + q33 * k3

    def scores(q_s, k_s, s, flags_s, group_bits, r0, tx):
        """s[i, j] = q_s[r0 + i] . k_s[tx + ROW_LANES j] over the staged columns (float32,
        in order of d); group_bits: the tokens of the thread's rows."""
        need = 0
        for j in range(THREAD_CELLS):
            if (flags_s[VIS, index(tx + j * lanes)] & group_bits) != 0:
                need |= 1 << j
            for i in range(THREAD_ROWS):
                s[i, j] = ZERO
        for d in range(np.int32(0), cols, sixteen):
            # four steps written out: the compiler would not unroll a loop of them, and 16
            # bytes of each row a step are LDS.128 loads at constant offsets
            score_step(q_s, k_s, s, r0, tx, d, 0, need)
            score_step(q_s, k_s, s, r0, tx, d, 4, need)
            score_step(q_s, k_s, s, r0, tx, d, 8, need)
            score_step(q_s, k_s, s, r0, tx, d, 12, need)

    return device_function(scores)


def make_softmax(lay: Layout):
    """`softmax` of accumulators of `lay`."""
    lanes, dims, p_stride = np.int32(ROW_LANES), lay.dims, np.int32(P_STRIDE)

    def softmax(s, m, total, acc, st, p_s, flags_s, rowbit, tile_bits, r0, tx, scale2):
        """The tile's scores s (of q . K) into each row's online softmax: m and total (l)
        updated, acc rescaled to the weighted mean of the rows seen so far, the tile's
        weights p / l into p_s (0 where the row does not see the cell). tile_bits: the tokens
        that see a cell of the tile; st: [3, 4] scratch. Scores of cells the row does not
        see are never read (they may be stale: a row group that sees no cell of the tile
        skips `scores`), so a row that sees none keeps its state exactly."""
        for i in range(THREAD_ROWS):
            mx = m[i]
            if (tile_bits & rowbit[i]) != 0:  # the same in the row group's lanes
                for j in range(THREAD_CELLS):
                    x = s[i, j] * scale2
                    s[i, j] = x
                    is_seen = (flags_s[VIS, index(tx + j * lanes)] & rowbit[i]) != 0
                    if is_seen and (x > mx or x != x):  # a max that keeps a NaN
                        mx = x
            st[0, i] = mx
        st[0, 0], st[0, 1], st[0, 2], st[0, 3] = row_max4(st[0, 0], st[0, 1], st[0, 2], st[0, 3])
        for i in range(THREAD_ROWS):
            m_old, m_new = m[i], st[0, i]
            is_usable = NEG_INF < m_new < POS_INF
            row_sum = ZERO
            for j in range(THREAD_CELLS):
                x = s[i, j]
                is_seen = (flags_s[VIS, index(tx + j * lanes)] & rowbit[i]) != 0
                # exp2 of a difference <= 0 (the max is finite, x a seen score), or 0
                p = wide.exp2(x - m_new) if (is_seen and is_usable and x > NEG_INF) else ZERO
                s[i, j] = p
                row_sum += p
            st[1, i] = wide.exp2(m_old - m_new) if (is_usable and m_old < m_new) else ONE
            st[2, i] = row_sum
            m[i] = m_new
        st[2, 0], st[2, 1], st[2, 2], st[2, 3] = row_sum4(
            st[2, 0], st[2, 1], st[2, 2], st[2, 3], lanes
        )
        for i in range(THREAD_ROWS):
            is_usable = NEG_INF < m[i] < POS_INF
            kept = max(total[i], ZERO) * st[1, i]
            l_new = kept + st[2, i]
            inv = wide.rcp(l_new) if is_usable else ONE  # l_new >= 1 then: the max weighs 1
            for j in range(THREAD_CELLS):
                s[i, j] = s[i, j] * inv
            if (tile_bits & rowbit[i]) != 0:  # else l and acc stay (keep would be 1)
                total[i] = l_new
                keep = kept * inv if is_usable else ONE
                for e in range(dims):
                    acc[i, e] = acc[i, e] * keep
        for j in range(THREAD_CELLS):  # a cell's 4 weights: one 16-byte store
            pb = index((tx + j * lanes) * p_stride + r0)
            for i in range(THREAD_ROWS):
                p_s[pb + index(i)] = s[i, j]

    return device_function(softmax)


def make_accumulate(lay: Layout):
    """`accumulate` into accumulators of `lay`."""
    lanes, chunk, stride = np.int32(ROW_LANES), np.int32(lay.chunk), np.int32(lay.v_stride)
    n_chunks, width, p_stride = lay.dims // lay.chunk, lay.chunk, np.int32(P_STRIDE)
    row, group = lay.v_stride, ROW_LANES * lay.chunk  # v_s words between cells, lane groups

    @device_function
    def accumulate_cell(acc, p_s, v_s, flags_s, group_bits, c, o, r0, tx):
        """acc[i, (h, e)] += p_s[c + o, r0 + i] v_s[c + o, (h ROW_LANES + tx) chunk + e]; o is
        a constant, which folds into the loads' offsets (as `scores`' steps); the 4 rows
        written out."""
        if SKIP_UNSEEN and (flags_s[VIS, c + o] & group_bits) == 0:
            return
        pb = index(c * p_stride + r0) + index(o * P_STRIDE)
        w0, w1, w2, w3 = p_s[pb], p_s[pb + 1], p_s[pb + 2], p_s[pb + 3]
        vb = index(c * stride + tx * chunk) + index(o * row)
        for h in range(n_chunks):
            for e in range(width):
                y = v_s[vb + index(h * group + e)]
                k = h * width + e
                acc[0, k] += w0 * y
                acc[1, k] += w1 * y
                acc[2, k] += w2 * y
                acc[3, k] += w3 * y

    def accumulate(acc, p_s, v_s, flags_s, rowbit, group_bits, r0, tx, is_finite):
        """acc[i, (h, e)] += p_s[c, r0 + i] v_s[c, (h ROW_LANES + tx) chunk + e] over the
        tile's cells c; where the tile's V is not finite (not is_finite), only over the
        cells row i sees (a weight 0 would add 0 x inf = NaN)."""
        if is_finite:  # every tile but a rare one: a cell a row does not see adds 0 x V = 0
            for c in range(np.int32(0), np.int32(PREFILL_TILE), np.int32(4)):
                # four cells written out, as `scores`' steps: 16-byte loads at constant offsets
                accumulate_cell(acc, p_s, v_s, flags_s, group_bits, c, 0, r0, tx)
                accumulate_cell(acc, p_s, v_s, flags_s, group_bits, c, 1, r0, tx)
                accumulate_cell(acc, p_s, v_s, flags_s, group_bits, c, 2, r0, tx)
                accumulate_cell(acc, p_s, v_s, flags_s, group_bits, c, 3, r0, tx)
        else:
            for c in range(np.int32(PREFILL_TILE)):
                pb = index(c * p_stride + r0)
                bits = flags_s[VIS, c]
                for h in range(n_chunks):
                    vb = index(c * stride + (h * lanes + tx) * chunk)
                    for e in range(width):
                        y = v_s[vb + index(e)]
                        for i in range(THREAD_ROWS):
                            if (bits & rowbit[i]) != 0:
                                acc[i, h * width + e] += p_s[pb + index(i)] * y

    return device_function(accumulate)
