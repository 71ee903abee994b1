"""Placement (docs/contract.md §2, §8): a step's K/V rows into their cells, and its tokens
into the table mirror and the position -> cell table, in one preparation launch.

Both kernels read the step buffer (`step_buffer`: the tokens' cells, positions and sequences,
and the width) and act on rows t < width whose cell is placed (`cells[t] >= 0`); padded
rows (cell -1) are skipped, and nothing else is read or written.
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import device_function, kernel, owner_bit
from numbakv.cache.kernels.launch import check_extent, launch, launch_dims
from numbakv.cache.kernels.quant import (
    BFLOAT16,
    BLOCK,
    FLOAT,
    Q4_0,
    Q8_0,
    e4m3_bits,
    store_q4_0,
    store_q8_0,
    widen_bfloat16,
)
from numbakv.cache.kernels.step_buffer import CELLS, POSITIONS, SCALARS, SEQ_IDS, STEP, WIDTH
from numbakv.cache.kernels.storage import (
    IO_KINDS,
    KINDS,
    io_kind,
    kind_of_dtype,
    narrow_bfloat16,
    pool_dtypes,
    unit_scales,
)

KV_SCALES = "float32[:, ::1]"  # [2 (K, V), n_kv_heads]: fp8 scales of the layer
# (K kind, V kind) pairs made at import, which the suite compiles to PTX: each kind as K and as
# V (the K and the V code of a kernel are independent branches, so a mixed pair, made on
# first use, compiles what these do)
PAIRS = tuple((k, k) for k in KINDS)
# ... and the one scatter of bfloat16 inputs made at import (its read is one branch of every
# store: float pools stand for the others)
BFLOAT16_INPUT = ("float", "float", "bfloat16")


def scatter_signatures(k_kind: str, v_kind: str, in_kind: str = "float") -> list[str]:
    """Every (input dtype, K pool dtype, V pool dtype): k, v, k_pool, v_pool, kv_scales, step;
    float32 pools only for bfloat16 inputs (`BFLOAT16_INPUT`)."""
    pools = pool_dtypes(k_kind, v_kind)
    return [
        f"void({x}[:, :, ::1], {x}[:, :, ::1], {ks}[:, :, ::1], {vs}[:, :, ::1], {KV_SCALES}, "
        f"{STEP})"
        for x in IO_KINDS[in_kind][1]
        for ks, vs in (pools if in_kind == "float" else pools[:1])
    ]


# step, cell_pos, cell_owners, seq_cells, seq_len
PREPARE_TOKENS_SIGNATURES = [f"void({STEP}, int32[::1], uint64[:, ::1], int32[:, ::1], int32[::1])"]


def make_store(kind: str, in_kind: str):
    """The device function that stores one of K or V of the step (of `in_kind`,
    `storage.IO_KINDS`) in pool format `kind`, over the whole grid: per (t, h, d) for element
    formats, per (t, h, block) for q8_0 and q4_0 (a block's scale needs its 32 values).
    Closure constants pick the branches."""
    code, in_code = KINDS[kind][0], IO_KINDS[in_kind][0]
    is_blocked = code in (Q8_0, Q4_0)

    def store(src, pool, scales, which, step, width):
        # src: [>= width, n_kv_heads, head_dim]  pool: [rows, n_kv_heads, row_width]
        # scales: [2, n_kv_heads] float32 (fp8 only)
        n_kv_heads, head_dim = src.shape[1], src.shape[2]
        per_head = head_dim // BLOCK if is_blocked else head_dim
        row = n_kv_heads * per_head
        for i in range(cuda.grid(1), width * row, cuda.gridsize(1)):
            t = i // row
            cell = step[CELLS, t]
            if cell >= 0:
                j = i - t * row
                h = j // per_head
                d = j - h * per_head
                if code == Q8_0:
                    store_q8_0(src, pool, t, cell, h, d, in_code)
                elif code == Q4_0:
                    store_q4_0(src, pool, t, cell, h, d, in_code)
                else:
                    x = src[t, h, d] if in_code == FLOAT else widen_bfloat16(src[t, h, d])
                    if code == FLOAT:  # the cast rounds to nearest even, like astype
                        pool[cell, h, d] = x
                    elif code == BFLOAT16:
                        pool[cell, h, d] = narrow_bfloat16(x)
                    else:
                        pool[cell, h, d] = np.uint8(e4m3_bits(np.float32(x) / scales[which, h]))

    return device_function(store)


def make_scatter(k_kind: str, v_kind: str, in_kind: str):
    """The scatter kernel of pools of (k_kind, v_kind) (`storage.KINDS`) from k and v of
    `in_kind` (`storage.IO_KINDS`)."""
    store_k, store_v = make_store(k_kind, in_kind), make_store(v_kind, in_kind)

    def scatter_kv(k, v, k_pool, v_pool, kv_scales, step):
        """Stores K and V of each token t < width into pool row cells[t], in the pools'
        formats; skips cells[t] < 0."""
        # k, v: [>= width, n_kv_heads, head_dim]  step: [4, columns] int32; one item per
        # (t, h, d) or (t, h, block), d fastest, so stores coalesce
        width = min(
            step[SCALARS, WIDTH],
            np.int32(k.shape[0]),
            np.int32(v.shape[0]),
            np.int32(step.shape[1]),
        )
        store_k(k, k_pool, kv_scales, 0, step, width)
        store_v(v, v_pool, kv_scales, 1, step, width)

    return scatter_kv


def kind_name(k_kind: str, v_kind: str) -> str:
    """A kernel's suffix for its pools' kinds: "" for float pools, "_bf16", "_q8_0",
    "_q8_0_q4_0" (K, V)."""
    short = {"float": "", "bfloat16": "_bf16"}
    if k_kind == v_kind:
        return short.get(k_kind, f"_{k_kind}")
    return f"_{k_kind}_{v_kind}"


def io_name(q_kind: str = "float", out_kind: str = "float") -> str:
    """A kernel's suffix for the kinds of what it reads and writes beside the pools: "" for
    float arrays, "_q_bf16" (k, v or q of bfloat16 patterns), "_out_bf16"."""
    return ("_q_bf16" if q_kind == "bfloat16" else "") + (
        "_out_bf16" if out_kind == "bfloat16" else ""
    )


SCATTERS: dict[tuple[str, str, str], object] = {}


def scatter_kernel(k_kind: str, v_kind: str, in_kind: str = "float"):
    """The scatter kernel of (k_kind, v_kind) from inputs of `in_kind`, made (and registered
    for PTX) on first use."""
    key = (k_kind, v_kind, in_kind)
    if key not in SCATTERS:
        name = f"scatter_kv{kind_name(k_kind, v_kind)}{io_name(in_kind)}"
        SCATTERS[key] = kernel(scatter_signatures(*key), name=name)(make_scatter(*key))
    return SCATTERS[key]


for _pair in PAIRS:
    scatter_kernel(*_pair)
scatter_kernel(*BFLOAT16_INPUT)


@kernel(PREPARE_TOKENS_SIGNATURES)
def prepare_tokens(step, cell_pos, cell_owners, seq_cells, seq_len):
    """Each placed token t < width: its position and owner bit into its cell of the mirror,
    its cell into seq_cells[s, p], and seq_len[s] up to p + 1."""
    # step: [4, columns] int32  cell_pos: [capacity] int32  cell_owners: [capacity, n_words]
    # uint64  seq_cells: [max_seqs, max_seq_len] int32  seq_len: [max_seqs] int32
    # a step's tokens have distinct cells; tokens of one sequence race on its length: atomic max
    width = min(step[SCALARS, WIDTH], np.int32(step.shape[1]))
    for t in range(cuda.grid(1), width, cuda.gridsize(1)):
        cell = step[CELLS, t]
        seq = step[SEQ_IDS, t]
        if cell >= 0 and seq >= 0:
            p = step[POSITIONS, t]
            cell_pos[cell] = p
            cell_owners[cell, seq >> 6] |= owner_bit(seq)
            seq_cells[seq, p] = cell
            cuda.atomic.max(seq_len, seq, p + 1)


def launch_scatter_kv(k, v, k_pool, v_pool, step, width: int, stream=0, *, kinds=None,
                      kv_scales=None) -> None:  # fmt: skip
    """Writes the step's K and V rows into `pool[cells[t]]` for t < width, skipping cells -1.

    k, v           : device array, shape [>= width, n_kv_heads, head_dim], float32, float16
                     or uint16 (bfloat16 bit patterns), both the same
    k_pool, v_pool : device array, shape [rows, n_kv_heads, row_width] (docs/contract.md
                     §4.1): float32, float16, uint16 (bfloat16 bit patterns) or uint8
                     (quantized); values are stored in each pool's format
    step           : device array, the step buffer [4, columns] int32 (`step_buffer`): cells
                     each in [-1, rows), its width = `width`
    width          : the step's width (the grid's size; the kernel reads the buffer's)
    kinds          : (K kind, V kind) of `storage.KINDS`, default from the pools' dtypes
                     (which uint8 pools do not say)
    kv_scales      : device array [2, n_kv_heads] float32, fp8's K and V scales (default
                     ones: needed only for fp8 pools)
    """
    check_extent("width", width, step.shape[1], len(k), len(v))
    if k.dtype != v.dtype:
        raise ValueError(f"k is {k.dtype} and v {v.dtype}: give both one dtype")
    n_items = width * k.shape[1] * k.shape[2]
    if n_items == 0:
        return
    kinds = kinds or (kind_of_dtype(k_pool.dtype), kind_of_dtype(v_pool.dtype))
    if kv_scales is None:
        kv_scales = unit_scales(k.shape[1], stream)
    grid, threads = launch_dims(n_items)
    scatter = scatter_kernel(*kinds, io_kind(k.dtype))
    launch(scatter, grid, threads, stream, k, v, k_pool, v_pool, kv_scales, step)


def launch_prepare_tokens(
    step, width: int, cell_pos, cell_owners, seq_cells, seq_len, stream=0
) -> None:
    """Records the step's placed tokens in the table mirror (position and owner bit per cell)
    and in the position -> cell table (seq_cells, seq_len).

    step        : device array, the step buffer [4, columns] int32, its width = `width`
    cell_pos    : device array, shape [capacity], int32
    cell_owners : device array, shape [capacity, n_words], uint64
    seq_cells   : device array, shape [max_seqs, max_seq_len], int32
    seq_len     : device array, shape [max_seqs], int32
    """
    check_extent("width", width, step.shape[1])
    if width == 0:
        return
    grid, threads = launch_dims(width)
    launch(prepare_tokens, grid, threads, stream, step, cell_pos, cell_owners, seq_cells, seq_len)
