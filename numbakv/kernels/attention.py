"""Attention over the cell pool (SPEC §5): masked and gathered, each in decode and prefill shape.

For each token t < width and query head h (KV head h // (n_heads // n_kv_heads)):

    out[t, h] = softmax_c(q[t, h] · K[c] * scale) · V[c]      over the cells t sees

*masked* sees the cells c < read_len with mask[t, c] == 1; *gathered* sees the cells
seq_cells[s, lo : p + 1] of its own sequence s at position p (lo = max(0, p - W + 1) for a
window W > 0, else 0). Everything is float32 (K/V stored as float16 are widened on load);
the softmax is online, in one pass (a running max m and sum l per query row, the
accumulator rescaled by exp(m_old - m_new) whenever m grows). A row that sees nothing
gives exactly 0. Cells a row does not see may hold NaN or inf: their K/V are never read
into a sum (loads and products are selected, never multiplied by a zero weight), the mask
is read only at rows < width and columns < read_len, and seq_cells only inside a token's
own range.

The shared tile engine (every kernel, threads of one block):

    rows   query rows of the block: tokens of the tile x query heads of one KV group
    tile   a run of cells: flags (who sees which cell) -> K/V of the needed cells into
           shared memory as float32 (zeros for the others) -> scores of the rows that see
           each cell -> per row: max, rescale, exp, sum -> acc[row, d] += p * V[c, d]
    any tile no row of the block sees is skipped whole (no K/V read).

Kernels (threads per block ATTN_THREADS on a GPU, SIM_ATTN_THREADS in the simulator):

    attend_*_decode   one token x (up to DECODE_ROWS heads of one KV group) x one split of
                      its cells per block; DECODE_TILE = 32 cells a tile; grid
                      (n_splits, n_kv_heads x head chunks, width). Writes a partial
                      (acc, m, l) per split; merge_splits combines them. Shared memory
                      ~42 KB: K/V tiles 32 x 129 / 32 x 128 float32, q and acc 8 x 128.
    attend_*_prefill  PREFILL_ROWS = 16 query rows (16 // group tokens x group heads, or
                      16 heads of one token when group >= 16) per block, every K/V tile
                      loaded once and used by all of them; PREFILL_TILE = 16 cells a tile;
                      grid (token tiles, n_kv_heads x head chunks). Shared ~34 KB. The
                      gathered one sweeps each sequence of its token tile in turn: the
                      consecutive tokens of a prefill share their sequence's cells.
    merge_splits      out[t, h, d] = sum_i e^(m_i - M) acc_i / sum_i e^(m_i - M) l_i over
                      the non-empty splits i (M their largest m); 0 when all are empty.

Shape threshold (`is_decode_shape`): the decode kernels run when width <= DECODE_MAX_WIDTH,
or, on a GPU, when the prefill grid (ceil(width / tokens per tile) x n_kv_heads x head
chunks blocks) would have fewer blocks than the GPU has multiprocessors, e.g. a batch of
64 single-token decodes at GQA 4 over 8 KV heads is 128 prefill blocks, under the 132 SMs
of an H100/H200. Such a grid leaves SMs idle while each block walks whole histories; the
decode kernels split every token's cells over n_splits blocks instead (`choose_splits`:
enough blocks for SPLIT_TARGET_BLOCKS_PER_SM per multiprocessor, at least MIN_SPLIT_CELLS
cells a split, at most MAX_SPLITS). Otherwise token tiles fill the device, and every K/V
tile load serves the 16 query rows of its block.
"""

import functools
import math

import numpy as np

from numbakv.device import IS_SIMULATOR, cuda
from numbakv.kernels import check_extent, device_function, kernel

HEAD_DIM_MAX = 128  # the largest head_dim; shared arrays are sized for it
K_STRIDE = HEAD_DIM_MAX + 1  # K and q rows padded by one word: no shared bank conflicts
DECODE_TILE = 32  # cells per K/V tile of the decode kernels
DECODE_ROWS = 8  # query heads per decode block (a GQA group of up to 8 in one block)
PREFILL_TILE = 16  # cells per K/V tile of the prefill kernels
PREFILL_ROWS = 16  # query rows (tokens x heads) per prefill block
MAX_TOKENS = PREFILL_ROWS  # tokens per block, at most (one head each)

ATTN_THREADS = 128  # threads per block on a GPU
SIM_ATTN_THREADS = 16  # threads per block in the simulator (each is a Python thread)
DECODE_MAX_WIDTH = 8  # steps up to this width run the decode (split) kernels
MIN_SPLIT_CELLS = 2 * DECODE_TILE  # a split's cells, at least (when there is more than one)
MAX_SPLITS = 32  # splits per token, at most
SPLIT_TARGET_BLOCKS_PER_SM = 4  # decode blocks wanted per multiprocessor
MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z

