"""Checks of the arguments of the caches' verbs and steps, read against a `CacheConfig` and
either table (docs/contract.md §6). Pure: they read what they are given, change nothing,
and every call runs them before it changes anything.

They are the one piece of the refusal path the two caches share (§7 allows it), so a
differential test cannot see a bug in them; `tests/contract/` holds each refusal, and the
order of the checks, to a fixed expected error on both caches instead.
"""

import math
import numbers
import operator
from collections.abc import Sequence

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import CacheError, CapacityError, ConfigError, SequenceError, StepError
from numbakv.core.values import as_int, check_shape, short_repr

SHOWN_IDS = 8  # live ids a SequenceError lists, at most


def check_declaration(table, config: CacheConfig, seq_ids) -> np.ndarray:
    """[n] int32 live ids, a fresh array: 1 <= n <= max_width, n <= free cells, no sequence
    past max_seq_len positions; `table` is either table. `seq_ids` is a list, tuple, range or
    1-d integer array (an iterator would be consumed by a refusal).

    A 1-d integer array, or a list or tuple of ints, is checked in one pass; anything else,
    and any declaration with a bad id, is checked id by id, so that the error names the
    first bad one."""
    used = table.used_cells
    ids = _admitted_at_once(table, config, used, seq_ids)
    if ids is not None:
        return ids
    ids = np.asarray(_live_ids_one_by_one(table, seq_ids), dtype=np.int32)
    n = len(ids)
    if not 1 <= n <= config.max_width:
        raise StepError(f"a step declares 1 to max_width={config.max_width} tokens, got {n}")
    free = config.capacity - used  # free_cells, without asking the table twice
    if free < n:
        raise CapacityError(
            f"the step declares {n} tokens but only {free} of "
            f"{config.capacity} cells are free; seq_rm() or rewind() sequences first"
        )
    if used + n <= config.max_seq_len:  # no sequence can hold more than that
        return ids
    for seq, count in zip(*np.unique(ids, return_counts=True), strict=True):
        if table.length(seq) + count > config.max_seq_len:
            raise CapacityError(
                f"sequence {seq} holds {table.length(seq)} positions; {count} more would pass "
                f"max_seq_len={config.max_seq_len}; rewind() it or raise max_seq_len"
            )
    return ids


def _admitted_at_once(table, config: CacheConfig, used: int, seq_ids) -> np.ndarray | None:
    """A fresh [n] int32 copy of `seq_ids` when it is a 1-d native-order integer array, or a
    list or tuple of exactly `int`s, and the declaration passes every check (ids live, 1 <=
    n <= max_width, n <= free cells, no sequence past max_seq_len); else None (the caller
    checks again, one id at a time, to name what is wrong).

    The ids are tested by `table.admits` when the table has it (the device table's one njit
    pass, max_seq_len included), else by NumPy against `table.live` (and max_seq_len is
    left to the caller's count)."""
    kind = type(seq_ids)
    if kind is np.ndarray:
        dtype = seq_ids.dtype
        if seq_ids.ndim != 1 or dtype.kind not in "iu" or not dtype.isnative:
            return None
        ids = seq_ids
    elif kind is list or kind is tuple:
        n = len(seq_ids)
        if operator.countOf(map(type, seq_ids), int) != n:  # bools, NumPy ints, floats ...
            return None
        try:
            ids = np.fromiter(seq_ids, np.int32, n)
        except OverflowError:  # an id past int32: not live
            return None
    else:
        return None
    n = len(ids)
    if not 1 <= n <= min(config.max_width, config.capacity - used):
        return None
    bound = config.max_seq_len if used + n > config.max_seq_len else 0  # 0: none can pass
    admits = getattr(table, "admits", None)
    if admits is not None:
        if not admits(ids, bound):
            return None
    elif bound or not _all_live(ids, table.live):
        return None
    return ids.astype(np.int32) if ids is seq_ids else ids  # a copy: the caller keeps theirs


def _all_live(ids: np.ndarray, live: np.ndarray) -> bool:
    """Whether every id of `ids` ([n] integers, n >= 1) is live (live: [max_seqs] bool)."""
    return bool(ids.min() >= 0 and ids.max() < len(live) and live[ids].all())


