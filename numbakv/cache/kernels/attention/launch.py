"""Launching attention: a plan per step shape, the checks, and the two launchers.

Plan once, run per layer (FlashInfer's plan/run): `plan_attention` decides from the width
and the config alone which kernel runs, its grid and the decode splits; `run_attention`
only launches. A plan never depends on a step's contents (its read_len or positions,
which the kernels read from the step buffer), so one plan, and a launch recorded from it,
serves every step of its width.

Shape rule (`is_decode_shape`): the decode kernels run when width <= DECODE_MAX_WIDTH, or,
on a GPU, when the prefill grid (ceil(width / tokens per tile) x n_kv_heads x head chunks
blocks) would have fewer blocks than the GPU has multiprocessors, e.g. a batch of 64
single-token decodes at GQA 4 over 8 KV heads is 128 prefill blocks, under the 132 SMs of
an H100/H200. Such a grid leaves SMs idle while each block walks whole histories; the
decode kernels split every token's cells over up to n_splits blocks instead
(`choose_splits`, from the longest range the config allows: enough blocks for
SPLIT_TARGET_BLOCKS_PER_SM per multiprocessor, at most MAX_SPLITS; each token uses the
splits its own range fills at MIN_SPLIT_CELLS cells a split, the rest exit at once).
Otherwise token tiles fill the device, and every K/V tile load serves the PREFILL_ROWS
query rows of its block.
"""

from dataclasses import dataclass

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda, device_address
from numbakv.cache.kernels import storage
from numbakv.cache.kernels.attention import decode, lanes, prefill
from numbakv.cache.kernels.attention.decode import MIN_SPLIT_CELLS
from numbakv.cache.kernels.attention.merge import merge_kernel
from numbakv.cache.kernels.attention.tiles import HEAD_DIM_MAX, PREFILL_ROWS, STORAGE
from numbakv.cache.kernels.launch import (
    attention_grid,
    check_extent,
    launch,
    launch_dims,
    n_sms,
)
from numbakv.core.formats import row_width

DECODE_MAX_WIDTH = 8  # steps up to this width run the decode (split) kernels
MAX_SPLITS = 32  # splits per token, at most
# decode blocks wanted per multiprocessor: two waves of the blocks that fit at once (4 of
# decode.THREADS threads give 16 resident warps)
SPLIT_TARGET_BLOCKS_PER_SM = 8


def kernels(mode: str, k_kind: str, v_kind: str, q_kind: str, out_kind: str,
            head_dim: int = 128, is_wide: bool = True, group: int = 4) -> tuple:  # fmt: skip
    """(decode kernel, merge kernel, prefill kernel) of `mode` over pools of (k_kind,
    v_kind), for q and out of (q_kind, out_kind) (`storage.IO_KINDS`); the decode kernel is
    made for `head_dim` and a GQA `group`, with wide loads or not (`lanes.is_wide`)."""
    return (
        decode.KERNELS(mode, k_kind, v_kind, q_kind, out_kind, head_dim, is_wide, group),
        merge_kernel(out_kind),
        prefill.KERNELS(mode, k_kind, v_kind, q_kind, out_kind, head_dim, is_wide),
    )


@dataclass(frozen=True)
class AttentionPlan:
    """How attention launches for steps of one width: the kernel, its grid and block, the
    decode splits (0 for prefill) and the merge kernel, its grid and block."""

    kernel: object
    grid: tuple
    threads: int
    n_splits: int
    merge: object = None
    merge_grid: tuple = ()
    merge_threads: int = 0

    @property
    def is_decode(self) -> bool:
        return self.n_splits > 0