NEG_BIG = np.float32(-3.0e38)  # the running max before any cell: finite, so exp(m_old - m_new)
# never sees inf - inf (and the simulator never exp(-inf))
ZERO = np.float32(0.0)

STORAGE = ("float32", "float16")
_Q = "float32[:, :, ::1]"  # q and out: [>= width, n_heads, head_dim]
_PART = "float32[:, :, :, ::1], float32[:, :, ::1], float32[:, :, ::1]"  # acc, m, l
# q, k_pool, v_pool, mask, width, read_len, scale, n_splits, part_acc, part_m, part_l
MASKED_DECODE_SIGNATURES = [
    f"void({_Q}, {s}[:, :, ::1], {s}[:, :, ::1], uint8[:, ::1], int32, int32, float32, int32, "
    f"{_PART})"
    for s in STORAGE
]
# q, k_pool, v_pool, mask, width, read_len, scale, out
MASKED_PREFILL_SIGNATURES = [
    f"void({_Q}, {s}[:, :, ::1], {s}[:, :, ::1], uint8[:, ::1], int32, int32, float32, {_Q})"
    for s in STORAGE
]
_GATHER = "int32[:, ::1], int32[::1], int32[::1]"  # seq_cells, seq_ids, positions
# q, k_pool, v_pool, seq_cells, seq_ids, positions, width, window, scale, n_splits, part_*
GATHERED_DECODE_SIGNATURES = [
    f"void({_Q}, {s}[:, :, ::1], {s}[:, :, ::1], {_GATHER}, int32, int32, float32, int32, {_PART})"
    for s in STORAGE
]
# q, k_pool, v_pool, seq_cells, seq_ids, positions, width, window, scale, out
GATHERED_PREFILL_SIGNATURES = [
    f"void({_Q}, {s}[:, :, ::1], {s}[:, :, ::1], {_GATHER}, int32, int32, float32, {_Q})"
    for s in STORAGE
]
# part_acc, part_m, part_l, width, n_splits, out
MERGE_SPLITS_SIGNATURES = [f"void({_PART}, int32, int32, {_Q})"]


# -- the tile engine: device functions every attention kernel shares -------------------------
#
# rows of a block: row r is token k = r // n_hb of the block (token t = tok_t[k]) and query
# head h0 + r % n_hb; n_rows = n_tok * n_hb. Arrays suffixed _s live in shared memory.


@device_function
def _heads_of(hy, group, n_hb):
    """(KV head, first query head, heads in this chunk) of head block `hy`."""
    n_chunks = (group + n_hb - 1) // n_hb
    kv_head = hy // n_chunks
    g0 = (hy - kv_head * n_chunks) * n_hb
    return kv_head, kv_head * group + g0, min(n_hb, group - g0)


