"""Launching attention: the kernel shape for a step, the decode splits, the checks, the launchers.

Shape rule (`is_decode_shape`): the decode kernels run when width <= DECODE_MAX_WIDTH, or,
on a GPU, when the prefill grid (ceil(width / tokens per tile) x n_kv_heads x head chunks
blocks) would have fewer blocks than the GPU has multiprocessors, e.g. a batch of 64
single-token decodes at GQA 4 over 8 KV heads is 128 prefill blocks, under the 132 SMs of
an H100/H200. Such a grid leaves SMs idle while each block walks whole histories; the
decode kernels split every token's cells over n_splits blocks instead (`choose_splits`:
enough blocks for SPLIT_TARGET_BLOCKS_PER_SM per multiprocessor, at least MIN_SPLIT_CELLS
cells a split, at most MAX_SPLITS). Otherwise token tiles fill the device, and every K/V
tile load serves the PREFILL_ROWS query rows of its block.
"""

import numpy as np

from numbakv.cache._cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels import storage
from numbakv.cache.kernels.attention import decode, prefill
from numbakv.cache.kernels.attention.merge import merge_splits
from numbakv.cache.kernels.attention.tiles import (
    DECODE_ROWS,
    DECODE_TILE,
    HEAD_DIM_MAX,
    PREFILL_ROWS,
    STORAGE,
)
from numbakv.cache.kernels.launch import attention_grid, check_extent, launch_dims, n_sms

DECODE_MAX_WIDTH = 8  # steps up to this width run the decode (split) kernels
MIN_SPLIT_CELLS = 2 * DECODE_TILE  # a split's cells, at least (when there is more than one)
MAX_SPLITS = 32  # splits per token, at most
SPLIT_TARGET_BLOCKS_PER_SM = 4  # decode blocks wanted per multiprocessor

# (mode, storage kind) -> (decode kernel, prefill kernel)
KERNELS = {key: (decode.KERNELS[key], prefill.KERNELS[key]) for key in decode.KERNELS}


def choose_splits(max_len: int, n_blocks: int) -> int:
    """Splits per token for the decode kernels: enough blocks for SPLIT_TARGET_BLOCKS_PER_SM
    per multiprocessor (the simulator counts as one), each split at least MIN_SPLIT_CELLS
    cells, at most MAX_SPLITS.

    max_len  : the most cells a token reads (read_len, or the longest gathered range)
    n_blocks : blocks before splitting (width x KV heads x head chunks)
    """
    by_len = max(1, max_len // MIN_SPLIT_CELLS)
    wanted = -(-SPLIT_TARGET_BLOCKS_PER_SM * n_sms() // max(1, n_blocks))
    return max(1, min(MAX_SPLITS, by_len, wanted))


def is_decode_shape(width: int, n_heads: int, n_kv_heads: int) -> bool:
    """True when a step of `width` tokens runs the decode (split) kernels: width <=
    DECODE_MAX_WIDTH or, on a GPU, a prefill grid smaller than the multiprocessor count."""
    if width <= DECODE_MAX_WIDTH:
        return True
    if IS_SIMULATOR:
        return False
    token_blocks, head_blocks = _prefill_blocks(width, n_heads, n_kv_heads)
    return token_blocks * head_blocks < n_sms()


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


def launch_attend_masked(
    q, k_pool, v_pool, mask, width: int, read_len: int, scale, out, stream=0, *,
    kernel: str | None = None, n_splits: int | None = None, workspace=None,
) -> None:  # fmt: skip
    """out[t, h] = softmax over the cells mask[t] allows of q[t, h]·K·scale, applied to V.

    q              : device array, shape [>= width, n_heads, head_dim], float32
    k_pool, v_pool : device array, shape [rows >= read_len, n_kv_heads, head_dim], float32,
                     float16 or uint16 (bfloat16 bit patterns); query head h reads KV head
                     h // (n_heads // n_kv_heads)
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
    view = (mask, np.int32(read_len))
    shape = dict(kernel=kernel, n_splits=n_splits, workspace=workspace, max_len=read_len)
    _launch("masked", view, q, k_pool, v_pool, width, scale, out, stream, **shape)


def launch_attend_gathered(
    q, k_pool, v_pool, seq_cells, seq_ids, positions, width: int, window: int, scale, out,
    stream=0, *, kernel: str | None = None, n_splits: int | None = None, workspace=None,
    max_len: int | None = None,
) -> None:  # fmt: skip
    """out[t, h] = softmax over the token's own cells of q[t, h]·K·scale, applied to V.

    Token t of sequence s = seq_ids[t] at position p = positions[t] reads exactly the cells
    seq_cells[s, lo : p + 1], lo = max(0, p - window + 1) if window > 0 else 0.

    q              : device array, shape [>= width, n_heads, head_dim], float32
    k_pool, v_pool : device array, shape [rows, n_kv_heads, head_dim], float32, float16 or
                     uint16 (bfloat16 bit patterns)
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
    if max_len is None:
        max_len = min(window, seq_cells.shape[1]) if window > 0 else seq_cells.shape[1]
    view = (seq_cells, seq_ids, positions, np.int32(window))
    shape = dict(kernel=kernel, n_splits=n_splits, workspace=workspace, max_len=max_len)
    _launch("gathered", view, q, k_pool, v_pool, width, scale, out, stream, **shape)


def _launch(
    mode, view, q, k_pool, v_pool, width, scale, out, stream, *, kernel, n_splits, workspace,
    max_len,
) -> None:  # fmt: skip
    """Runs the (decode, prefill) kernels of `mode` for the pool's storage over `view` (a view
    of `views`): one prefill launch, or a decode launch of n_splits splits per token and the
    merge."""
    if width == 0:
        return
    decode, prefill = KERNELS[mode, storage.kind(k_pool.dtype)]
    scale, n_heads, head_dim = np.float32(scale), q.shape[1], q.shape[2]
    if not _pick(kernel, width, q, k_pool):
        grid, threads = attention_grid(*_prefill_blocks(width, n_heads, k_pool.shape[1]))
        prefill[grid, threads, stream](q, k_pool, v_pool, view, np.int32(width), scale, out)
        return
    n_head_blocks = _head_blocks(n_heads, k_pool.shape[1], DECODE_ROWS)
    n_splits = n_splits or choose_splits(max_len, width * n_head_blocks)
    partials, n_splits = _partials(workspace, width, n_heads, head_dim, n_splits, stream)
    grid, threads = attention_grid(n_splits, n_head_blocks, width)
    decode[grid, threads, stream](
        q, k_pool, v_pool, view, np.int32(width), scale, np.int32(n_splits), *partials
    )
    blocks, threads = launch_dims(width * n_heads * head_dim)
    merge_splits[blocks, threads, stream](*partials, np.int32(width), np.int32(n_splits), out)


def _prefill_blocks(width: int, n_heads: int, n_kv_heads: int) -> tuple[int, int]:
    """(token blocks, head blocks) of a prefill launch, before any cap."""
    tokens_per_block = PREFILL_ROWS // min(n_heads // n_kv_heads, PREFILL_ROWS)
    return -(-width // tokens_per_block), _head_blocks(n_heads, n_kv_heads, PREFILL_ROWS)


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