def choose_splits(max_len: int, n_blocks: int) -> int:
    """Splits per token for the decode grid: enough blocks for SPLIT_TARGET_BLOCKS_PER_SM
    per multiprocessor (the simulator counts as one), no more than a range of `max_len`
    fills at MIN_SPLIT_CELLS cells a split, at most MAX_SPLITS.

    max_len  : the most cells a token may read (the config's bound, not a step's)
    n_blocks : blocks before splitting (width x KV heads x head chunks)
    """
    by_len = max(1, max_len // MIN_SPLIT_CELLS)
    wanted = -(-SPLIT_TARGET_BLOCKS_PER_SM * n_sms() // max(1, n_blocks))
    return max(1, min(MAX_SPLITS, by_len, wanted))


def gathered_max_len(window: int, max_seq_len: int) -> int:
    """The most cells a gathered token reads: its window, at most max_seq_len (0: global)."""
    return min(window, max_seq_len) if window > 0 else max_seq_len


def is_decode_shape(width: int, n_heads: int, n_kv_heads: int) -> bool:
    """True when a step of `width` tokens runs the decode (split) kernels: width <=
    DECODE_MAX_WIDTH or, on a GPU, a prefill grid smaller than the multiprocessor count."""
    if width <= DECODE_MAX_WIDTH:
        return True
    if IS_SIMULATOR:
        return False
    token_blocks, head_blocks = _prefill_blocks(width, n_heads, n_kv_heads)
    return token_blocks * head_blocks < n_sms()


def decode_width_limit(max_width: int, n_heads: int, n_kv_heads: int) -> int:
    """The widest step (<= max_width) that runs the decode kernels: the rows a split
    workspace needs."""
    if IS_SIMULATOR:
        return min(max_width, DECODE_MAX_WIDTH)
    head_blocks = _head_blocks(n_heads, n_kv_heads, PREFILL_ROWS)
    widest = _prefill_tokens_per_block(n_heads, n_kv_heads) * ((n_sms() - 1) // head_blocks)
    return min(max_width, max(DECODE_MAX_WIDTH, widest))


def split_workspace(
    max_width: int, n_heads: int, head_dim: int, max_splits: int = MAX_SPLITS, stream=0
):
    """Device scratch for the decode kernels' partials, to allocate once and pass to every
    decode launch of up to `max_width` tokens: (part_acc [max_width, n_heads, max_splits,
    head_dim], part_m and part_l [max_width, n_heads, max_splits]), float32. Launches in
    flight together on different streams each need their own."""
    shape = (max_width, n_heads, max_splits)
    return (
        cuda.device_array((*shape, head_dim), np.float32, stream=stream),
        cuda.device_array(shape, np.float32, stream=stream),
        cuda.device_array(shape, np.float32, stream=stream),
    )


def plan_attention(
    mode: str, kind: str, width: int, n_heads: int, n_kv_heads: int, head_dim: int,
    max_len: int, *, kernel: str | None = None, n_splits: int | None = None,
    io: tuple[str, str] = ("float", "float"), is_wide: bool = True,
) -> AttentionPlan:  # fmt: skip
    """The plan of `mode` ("masked" or "gathered") over pools of storage `kind` (a
    `storage.KINDS` name, or a (K kind, V kind) pair) for steps of `width` tokens; `max_len`
    bounds a token's range (for splits).
    kernel: None (by `is_decode_shape`), "decode" or "prefill" forces one; n_splits: the
    decode splits (default `choose_splits`); io: the kinds of q and out (`storage.IO_KINDS`);
    is_wide: whether both pools take the decode kernel's wide loads (`lanes.is_wide`)."""
    kinds = (kind, kind) if isinstance(kind, str) else kind
    decode_kernel, merge, prefill_kernel = kernels(
        mode, *kinds, *io, head_dim, is_wide, n_heads // n_kv_heads
    )
    if not _pick(kernel, width, n_heads, n_kv_heads):
        grid, threads = attention_grid(*_prefill_blocks(width, n_heads, n_kv_heads))
        return AttentionPlan(prefill_kernel, grid, threads, 0)
    n_head_blocks = decode.head_blocks(n_heads, n_kv_heads, head_dim)
    n_splits = n_splits or choose_splits(max_len, width * n_head_blocks)
    (blocks,), _ = attention_grid(n_splits * n_head_blocks * width)  # one flat item loop
    grid = (blocks,)
    if n_splits == 1:  # the decode kernel writes out itself
        return AttentionPlan(decode_kernel, grid, decode.THREADS, 1)
    merge_grid, merge_threads = launch_dims(width * n_heads * head_dim)
    return AttentionPlan(decode_kernel, grid, decode.THREADS, n_splits, merge, merge_grid,
                         merge_threads)  # fmt: skip


def run_attention(plan: AttentionPlan, q, k_pool, v_pool, kv_scales, step, view, scale, out,
                  workspace, stream) -> None:  # fmt: skip
    """Launches `plan` (one prefill launch, or the decode launch and the merge) on `stream`;
    checks nothing. kv_scales: [2, n_kv_heads] float32 device array (fp8's K and V scales);
    scale: np.float32; workspace: `split_workspace` scratch of at least the plan's width and
    splits (decode plans)."""
    grid, threads = plan.grid, plan.threads
    pools = (q, k_pool, v_pool, kv_scales, step, view, scale)
    if not plan.is_decode:
        launch(plan.kernel, grid, threads, stream, *pools, out)
        return
    n_splits = np.int32(plan.n_splits)
    launch(plan.kernel, grid, threads, stream, *pools, n_splits, *workspace, out)
    if plan.merge is not None:
        launch(plan.merge, plan.merge_grid, plan.merge_threads, stream, *workspace, step,
               n_splits, out)  # fmt: skip


def launch_attend_masked(
    q, k_pool, v_pool, mask, step, width: int, read_len: int, scale, out, stream=0, *,
    kernel: str | None = None, n_splits: int | None = None, workspace=None, kinds=None,
    kv_scales=None,
) -> None:  # fmt: skip
    """out[t, h] = softmax over the cells mask[t] allows of q[t, h]·K·scale, applied to V.

    q              : device array, shape [>= width, n_heads, head_dim], float32, float16 or
                     uint16 (bfloat16 bit patterns)
    k_pool, v_pool : device array, shape [rows >= read_len, n_kv_heads, row_width]
                     (docs/contract.md §4.1): float32, float16, uint16 (bfloat16 bit
                     patterns) or uint8 (quantized); query head h reads KV head
                     h // (n_heads // n_kv_heads)
    mask           : device array, shape [max_width, capacity], uint8, 1 = attend; read at
                     rows < width and columns < read_len only
    step           : device array, the step buffer [4, columns] int32 (`step_buffer`) whose
                     width and read_len are `width` and `read_len`
    width          : tokens of the step; read_len: cells [0, read_len) are swept
    scale          : the score scale (cast to float32)
    out            : device array, shape [>= width, n_heads, head_dim], as q's dtypes (uint16:
                     bfloat16 patterns, rounded to nearest even); rows [0, width) written (0
                     where a token sees no cell), the rest untouched
    kernel         : None (by the step's shape), "decode" or "prefill": forces one
    n_splits       : decode splits per token (default `choose_splits` of read_len)
    workspace      : `split_workspace(...)` scratch for the decode partials (default: a
                     fresh allocation per decode launch)
    kinds          : (K kind, V kind) of `storage.KINDS`, default from the pools' dtypes
                     (which uint8 pools do not say)
    kv_scales      : device array [2, n_kv_heads] float32, fp8's scales (default ones)
    head_dim <= 128 and n_heads a multiple of n_kv_heads, else ValueError.
    """
    kinds = _check_shapes(q, k_pool, v_pool, out, kinds)
    check_extent("width", width, len(q), len(out), mask.shape[0], step.shape[1])
    check_extent("read_len", read_len, mask.shape[1], k_pool.shape[0])
    shape = dict(kernel=kernel, n_splits=n_splits, workspace=workspace, max_len=read_len,
                 kinds=kinds, kv_scales=kv_scales)  # fmt: skip
    _launch("masked", (mask,), q, k_pool, v_pool, step, width, scale, out, stream, **shape)


def launch_attend_gathered(
    q, k_pool, v_pool, seq_cells, step, width: int, window: int, scale, out, stream=0, *,
    kernel: str | None = None, n_splits: int | None = None, workspace=None,
    max_len: int | None = None, kinds=None, kv_scales=None,
) -> None:  # fmt: skip
    """out[t, h] = softmax over the token's own cells of q[t, h]·K·scale, applied to V.

    Token t of sequence s = seq_ids[t] at position p = positions[t] (from the step buffer)
    reads exactly the cells seq_cells[s, lo : p + 1], lo = max(0, p - window + 1) if
    window > 0 else 0.

    q              : device array, shape [>= width, n_heads, head_dim], as in
                     `launch_attend_masked`
    k_pool, v_pool : device array, shape [rows, n_kv_heads, row_width], as in
                     `launch_attend_masked`
    seq_cells      : device array, shape [max_seqs, max_seq_len], int32: row s holds
                     sequence s's cells by position; read inside each token's range only
    step           : device array, the step buffer [4, columns] int32 (`step_buffer`), its
                     width = `width`; sequence -1 = padding (output 0), positions <
                     max_seq_len
    width          : tokens of the step; window: 0 = global, W > 0
    scale          : the score scale (cast to float32)
    out            : device array, shape [>= width, n_heads, head_dim], as in
                     `launch_attend_masked`; rows [0, width) written, the rest untouched
    kernel, n_splits, workspace, kinds, kv_scales : as in `launch_attend_masked`
    max_len        : the longest range a token reads, for choosing splits (default the
                     window, or max_seq_len for global attention)
    head_dim <= 128 and n_heads a multiple of n_kv_heads, else ValueError.
    """
    kinds = _check_shapes(q, k_pool, v_pool, out, kinds)
    check_extent("width", width, len(q), len(out), step.shape[1])
    if window < 0:
        raise ValueError(f"window={window} must be 0 (global) or positive")
    if max_len is None:
        max_len = gathered_max_len(window, seq_cells.shape[1])
    view = (seq_cells, np.int32(window))
    shape = dict(kernel=kernel, n_splits=n_splits, workspace=workspace, max_len=max_len,
                 kinds=kinds, kv_scales=kv_scales)  # fmt: skip
    _launch("gathered", view, q, k_pool, v_pool, step, width, scale, out, stream, **shape)


def _launch(
    mode, view, q, k_pool, v_pool, step, width, scale, out, stream, *, kernel, n_splits,
    workspace, max_len, kinds, kv_scales,
) -> None:  # fmt: skip
    """Plans and runs `mode` over `view` for a launcher: its workspace checked or made."""
    if width == 0:
        return
    n_heads, head_dim = q.shape[1], q.shape[2]
    if kv_scales is None:
        kv_scales = storage.unit_scales(k_pool.shape[1], stream)
    plan = plan_attention(
        mode, kinds, width, n_heads, k_pool.shape[1], head_dim, max_len,
        kernel=kernel, n_splits=n_splits, io=(storage.io_kind(q.dtype), storage.io_kind(out.dtype)),
        is_wide=pools_are_wide(kinds, head_dim, k_pool, v_pool),
    )  # fmt: skip
    if plan.is_decode:
        workspace = _partials(workspace, width, n_heads, head_dim, plan.n_splits, stream)
    run_attention(plan, q, k_pool, v_pool, kv_scales, step, view, np.float32(scale), out,
                  workspace, stream)  # fmt: skip


def pools_are_wide(kinds: tuple[str, str], head_dim: int, k_pool, v_pool) -> bool:
    """Whether both pools take the decode kernel's wide loads (`lanes.is_wide`)."""
    return all(
        lanes.is_wide(kind, head_dim, device_address(pool), pool.strides)
        for kind, pool in zip(kinds, (k_pool, v_pool), strict=True)
    )


def _prefill_blocks(width: int, n_heads: int, n_kv_heads: int) -> tuple[int, int]:
    """(token blocks, head blocks) of a prefill launch, before any cap."""
    tokens_per_block = _prefill_tokens_per_block(n_heads, n_kv_heads)
    return -(-width // tokens_per_block), _head_blocks(n_heads, n_kv_heads, PREFILL_ROWS)


def _prefill_tokens_per_block(n_heads: int, n_kv_heads: int) -> int:
    """Tokens of one prefill block: PREFILL_ROWS query rows of one KV group's heads."""
    return PREFILL_ROWS // min(n_heads // n_kv_heads, PREFILL_ROWS)


def _head_blocks(n_heads: int, n_kv_heads: int, rows: int) -> int:
    """Head blocks of a grid: KV heads x chunks of at most `rows` heads of one group."""
    group = n_heads // n_kv_heads
    return n_kv_heads * -(-group // min(group, rows))


def _check_shapes(q, k_pool, v_pool, out, kinds) -> tuple[str, str]:
    """The pools' (K kind, V kind) (`kinds`, or from their dtypes); ValueError unless q, the
    pools and out fit together and the kernels."""
    if q.ndim != 3 or k_pool.ndim != 3 or out.ndim != 3 or k_pool.shape[:2] != v_pool.shape[:2]:
        raise ValueError(
            f"q {q.shape}, out {out.shape}: [width, n_heads, head_dim]; k_pool {k_pool.shape} "
            f"and v_pool {v_pool.shape}: [rows, n_kv_heads, row_width], the same rows and heads"
        )
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv_heads = k_pool.shape[1]
    if head_dim > HEAD_DIM_MAX or head_dim < 1:
        raise ValueError(f"head_dim={head_dim} is outside [1, {HEAD_DIM_MAX}] the kernels hold")
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        if np.dtype(pool.dtype).name not in STORAGE:
            raise ValueError(f"{name} dtype {pool.dtype}: one of {STORAGE}")
    kinds = kinds or (storage.kind_of_dtype(k_pool.dtype), storage.kind_of_dtype(v_pool.dtype))
    for name, pool, kind in (("k_pool", k_pool, kinds[0]), ("v_pool", v_pool, kinds[1])):
        if kind not in storage.KINDS or np.dtype(pool.dtype).name not in storage.KINDS[kind][1]:
            raise ValueError(f"{name} of dtype {pool.dtype} is not a pool of kind {kind!r}")
        if pool.shape[2] != row_width(kind, head_dim) or out.shape[1:] != q.shape[1:]:
            raise ValueError(
                f"q {q.shape}, out {out.shape} and {name} {pool.shape} ({kind}) disagree on "
                "heads or head_dim"
            )
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
    if {np.dtype(q.dtype).name, np.dtype(out.dtype).name} - {"float32", "float16", "uint16"}:
        raise ValueError(
            f"q and out must be float32, float16 or uint16 (bfloat16 patterns), got {q.dtype} "
            f"and {out.dtype}"
        )
    return kinds


def _pick(kernel_name: str | None, width: int, n_heads: int, n_kv_heads: int) -> bool:
    """True for the decode kernels: forced by kernel_name, else by the step's shape."""
    if kernel_name is None:
        return is_decode_shape(width, n_heads, n_kv_heads)
    if kernel_name not in ("decode", "prefill"):
        raise ValueError(f"kernel={kernel_name!r} is not 'decode', 'prefill' or None")
    return kernel_name == "decode"


def _partials(workspace, width: int, n_heads: int, head_dim: int, n_splits: int, stream):
    """The decode scratch: `workspace` checked to hold the plan, or a fresh one."""
    if workspace is None:
        return split_workspace(width, n_heads, head_dim, n_splits, stream)
    part_acc, part_m, part_l = workspace
    if (
        part_acc.shape[0] < width
        or part_acc.shape[1] != n_heads
        or part_acc.shape[2] < n_splits
        or part_acc.shape[3] < head_dim
        or part_m.shape != part_acc.shape[:3]
        or part_l.shape != part_acc.shape[:3]
    ):
        raise ValueError(
            f"workspace {part_acc.shape} cannot hold width={width}, n_heads={n_heads}, "
            f"n_splits={n_splits}, head_dim={head_dim}; make one with split_workspace()"
        )
    return workspace