def _live_ids_one_by_one(table, seq_ids) -> list[int]:
    """`seq_ids` as a list of ints, each checked by `table.check_live`; StepError when it is
    no sequence of ids or its items cannot be read."""
    if isinstance(seq_ids, np.ndarray):
        is_list = seq_ids.ndim == 1
    else:
        is_text = isinstance(seq_ids, str | bytes | bytearray | memoryview)
        is_list = isinstance(seq_ids, Sequence) and not is_text
    if not is_list:
        raise StepError(
            f"declare_step takes a sequence of ids, one per token (a list or a 1-d array), "
            f"got {short_repr(seq_ids)}"
        )
    try:
        return [table.check_live(seq) for seq in seq_ids]
    except CacheError:
        raise
    except Exception as error:  # a sequence whose items cannot be read
        raise StepError(f"cannot read the declared ids {short_repr(seq_ids)}: {error!r}") from error


GEOMETRY = ("n_layers", "n_kv_heads", "head_dim", "windows")  # what a model and its cache share


def check_geometry(model_config, cache_config: CacheConfig) -> None:
    """ConfigError naming the first field of GEOMETRY in which a model's config (anything
    with those attributes) and a cache's config differ."""
    for name in GEOMETRY:
        model_value, cache_value = getattr(model_config, name), getattr(cache_config, name)
        if model_value != cache_value:
            raise ConfigError(
                f"the model's {name}={model_value!r} differs from the cache config's "
                f"{name}={cache_value!r}; build the cache with model.config.cache_config(...)"
            )


def check_width(width, n: int, max_width: int) -> int:
    """The step's width: n when None, else an int in [n, max_width]."""
    if width is None:
        return n
    width = as_int("width", width, StepError)
    if not n <= width <= max_width:
        raise StepError(f"width={width} must lie in [declared tokens={n}, max_width={max_width}]")
    return width


def check_layer(layer, n_layers: int) -> int:
    layer = as_int("layer", layer, StepError)
    if not 0 <= layer < n_layers:
        raise StepError(f"layer={layer} is outside [0, n_layers={n_layers})")
    return layer


def check_window(window, windows: tuple[int, ...]) -> int:
    """`window` as an int that is one of `windows` (the cache's distinct windows)."""
    window = as_int("window", window, StepError)
    if window not in windows:
        raise StepError(f"no mask for window {window}; this cache's windows are {windows}")
    return window


ATTENTION_MODES = ("gathered", "masked")


def check_mode(mode) -> str:
    """An attention mode: "gathered" (read each token's own cells) or "masked" (sweep
    [0, read_len) under the window's mask); both give the same results."""
    if not isinstance(mode, str) or mode not in ATTENTION_MODES:
        raise StepError(f"mode={mode!r} is not an attention mode; give one of {ATTENTION_MODES}")
    return mode


def default_scale(head_dim: int) -> np.float32:
    """The score scale attention uses unless told: 1 / sqrt(head_dim), as float32."""
    return np.float32(1.0 / np.sqrt(head_dim))


def check_scale(scale, head_dim: int) -> np.float32:
    """The score scale as float32: 1 / sqrt(head_dim) when None, else a finite positive
    real (an int or float, not a bool or a string) that stays so in float32."""
    if scale is None:
        return default_scale(head_dim)
    if isinstance(scale, numbers.Real) and not isinstance(scale, bool | np.timedelta64):
        try:
            with np.errstate(over="ignore"):
                value = np.float32(scale)
        except OverflowError:  # an int or Fraction past every float
            value = np.float32(np.inf)
        if math.isfinite(value) and value > 0:
            return value
    raise StepError(
        f"scale={scale!r} is not a finite positive real in float32; give a float such as "
        f"1 / sqrt(head_dim) = {default_scale(head_dim):.6g}, or None for that default"
    )


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
    seq = as_int("sequence id", seq, SequenceError)
    if not (0 <= seq < len(live) and live[seq]):
        raise SequenceError(
            f"sequence {seq} is not live ({live_ids_text(live)}); "
            "get one from seq_new() or seq_clone()"
        )
    return seq


def live_ids_text(live: np.ndarray) -> str:
    """'live ids: 0, 1, 2' — at most SHOWN_IDS of them, then '… (n live)'."""
    ids = np.flatnonzero(live)
    if len(ids) == 0:
        return "no sequence is live"
    shown = ", ".join(str(i) for i in ids[:SHOWN_IDS].tolist())
    if len(ids) > SHOWN_IDS:
        shown += f", … ({len(ids)} live)"
    return f"live ids: {shown}"


def check_position(name: str, value, n: int, seq: int) -> int:
    """`value` as an int in [0, n] (sequence `seq` holds n positions), or SequenceError."""
    value = as_int(name, value, SequenceError)
    if not 0 <= value <= n:
        raise SequenceError(
            f"{name}={value} is outside [0, {n}] for sequence {seq}, which holds {n} positions"
        )
    return value
