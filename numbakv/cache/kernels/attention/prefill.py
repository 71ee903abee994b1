"""The prefill-shaped attention kernels: FlashAttention-2 on CUDA cores, a register tile a thread.

Grid (token blocks, head blocks), walked as one flat grid-stride loop: a block takes
PREFILL_ROWS query rows (PREFILL_ROWS // group tokens x group heads, or PREFILL_ROWS heads
of one token when group >= PREFILL_ROWS) of one KV group, stages their queries in shared
memory once, and sweeps K/V tiles of PREFILL_TILE cells, each loaded once for all of its
rows. It sweeps one key at a time over the union of its tokens' ranges (`next_sweep`): the
consecutive tokens of a prefill share their sequence's cells (gathered), and every token of
a masked view sweeps [0, read_len) as one key. A tile, between three barriers (`tiles`):
which tokens see each sweep index, as bits (`views`; a tile no token sees is skipped) ->
K/V staged as float32 by 16-byte loads (`staging`, `lanes`) -> each thread's 4 rows x
THREAD_CELLS scores from shared memory -> its rows' online softmax (max and sum over the row
group's lanes by shuffles) -> its 4 rows x `Layout.dims` accumulators += p V. A row group
whose rows see no cell of the tile skips both products. The kernel is made per view,
storage kinds, q and out kinds and head_dim, a compile-time constant: the products take 16
columns or 4 cells a step, written out, as 16-byte shared loads and FFMAs. Shared memory at
head_dim 128: 36.6 KB; 166 registers (launch bounds of 3 blocks: 12 warps per SM).
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import device_function, kernel, storage
from numbakv.cache.kernels.attention import lanes, staging, tiles, views
from numbakv.cache.kernels.attention.tiles import (
    ALIGN,
    EMPTY,
    HI,
    KEY,
    LO,
    LOG2E,
    NEG_INF,
    PREFILL_ROWS,
    PREFILL_TILE,
    ROW_LANES,
    THREAD_CELLS,
    THREAD_ROWS,
    THREADS,
    TOKEN_ROWS,
    VIS,
    ZERO,
    T,
    index,
)
from numbakv.cache.kernels.placement import KV_SCALES, PAIRS, io_name, kind_name
from numbakv.cache.kernels.step_buffer import SCALARS, STEP, WIDTH

BLOCKS_PER_SM = 3  # resident blocks asked of the compiler: 12 warps, at most 168 registers
QUANTIZED = ("q8_0", "q4_0", "fp8_e4m3")  # kinds whose lane loads come with a scale


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
        key, lo, hi = np.int32(-1), np.int32(0), np.int32(0)
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


def make_prefill(views_of_mode, lay: tiles.Layout, k_loader, v_loader, scaled, q_code, out_code):
    """The prefill kernel over a mode's view (`views.PREFILL_VIEWS`: token, flags,
    tile_cell), for the `lanes` loaders of its K and V pools (`scaled`: whether their
    values take their scale), q and out of codes q_code and out_code and the head_dim of
    `lay` (`tiles.layout`)."""
    token, flags, tile_cell = views_of_mode
    stage_q = staging.make_stage_q(lay, q_code)
    stage_kv = staging.make_stage_kv(lay, k_loader, v_loader, scaled, tile_cell)
    scores = tiles.make_scores(lay)
    softmax = tiles.make_softmax(lay)
    accumulate = tiles.make_accumulate(lay)
    write_rows = staging.make_write_rows(lay, out_code)
    q_words, k_words, v_words, p_words = lay.words
    dims = lay.dims
    lanes_n, rows_n, tile_n = np.int32(ROW_LANES), np.int32(PREFILL_ROWS), np.int32(PREFILL_TILE)
    threads = np.int32(THREADS)

    def attend_prefill(q, k_pool, v_pool, kv_scales, step, view, scale, out):
        """Attention of a tile of tokens x heads of one KV group over the cells they see."""
        # q, out: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, row_width]
        q_s = cuda.shared.array(q_words, np.float32, alignment=ALIGN)
        k_s = cuda.shared.array(k_words, np.float32, alignment=ALIGN)
        v_s = cuda.shared.array(v_words, np.float32, alignment=ALIGN)
        p_s = cuda.shared.array(p_words, np.float32, alignment=ALIGN)
        # bits of the tokens that see jj of a tile: rows 0 and 1 sweep index jj, of a tile
        # and the next (a tile's flags are written while a slow thread may still read the
        # previous tile's), row VIS cell jj (0 where its id is outside the pool)
        flags_s = cuda.shared.array((3, PREFILL_TILE), np.uint32, alignment=ALIGN)
        bad_s = cuda.shared.array(1, np.int32)  # 1: the tile's V holds a NaN or an inf
        tok_s = cuda.shared.array((TOKEN_ROWS, PREFILL_ROWS), np.int32)
        is_todo_s = cuda.shared.array(PREFILL_ROWS, np.uint8)
        sweep_s = cuda.shared.array(3, np.int32)  # key, first and end index of a sweep
        s = cuda.local.array((THREAD_ROWS, THREAD_CELLS), np.float32)
        acc = cuda.local.array((THREAD_ROWS, dims), np.float32)
        m = cuda.local.array(THREAD_ROWS, np.float32)
        total = cuda.local.array(THREAD_ROWS, np.float32)
        st = cuda.local.array((3, THREAD_ROWS), np.float32)
        rowbit = cuda.local.array(THREAD_ROWS, np.uint32)  # bit of each row's token
        tid = np.int32(cuda.threadIdx.x)
        tx = tid & np.int32(ROW_LANES - 1)  # this thread's lane in its row group ...
        r0 = np.int32(staging.quotient(tid, lanes_n) * np.int32(THREAD_ROWS))  # ... its first row
        flag_cell = tid & np.int32(PREFILL_TILE - 1)  # the sweep index this thread flags ...
        flag_first = staging.quotient(tid, tile_n)  # ... for tokens flag_first + FLAG_STRIDE k
        if tid < tile_n:
            flags_s[0, tid] = np.uint32(0)
            flags_s[1, tid] = np.uint32(0)
        if tid == 0:
            bad_s[0] = np.int32(0)
        for i in range(tid, np.int32(k_words), threads):  # columns past head_dim stay 0
            k_s[index(i)] = ZERO
        for i in range(tid, np.int32(v_words), threads):
            v_s[index(i)] = ZERO
        scale2 = scale * LOG2E  # scores in base 2: exp2 is one instruction
        rows = np.int32(k_pool.shape[0])
        n_kv = np.int32(k_pool.shape[1])
        group = staging.quotient(np.int32(q.shape[1]), n_kv)
        n_hb = min(group, rows_n)
        n_tb = staging.quotient(rows_n, n_hb)  # tokens per block
        n_chunks = staging.quotient(group + n_hb - np.int32(1), n_hb)
        q_head = staging.quotient(np.int32(q.strides[1]), np.int32(q.itemsize))  # elements
        out_head = staging.quotient(np.int32(out.strides[1]), np.int32(out.itemsize))
        k_head = staging.quotient(np.int32(k_pool.strides[1]), np.int32(k_pool.itemsize))
        v_head = staging.quotient(np.int32(v_pool.strides[1]), np.int32(v_pool.itemsize))
        width = min(step[SCALARS, WIDTH], np.int32(q.shape[0]), np.int32(out.shape[0]))
        n_token_blocks = staging.quotient(width + n_tb - np.int32(1), n_tb)
        n_items = np.int32(n_kv * n_chunks * n_token_blocks)
        first = np.int32(cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x)
        # one flat grid-stride loop over (head block, token block), token blocks adjacent (the
        # blocks running together read the same KV head's cells): one counter, no spills
        for item in range(first, n_items, np.int32(cuda.gridDim.x * cuda.gridDim.y)):
            hy = staging.quotient(item, n_token_blocks)
            t0 = np.int32((item - hy * n_token_blocks) * n_tb)
            kv_head = staging.quotient(hy, n_chunks)
            g0 = np.int32((hy - kv_head * n_chunks) * n_hb)
            h0 = np.int32(kv_head * group + g0)
            n_here = min(n_hb, np.int32(group - g0))  # heads of this chunk: rows per token
            k_scale, v_scale = kv_scales[0, kv_head], kv_scales[1, kv_head]
            k_at, v_at = np.int32(kv_head * k_head), np.int32(kv_head * v_head)
            n_tok = min(n_tb, np.int32(width - t0))
            n_rows = np.int32(n_tok * n_here)
            cuda.syncthreads()  # the previous item's rows are written, its table read
            for k in range(tid, n_tok, threads):
                key, lo, hi = token(view, step, t0 + k)
                tok_s[T, k] = t0 + k
                tok_s[KEY, k] = key
                tok_s[LO, k] = lo
                tok_s[HI, k] = hi
                is_todo_s[k] = 1 if lo < hi else 0  # a token that sees nothing gives 0
            cuda.syncthreads()
            stage_q(q_s, q, tok_s, n_rows, n_here, h0, q_head, tid)
            group_bits = np.uint32(0)  # the tokens of this thread's rows
            for i in range(THREAD_ROWS):
                r = np.int32(r0 + i)
                rowbit[i] = np.uint32(0)
                if r < n_rows:
                    rowbit[i] = np.uint32(np.uint32(1) << np.uint32(staging.quotient(r, n_here)))
                group_bits = np.uint32(group_bits | rowbit[i])
                m[i] = NEG_INF
                total[i] = EMPTY
                for e in range(dims):
                    acc[i, e] = ZERO
            key, lo, hi = next_sweep(tok_s, is_todo_s, sweep_s, n_tok)
            parity = np.int32(0)
            while key >= 0:
                for j0 in range(lo, hi, tile_n):
                    parity = np.int32(1) - parity
                    j = np.int32(j0 + flag_cell)
                    bits = flags(view, tok_s, flag_first, n_tok, key, j, rows)
                    if bits != 0:  # the threads of a sweep index meet in its word
                        cuda.atomic.or_(flags_s, (parity, flag_cell), bits)
                    # three plain barriers a tile (the simulator's syncthreads_or is slow)
                    cuda.syncthreads()
                    if staging.tile_tokens(flags_s, parity) != 0:  # the same in every thread
                        bad = stage_kv(k_s, v_s, flags_s, parity, k_pool, v_pool, view, key,
                                       j0, rows, k_at, v_at, k_scale, v_scale, tid)  # fmt: skip
                        if bad != 0:
                            bad_s[0] = bad
                        cuda.syncthreads()
                        is_finite = bad_s[0] == 0
                        if tid < tile_n:  # THREADS >= PREFILL_TILE
                            flags_s[parity, tid] = np.uint32(0)  # for the tile after next
                        tile_bits = staging.tile_tokens(flags_s, VIS)
                        # a row group none of whose rows sees a cell of the tile skips its
                        # products: its state does not change (the softmax, whose shuffles
                        # every lane meets, leaves it as it was)
                        is_active = (tile_bits & group_bits) != 0
                        if is_active:
                            scores(q_s, k_s, s, flags_s, group_bits, r0, tx)
                        softmax(s, m, total, acc, st, p_s, flags_s, rowbit, tile_bits, r0, tx,
                                scale2)  # fmt: skip
                        cuda.syncthreads()
                        if tid == 0:
                            bad_s[0] = np.int32(0)  # every thread has read it
                        if is_active:
                            accumulate(acc, p_s, v_s, flags_s, rowbit, group_bits, r0, tx,
                                       is_finite)  # fmt: skip
                key, lo, hi = next_sweep(tok_s, is_todo_s, sweep_s, n_tok)
            write_rows(out, acc, m, total, tok_s, r0, tx, n_rows, n_here, h0, out_head)

    return attend_prefill


_built: dict = {}


def KERNELS(mode: str, k_kind: str, v_kind: str, q_kind: str = "float", out_kind: str = "float",
            head_dim: int = 128, is_wide: bool = True):  # fmt: skip
    """The prefill kernel of `mode` ("masked" or "gathered") over pools of (k_kind, v_kind)
    for q and out of (q_kind, out_kind) (`storage.IO_KINDS`) and `head_dim` (1 to
    HEAD_DIM_MAX), with wide loads (`lanes.is_wide`) or element loads; made and registered
    on first use, as attend_{mode}_prefill{kinds}{io}_d{head_dim}[_narrow]."""
    key = (mode, k_kind, v_kind, q_kind, out_kind, head_dim, is_wide)
    if key not in _built:
        view, *of_mode = views.PREFILL_VIEWS[mode]
        name = (f"attend_{mode}_prefill{kind_name(k_kind, v_kind)}{io_name(q_kind, out_kind)}"
                f"_d{head_dim}{'' if is_wide else '_narrow'}")  # fmt: skip
        _, sigs = tiles.kernel_signatures(signatures, view, k_kind, v_kind, q_kind, out_kind)
        scaled = (is_wide and k_kind in QUANTIZED, is_wide and v_kind in QUANTIZED)
        body = make_prefill(
            of_mode, tiles.layout(head_dim), lanes.make_loader(k_kind, head_dim, is_wide),
            lanes.make_loader(v_kind, head_dim, is_wide), scaled, storage.IO_KINDS[q_kind][0],
            storage.IO_KINDS[out_kind][0],
        )  # fmt: skip
        _built[key] = kernel(sigs, name=name, launch_bounds=(THREADS, BLOCKS_PER_SM))(body)
    return _built[key]


# made at import, so that the suite compiles them to PTX: every kind (as K and V) in both
# modes at head_dim 128, bfloat16 q and out, and the element loads (head_dim 40)
for _mode in views.PREFILL_VIEWS:
    for _pair in PAIRS:
        KERNELS(_mode, *_pair)
KERNELS("gathered", "float", "float", "bfloat16", "bfloat16")
KERNELS("gathered", "float", "float", head_dim=40, is_wide=False)