@device_function
def _start_rows(q_s, acc_s, m_s, l_s, q, tok_t_s, n_rows, n_hb, h0, head_dim):
    """Loads the rows' queries, zeroes their accumulators, m = NEG_BIG and l = 0."""
    # q: [>= width, n_heads, head_dim]  q_s: [rows, K_STRIDE]  acc_s: [rows, HEAD_DIM_MAX]
    tid, n_threads = cuda.threadIdx.x, cuda.blockDim.x
    for i in range(tid, n_rows * head_dim, n_threads):
        r = i // head_dim
        d = i - r * head_dim
        t = tok_t_s[r // n_hb]
        q_s[r, d] = q[t, h0 + r % n_hb, d] if t >= 0 else ZERO
        acc_s[r, d] = ZERO
    for r in range(tid, n_rows, n_threads):
        m_s[r] = NEG_BIG
        l_s[r] = ZERO
    cuda.syncthreads()


@device_function
def _masked_flags(ok_s, cell_s, mask, tok_t_s, n_tok, j0, j_end):
    """Flags of the tile at cell j0: ok_s[k, jj] = token k sees cell j0 + jj (its mask bit,
    read only below j_end <= read_len); cell_s[jj] = that cell if any token sees it, else -1.
    Returns whether any token sees any cell of the tile (the same in every thread)."""
    # mask: [max_width, capacity] uint8  ok_s: [tokens, tile] uint8  cell_s: [tile] int32
    tile = cell_s.shape[0]
    is_any = np.int32(0)  # an int32 predicate: what syncthreads_or takes
    for jj in range(cuda.threadIdx.x, tile, cuda.blockDim.x):
        c = j0 + jj
        is_needed = False
        for k in range(n_tok):
            t = tok_t_s[k]
            sees = c < j_end and t >= 0 and mask[t, c] != 0
            ok_s[k, jj] = 1 if sees else 0
            is_needed = is_needed or sees
        cell_s[jj] = c if is_needed else -1
        if is_needed:
            is_any = np.int32(1)
    return cuda.syncthreads_or(is_any)


@device_function
def _gathered_flags(ok_s, cell_s, seq_cells, tok_seq_s, tok_lo_s, tok_hi_s, n_tok, seq, j0, rows):
    """Flags of the tile at position j0 of sequence `seq`: ok_s[k, jj] = token k (of `seq`,
    reading positions [tok_lo_s[k], tok_hi_s[k])) sees position j0 + jj; cell_s[jj] =
    seq_cells[seq, j0 + jj] if any token sees it (read only then), else -1. A cell id outside
    [0, rows) is seen by no one. Returns whether any token sees any position of the tile."""
    # seq_cells: [max_seqs, max_seq_len] int32  ok_s: [tokens, tile] uint8
    tile = cell_s.shape[0]
    is_any = np.int32(0)  # an int32 predicate: what syncthreads_or takes
    for jj in range(cuda.threadIdx.x, tile, cuda.blockDim.x):
        j = j0 + jj
        is_needed = False
        for k in range(n_tok):
            sees = tok_seq_s[k] == seq and tok_lo_s[k] <= j and j < tok_hi_s[k]
            is_needed = is_needed or sees
        c = seq_cells[seq, j] if is_needed else -1
        if c >= rows:
            c = -1
        for k in range(n_tok):
            sees = c >= 0 and tok_seq_s[k] == seq and tok_lo_s[k] <= j and j < tok_hi_s[k]
            ok_s[k, jj] = 1 if sees else 0
        cell_s[jj] = c
        if c >= 0:
            is_any = np.int32(1)
    return cuda.syncthreads_or(is_any)


@device_function
def _tile_update(
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
def _write_rows(out, acc_s, l_s, tok_t_s, n_rows, n_hb, h0, head_dim):
    """out[t, h] = acc / l for each row of a real token, 0 where the row saw nothing."""
    # out: [>= width, n_heads, head_dim]
    for i in range(cuda.threadIdx.x, n_rows * head_dim, cuda.blockDim.x):
        r = i // head_dim
        d = i - r * head_dim
        t = tok_t_s[r // n_hb]
        if t >= 0:
            total = l_s[r]
            out[t, h0 + r % n_hb, d] = acc_s[r, d] / total if total > ZERO else ZERO
    cuda.syncthreads()


@device_function
def _write_partial(part_acc, part_m, part_l, acc_s, m_s, l_s, t, split, n_rows, h0, head_dim):
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


@device_function
def _split_range(lo, hi, split, n_splits):
    """[start, end) of split `split` of [lo, hi): n_splits near-equal parts, some maybe empty."""
    size = (hi - lo + n_splits - 1) // n_splits
    start = min(hi, lo + split * size)
    return start, min(hi, start + size)


@device_function
def _window_start(p, window):
    """The first position a token at p sees: max(0, p - window + 1), or 0 for window 0."""
    return max(0, p - window + 1) if window > 0 else 0


# -- masked ------------------------------------------------------------------------------


@kernel(MASKED_DECODE_SIGNATURES)
def attend_masked_decode(
    q, k_pool, v_pool, mask, width, read_len, scale, n_splits, part_acc, part_m, part_l
):
    """Partial masked attention of one token over one split of [0, read_len), per block."""
    # q: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
    # mask: [max_width, capacity] uint8, read at t < width, c < read_len only
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
    tok_t_s = cuda.shared.array(1, np.int32)
    head_dim = k_pool.shape[2]
    group = q.shape[1] // k_pool.shape[1]
    n_hb = min(group, DECODE_ROWS)
    n_head_blocks = k_pool.shape[1] * ((group + n_hb - 1) // n_hb)
    for t in range(cuda.blockIdx.z, width, cuda.gridDim.z):
        for hy in range(cuda.blockIdx.y, n_head_blocks, cuda.gridDim.y):
            kv_head, h0, n_rows = _heads_of(hy, group, n_hb)
            for split in range(cuda.blockIdx.x, n_splits, cuda.gridDim.x):
                start, end = _split_range(0, read_len, split, n_splits)
                if cuda.threadIdx.x == 0:
                    tok_t_s[0] = t
                cuda.syncthreads()
                _start_rows(q_s, acc_s, m_s, l_s, q, tok_t_s, n_rows, n_rows, h0, head_dim)
                for j0 in range(start, end, DECODE_TILE):
                    if _masked_flags(ok_s, cell_s, mask, tok_t_s, 1, j0, end):
                        _tile_update(
                            q_s, acc_s, k_s, v_s, s_s, ok_s, cell_s, m_s, l_s, alpha_s,
                            k_pool, v_pool, kv_head, n_rows, n_rows, head_dim, scale,
                        )  # fmt: skip
                _write_partial(
                    part_acc, part_m, part_l, acc_s, m_s, l_s, t, split, n_rows, h0, head_dim
                )


@kernel(MASKED_PREFILL_SIGNATURES)
def attend_masked_prefill(q, k_pool, v_pool, mask, width, read_len, scale, out):
    """Masked attention of a tile of tokens x heads of one KV group over [0, read_len)."""
    # q, out: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
    # mask: [max_width, capacity] uint8, read at t < width, c < read_len only
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
    tok_t_s = cuda.shared.array(MAX_TOKENS, np.int32)
    head_dim = k_pool.shape[2]
    group = q.shape[1] // k_pool.shape[1]
    n_hb = min(group, PREFILL_ROWS)
    n_tb = PREFILL_ROWS // n_hb  # tokens per block
    n_head_blocks = k_pool.shape[1] * ((group + n_hb - 1) // n_hb)
    n_token_blocks = (width + n_tb - 1) // n_tb
    for hy in range(cuda.blockIdx.y, n_head_blocks, cuda.gridDim.y):
        kv_head, h0, n_heads_here = _heads_of(hy, group, n_hb)
        for tx in range(cuda.blockIdx.x, n_token_blocks, cuda.gridDim.x):
            t0 = tx * n_tb
            n_tok = min(n_tb, width - t0)
            for k in range(cuda.threadIdx.x, n_tok, cuda.blockDim.x):
                tok_t_s[k] = t0 + k
            cuda.syncthreads()
            n_rows = n_tok * n_heads_here
            _start_rows(q_s, acc_s, m_s, l_s, q, tok_t_s, n_rows, n_heads_here, h0, head_dim)
            for j0 in range(0, read_len, PREFILL_TILE):
                if _masked_flags(ok_s, cell_s, mask, tok_t_s, n_tok, j0, read_len):
                    _tile_update(
                        q_s, acc_s, k_s, v_s, s_s, ok_s, cell_s, m_s, l_s, alpha_s,
                        k_pool, v_pool, kv_head, n_rows, n_heads_here, head_dim, scale,
                    )  # fmt: skip
            _write_rows(out, acc_s, l_s, tok_t_s, n_rows, n_heads_here, h0, head_dim)


# -- gathered ----------------------------------------------------------------------------


@kernel(GATHERED_DECODE_SIGNATURES)
def attend_gathered_decode(
    q, k_pool, v_pool, seq_cells, seq_ids, positions, width, window, scale, n_splits,
    part_acc, part_m, part_l,
):  # fmt: skip
    """Partial attention of one token over one split of its own cells, per block."""
    # q: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
    # seq_cells: [max_seqs, max_seq_len] int32  seq_ids, positions: [>= width] int32
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
    tok_t_s = cuda.shared.array(1, np.int32)
    tok_seq_s = cuda.shared.array(1, np.int32)
    tok_lo_s = cuda.shared.array(1, np.int32)
    tok_hi_s = cuda.shared.array(1, np.int32)
    head_dim = k_pool.shape[2]
    group = q.shape[1] // k_pool.shape[1]
    n_hb = min(group, DECODE_ROWS)
    n_head_blocks = k_pool.shape[1] * ((group + n_hb - 1) // n_hb)
    for t in range(cuda.blockIdx.z, width, cuda.gridDim.z):
        seq = seq_ids[t]
        p = positions[t]
        lo = _window_start(p, window)
        hi = p + 1
        if seq < 0:  # padding: an empty range, output 0
            lo = hi
        for hy in range(cuda.blockIdx.y, n_head_blocks, cuda.gridDim.y):
            kv_head, h0, n_rows = _heads_of(hy, group, n_hb)
            for split in range(cuda.blockIdx.x, n_splits, cuda.gridDim.x):
                start, end = _split_range(lo, hi, split, n_splits)
                if cuda.threadIdx.x == 0:
                    tok_t_s[0] = t
                    tok_seq_s[0] = seq
                    tok_lo_s[0] = start
                    tok_hi_s[0] = end
                cuda.syncthreads()
                _start_rows(q_s, acc_s, m_s, l_s, q, tok_t_s, n_rows, n_rows, h0, head_dim)
                for j0 in range(start, end, DECODE_TILE):
                    if _gathered_flags(
                        ok_s, cell_s, seq_cells, tok_seq_s, tok_lo_s, tok_hi_s, 1, seq, j0,
                        k_pool.shape[0],
                    ):  # fmt: skip
                        _tile_update(
                            q_s, acc_s, k_s, v_s, s_s, ok_s, cell_s, m_s, l_s, alpha_s,
                            k_pool, v_pool, kv_head, n_rows, n_rows, head_dim, scale,
                        )  # fmt: skip
                _write_partial(
                    part_acc, part_m, part_l, acc_s, m_s, l_s, t, split, n_rows, h0, head_dim
                )


@kernel(GATHERED_PREFILL_SIGNATURES)
def attend_gathered_prefill(
    q, k_pool, v_pool, seq_cells, seq_ids, positions, width, window, scale, out
):
    """Attention of a tile of tokens x heads over their own cells, one sequence sweep at a time."""
    # q, out: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, head_dim]
    # seq_cells: [max_seqs, max_seq_len] int32  seq_ids, positions: [>= width] int32
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
    tok_t_s = cuda.shared.array(MAX_TOKENS, np.int32)
    tok_seq_s = cuda.shared.array(MAX_TOKENS, np.int32)
    tok_lo_s = cuda.shared.array(MAX_TOKENS, np.int32)
    tok_hi_s = cuda.shared.array(MAX_TOKENS, np.int32)
    is_todo_s = cuda.shared.array(MAX_TOKENS, np.uint8)
    sweep_s = cuda.shared.array(3, np.int32)  # sequence, first and end position of a sweep
    head_dim = k_pool.shape[2]
    group = q.shape[1] // k_pool.shape[1]
    n_hb = min(group, PREFILL_ROWS)
    n_tb = PREFILL_ROWS // n_hb  # tokens per block
    n_head_blocks = k_pool.shape[1] * ((group + n_hb - 1) // n_hb)
    n_token_blocks = (width + n_tb - 1) // n_tb
    tid = cuda.threadIdx.x
    for hy in range(cuda.blockIdx.y, n_head_blocks, cuda.gridDim.y):
        kv_head, h0, n_heads_here = _heads_of(hy, group, n_hb)
        for tx in range(cuda.blockIdx.x, n_token_blocks, cuda.gridDim.x):
            t0 = tx * n_tb
            n_tok = min(n_tb, width - t0)
            for k in range(tid, n_tok, cuda.blockDim.x):
                seq = seq_ids[t0 + k]
                p = positions[t0 + k]
                tok_t_s[k] = t0 + k
                tok_seq_s[k] = seq
                tok_lo_s[k] = _window_start(p, window)
                tok_hi_s[k] = p + 1
                is_todo_s[k] = 1 if seq >= 0 else 0  # padding: never swept, output 0
            cuda.syncthreads()
            n_rows = n_tok * n_heads_here
            _start_rows(q_s, acc_s, m_s, l_s, q, tok_t_s, n_rows, n_heads_here, h0, head_dim)
            while True:  # one sweep per sequence of the tile, over the union of its ranges
                if tid == 0:
                    seq, lo, hi = -1, 0, 0
                    for k in range(n_tok):
                        if is_todo_s[k] != 0 and (seq < 0 or tok_seq_s[k] == seq):
                            if seq < 0:
                                seq, lo, hi = tok_seq_s[k], tok_lo_s[k], tok_hi_s[k]
                            lo = min(lo, tok_lo_s[k])
                            hi = max(hi, tok_hi_s[k])
                            is_todo_s[k] = 0
                    sweep_s[0] = seq
                    sweep_s[1] = lo
                    sweep_s[2] = hi
                cuda.syncthreads()
                seq, lo, hi = sweep_s[0], sweep_s[1], sweep_s[2]
                cuda.syncthreads()  # all have read the sweep before thread 0 writes the next
                if seq < 0:
                    break
                for j0 in range(lo, hi, PREFILL_TILE):
                    if _gathered_flags(
                        ok_s, cell_s, seq_cells, tok_seq_s, tok_lo_s, tok_hi_s, n_tok, seq, j0,
                        k_pool.shape[0],
                    ):  # fmt: skip
                        _tile_update(
                            q_s, acc_s, k_s, v_s, s_s, ok_s, cell_s, m_s, l_s, alpha_s,
                            k_pool, v_pool, kv_head, n_rows, n_heads_here, head_dim, scale,
                        )  # fmt: skip
            _write_rows(out, acc_s, l_s, tok_t_s, n_rows, n_heads_here, h0, head_dim)


# -- merge -------------------------------------------------------------------------------


@kernel(MERGE_SPLITS_SIGNATURES)
def merge_splits(part_acc, part_m, part_l, width, n_splits, out):
    """out[t, h] = the splits' partials combined: sum e^(m_i-M) acc_i / sum e^(m_i-M) l_i, or 0."""
    # part_acc: [>= width, n_heads, >= n_splits, head_dim]
    # part_m, part_l: [>= width, n_heads, >= n_splits]
    # out: [>= width, n_heads, head_dim]; one item per (t, h, d), d fastest
    n_heads, head_dim = out.shape[1], out.shape[2]
    row = n_heads * head_dim
    for i in range(cuda.grid(1), width * row, cuda.gridsize(1)):
        t = i // row
        h = (i - t * row) // head_dim
        d = i - t * row - h * head_dim
        m_max = NEG_BIG
        for split in range(n_splits):
            if part_l[t, h, split] > ZERO:
                m_max = max(m_max, part_m[t, h, split])
        numerator = ZERO
        denominator = ZERO
        for split in range(n_splits):
            total = part_l[t, h, split]
            if total > ZERO:  # select: an empty split's acc is never read
                weight = math.exp(part_m[t, h, split] - m_max)  # <= 0, finite
                numerator += weight * part_acc[t, h, split, d]
                denominator += weight * total
        out[t, h, d] = numerator / denominator if denominator > ZERO else ZERO


# -- launchers ---------------------------------------------------------------------------


@functools.cache
def _n_sms() -> int:
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def choose_splits(max_len: int, n_blocks: int) -> int:
    """Splits per token for the decode kernels: enough blocks for SPLIT_TARGET_BLOCKS_PER_SM
    per multiprocessor (the simulator counts as one), each split at least MIN_SPLIT_CELLS
    cells, at most MAX_SPLITS.

    max_len  : the most cells a token reads (read_len, or the longest gathered range)
    n_blocks : blocks before splitting (width x KV heads x head chunks)
    """
    n_sms = 1 if IS_SIMULATOR else _n_sms()
    by_len = max(1, max_len // MIN_SPLIT_CELLS)
    wanted = -(-SPLIT_TARGET_BLOCKS_PER_SM * n_sms // max(1, n_blocks))
    return max(1, min(MAX_SPLITS, by_len, wanted))


def is_decode_shape(width: int, n_heads: int, n_kv_heads: int) -> bool:
    """True when a step of `width` tokens runs the decode (split) kernels: width <=
    DECODE_MAX_WIDTH or, on a GPU, a prefill grid smaller than the multiprocessor count."""
    if width <= DECODE_MAX_WIDTH:
        return True
    if IS_SIMULATOR:
        return False
    token_blocks, head_blocks = _prefill_grid(width, n_heads, n_kv_heads)
    return token_blocks * head_blocks < _n_sms()


def _prefill_grid(width: int, n_heads: int, n_kv_heads: int) -> tuple[int, int]:
    """(token blocks, head blocks) of a prefill launch, before any cap."""
    tokens_per_block = PREFILL_ROWS // min(n_heads // n_kv_heads, PREFILL_ROWS)
    return -(-width // tokens_per_block), _head_blocks(n_heads, n_kv_heads, PREFILL_ROWS)


def split_workspace(max_width: int, n_heads: int, head_dim: int, max_splits: int = MAX_SPLITS):
    """Device scratch for the decode kernels' partials, to allocate once and pass to every
    decode launch of up to `max_width` tokens: (part_acc [max_width, n_heads, max_splits,
    head_dim], part_m and part_l [max_width, n_heads, max_splits]), float32. Launches in
    flight together on different streams each need their own."""
    return (
        cuda.device_array((max_width, n_heads, max_splits, head_dim), np.float32),
        cuda.device_array((max_width, n_heads, max_splits), np.float32),
        cuda.device_array((max_width, n_heads, max_splits), np.float32),
    )


def _threads() -> int:
    return SIM_ATTN_THREADS if IS_SIMULATOR else ATTN_THREADS


def _grid(*sizes: int) -> tuple[int, ...]:
    """A grid covering `sizes` (x, y, z) blocks: each capped by CUDA's limits on a GPU, at 2
    in the simulator (the kernels grid-stride over the rest)."""
    if IS_SIMULATOR:
        return tuple(min(2, max(1, n)) for n in sizes)
    x, *rest = sizes
    return (max(1, min(x, 2**31 - 1)), *(max(1, min(n, MAX_GRID_YZ)) for n in rest))


def _head_blocks(n_heads: int, n_kv_heads: int, rows: int) -> int:
    """Head blocks of a grid: KV heads x chunks of at most `rows` heads of one group."""
    group = n_heads // n_kv_heads
    return n_kv_heads * -(-group // min(group, rows))


def _check_shapes(q, k_pool, v_pool, out) -> None:
    """Raises ValueError unless q, the pools and out fit together and the kernels."""
    if q.ndim != 3 or k_pool.ndim != 3 or out.ndim != 3 or k_pool.shape != v_pool.shape:
        raise ValueError(
            f"q {q.shape}, out {out.shape}: [width, n_heads, head_dim]; k_pool {k_pool.shape} "
            f"and v_pool {v_pool.shape}: the same [rows, n_kv_heads, head_dim]"
        )
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv_heads = k_pool.shape[1]
    if head_dim > HEAD_DIM_MAX or head_dim < 1:
        raise ValueError(f"head_dim={head_dim} is outside [1, {HEAD_DIM_MAX}] the kernels hold")
    if k_pool.shape[2] != head_dim or out.shape[1:] != q.shape[1:]:
        raise ValueError(
            f"q {q.shape}, out {out.shape} and k_pool {k_pool.shape} disagree on heads or head_dim"
        )
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    if np.dtype(q.dtype) != np.float32 or np.dtype(out.dtype) != np.float32:
        raise ValueError(f"q and out must be float32, got {q.dtype} and {out.dtype}")
    if np.dtype(k_pool.dtype).name not in STORAGE or k_pool.dtype != v_pool.dtype:
        raise ValueError(f"k_pool/v_pool dtype {k_pool.dtype}/{v_pool.dtype}: one of {STORAGE}")


def _pick(kernel_name: str | None, width: int, q, k_pool) -> bool:
    """True for the decode kernels: forced by kernel_name, else by the step's shape."""
    if kernel_name is None:
        return is_decode_shape(width, q.shape[1], k_pool.shape[1])
    if kernel_name not in ("decode", "prefill"):
        raise ValueError(f"kernel={kernel_name!r} is not 'decode', 'prefill' or None")
    return kernel_name == "decode"


def _partials(workspace, width: int, n_heads: int, head_dim: int, n_splits: int, stream):
    """The decode scratch: `workspace` checked (n_splits clamped to it), or a fresh one."""
    if workspace is None:
        shape = (width, n_heads, n_splits)
        return (
            cuda.device_array((*shape, head_dim), np.float32, stream=stream),
            cuda.device_array(shape, np.float32, stream=stream),
            cuda.device_array(shape, np.float32, stream=stream),
        ), n_splits
    part_acc, part_m, part_l = workspace
    if (
        part_acc.shape[0] < width
        or part_acc.shape[1] != n_heads
        or part_acc.shape[3] < head_dim
        or part_m.shape != part_acc.shape[:3]
        or part_l.shape != part_acc.shape[:3]
    ):
        raise ValueError(
            f"workspace {part_acc.shape} cannot hold width={width}, n_heads={n_heads}, "
            f"head_dim={head_dim}; make one with split_workspace()"
        )
    return workspace, min(n_splits, part_acc.shape[2])


def _merge(partials, width: int, n_splits: int, out, stream) -> None:
    n_items = width * out.shape[1] * out.shape[2]
    if IS_SIMULATOR:
        grid, threads = 1, min(SIM_ATTN_THREADS, n_items)
    else:
        threads = ATTN_THREADS
        grid = max(1, min(-(-n_items // threads), 8 * _n_sms()))
    merge_splits[grid, threads, stream](*partials, np.int32(width), np.int32(n_splits), out)


def launch_attend_masked(
    q, k_pool, v_pool, mask, width: int, read_len: int, scale, out, stream=0, *,
    kernel: str | None = None, n_splits: int | None = None, workspace=None,
) -> None:  # fmt: skip
    """out[t, h] = softmax over the cells mask[t] allows of q[t, h]·K·scale, applied to V.

    q              : device array, shape [>= width, n_heads, head_dim], float32
    k_pool, v_pool : device array, shape [rows >= read_len, n_kv_heads, head_dim], float32
                     or float16; query head h reads KV head h // (n_heads // n_kv_heads)
    mask           : device array, shape [max_width, capacity], uint8, 1 = attend; read at
                     rows < width and columns < read_len only
    width          : tokens of the step; read_len: cells [0, read_len) are swept
    scale          : the score scale (cast to float32)
    out            : device array, shape [>= width, n_heads, head_dim], float32; rows
                     [0, width) written (0 where a token sees no cell), the rest untouched
    kernel         : None (by the step's shape), "decode" or "prefill": forces one
    n_splits       : decode splits per token (default `choose_splits`)
    workspace      : `split_workspace(...)` scratch for the decode partials (default: a
                     fresh allocation per decode launch)
    head_dim <= 128 and n_heads a multiple of n_kv_heads, else ValueError.
    """
    _check_shapes(q, k_pool, v_pool, out)
    check_extent("width", width, len(q), len(out), mask.shape[0])
    check_extent("read_len", read_len, mask.shape[1], k_pool.shape[0])
    if width == 0:
        return
    scale = np.float32(scale)
    n_heads, head_dim = q.shape[1], q.shape[2]
    if not _pick(kernel, width, q, k_pool):
        grid = _grid(*_prefill_grid(width, n_heads, k_pool.shape[1]))
        attend_masked_prefill[grid, _threads(), stream](
            q, k_pool, v_pool, mask, np.int32(width), np.int32(read_len), scale, out
        )
        return
    n_head_blocks = _head_blocks(n_heads, k_pool.shape[1], DECODE_ROWS)
    n_splits = n_splits or choose_splits(read_len, width * n_head_blocks)
    partials, n_splits = _partials(workspace, width, n_heads, head_dim, n_splits, stream)
    attend_masked_decode[_grid(n_splits, n_head_blocks, width), _threads(), stream](
        q, k_pool, v_pool, mask, np.int32(width), np.int32(read_len), scale,
        np.int32(n_splits), *partials,
    )  # fmt: skip
    _merge(partials, width, n_splits, out, stream)


def launch_attend_gathered(
    q, k_pool, v_pool, seq_cells, seq_ids, positions, width: int, window: int, scale, out,
    stream=0, *, kernel: str | None = None, n_splits: int | None = None, workspace=None,
    max_len: int | None = None,
) -> None:  # fmt: skip
    """out[t, h] = softmax over the token's own cells of q[t, h]·K·scale, applied to V.

    Token t of sequence s = seq_ids[t] at position p = positions[t] reads exactly the cells
    seq_cells[s, lo : p + 1], lo = max(0, p - window + 1) if window > 0 else 0.

    q              : device array, shape [>= width, n_heads, head_dim], float32
    k_pool, v_pool : device array, shape [rows, n_kv_heads, head_dim], float32 or float16
    seq_cells      : device array, shape [max_seqs, max_seq_len], int32: row s holds
                     sequence s's cells by position; read inside each token's range only
    seq_ids        : device array, shape [>= width], int32, -1 = padding (output 0)
    positions      : device array, shape [>= width], int32, each < max_seq_len
    width          : tokens of the step; window: 0 = global, W > 0
    scale          : the score scale (cast to float32)
    out            : device array, shape [>= width, n_heads, head_dim], float32; rows
                     [0, width) written, the rest untouched
    kernel, n_splits, workspace : as in `launch_attend_masked`
    max_len        : the longest range a token reads, for choosing splits (default the
                     window, or max_seq_len for global attention)
    head_dim <= 128 and n_heads a multiple of n_kv_heads, else ValueError.
    """
    _check_shapes(q, k_pool, v_pool, out)
    check_extent("width", width, len(q), len(out), len(seq_ids), len(positions))
    if window < 0:
        raise ValueError(f"window={window} must be 0 (global) or positive")
    if width == 0:
        return
    scale = np.float32(scale)
    n_heads, head_dim = q.shape[1], q.shape[2]
    if not _pick(kernel, width, q, k_pool):
        grid = _grid(*_prefill_grid(width, n_heads, k_pool.shape[1]))
        attend_gathered_prefill[grid, _threads(), stream](
            q, k_pool, v_pool, seq_cells, seq_ids, positions, np.int32(width),
            np.int32(window), scale, out,
        )  # fmt: skip
        return
    if max_len is None:
        max_len = min(window, seq_cells.shape[1]) if window > 0 else seq_cells.shape[1]
    n_head_blocks = _head_blocks(n_heads, k_pool.shape[1], DECODE_ROWS)
    n_splits = n_splits or choose_splits(max_len, width * n_head_blocks)
    partials, n_splits = _partials(workspace, width, n_heads, head_dim, n_splits, stream)
    attend_gathered_decode[_grid(n_splits, n_head_blocks, width), _threads(), stream](
        q, k_pool, v_pool, seq_cells, seq_ids, positions, np.int32(width), np.int32(window),
        scale, np.int32(n_splits), *partials,
    )  # fmt: skip
    _merge(partials, width, n_splits, out, stream)
