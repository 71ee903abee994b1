"""Argument checks both implementations share: each raises the error of SPEC §6 or returns
the checked value. Pure: they read the table, never change it.

They are the one piece of the refusal path the two caches share (SPEC §7 allows it), so a
differential test cannot see a bug in them; `tests/contract/` holds each refusal, and the
order of the checks, to a fixed expected error on both caches instead."""

import operator

import numpy as np

from numbakv.config import CacheConfig
from numbakv.errors import CapacityError, SequenceError, StepError


def as_host(x) -> np.ndarray:
    """A NumPy view of x; device arrays (with `copy_to_host`) are copied over."""
    if hasattr(x, "copy_to_host"):
        x = x.copy_to_host()
    return np.asarray(x)


def check_declaration(table, config: CacheConfig, seq_ids) -> np.ndarray:
    """[n] int32 live ids, 1 <= n <= max_width, n <= free cells, no sequence past
    max_seq_len positions; `table` is either table."""
    seq_ids = [table.check_live(seq) for seq in seq_ids]
    n = len(seq_ids)
    if not 1 <= n <= config.max_width:
        raise StepError(f"a step declares 1 to max_width={config.max_width} tokens, got {n}")
    if table.free_cells < n:
        raise CapacityError(
            f"the step declares {n} tokens but only {table.free_cells} of "
            f"{config.capacity} cells are free; seq_rm() or rewind() sequences first"
        )
    seq_ids = np.asarray(seq_ids, dtype=np.int32)
    if table.used_cells + n <= config.max_seq_len:  # no sequence can hold more than that
        return seq_ids
    for seq, count in zip(*np.unique(seq_ids, return_counts=True), strict=True):
        if table.length(seq) + count > config.max_seq_len:
            raise CapacityError(
                f"sequence {seq} holds {table.length(seq)} positions; {count} more would pass "
                f"max_seq_len={config.max_seq_len}; rewind() it or raise max_seq_len"
            )
    return seq_ids


def check_width(width, n: int, max_width: int) -> int:
    """The step's width: n when None, else an int in [n, max_width]."""
    if width is None:
        return n
    try:
        width = operator.index(width)
    except TypeError:
        raise StepError(f"width must be an integer, got {width!r}") from None
    if not n <= width <= max_width:
        raise StepError(f"width={width} must lie in [declared tokens={n}, max_width={max_width}]")
    return width


def check_layer(layer, n_layers: int) -> int:
    try:
        layer = operator.index(layer)
    except TypeError:
        raise StepError(f"layer must be an integer, got {layer!r}") from None
    if not 0 <= layer < n_layers:
        raise StepError(f"layer={layer} is outside [0, n_layers={n_layers})")
    return layer


def check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(expected):
        raise StepError(f"{name} has shape {tuple(shape)}; this step expects {list(expected)}")


ATTENTION_MODES = ("gathered", "masked")


def check_mode(mode) -> str:
    """An attention mode: "gathered" (read each token's own cells) or "masked" (sweep
    [0, read_len) under the window's mask); both give the same results."""
    if mode not in ATTENTION_MODES:
        raise StepError(f"mode={mode!r} is not an attention mode; give one of {ATTENTION_MODES}")
    return mode


def check_query(shape: tuple[int, ...], width: int, config: CacheConfig) -> int:
    """n_heads of a query [width, n_heads, head_dim], a positive multiple of n_kv_heads."""
    n_heads = shape[1] if len(shape) == 3 else 0
    if n_heads == 0 or n_heads % config.n_kv_heads:
        raise StepError(
            f"q has shape {tuple(shape)}; expected [width={width}, n_heads, "
            f"head_dim={config.head_dim}] with n_heads a positive multiple of "
            f"n_kv_heads={config.n_kv_heads}"
        )
    check_shape("q", shape, (width, n_heads, config.head_dim))
    return n_heads


def check_live(seq, live: np.ndarray) -> int:
    """`seq` as an int, or SequenceError when it is not an integer or not a live id.

    live : [max_seqs] bool
    """
    try:
        seq = operator.index(seq)
    except TypeError:
        raise SequenceError(f"sequence id must be an integer, got {seq!r}") from None
    if not (0 <= seq < len(live) and live[seq]):
        raise SequenceError(
            f"sequence {seq} is not live (live ids: {np.flatnonzero(live).tolist()}); "
            "get one from seq_new() or seq_clone()"
        )
    return seq


def check_position(name: str, value, n: int, seq: int) -> int:
    """`value` as an int in [0, n] (sequence `seq` holds n positions), or SequenceError."""
    try:
        value = operator.index(value)
    except TypeError:
        raise SequenceError(f"{name} must be an integer, got {value!r}") from None
    if not 0 <= value <= n:
        raise SequenceError(
            f"{name}={value} is outside [0, {n}] for sequence {seq}, which holds {n} positions"
        )
    return value
