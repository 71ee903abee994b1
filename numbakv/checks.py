"""Every check of a caller's arguments, in one module: each returns the checked value or
raises the error its caller names (for a cache, the error of docs/contract.md §6), naming
the bad value and what to do. Pure: they read what they are given and change nothing, and
every call runs them before it changes anything.

    values  integers, reals, token ids: what the config, the caches, the serving stack and
            the command line (its argparse types, `numbakv.cli.args`) all take (file paths:
            `numbakv.paths`)
    calls   the arguments of the caches' verbs and steps, read against either table

The calls' checks are the one piece of the refusal path the two caches share (§7 allows
it), so a differential test cannot see a bug in them; `tests/contract/` holds each
refusal, and the order of the checks, to a fixed expected error on both caches instead.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from numbakv import dlpack
from numbakv.errors import CacheError, CapacityError, ConfigError, SequenceError, StepError

if TYPE_CHECKING:  # checks.py is below config.py, which builds its fields on these checks
    from numbakv.config import CacheConfig

# -- values ---------------------------------------------------------------------------


def as_int(name: str, value, error: type[Exception] = ConfigError, hint: str = "") -> int:
    """`value` as an int, or `error` naming `name`, the value and `hint` (what to do):
    integers are the values `operator.index` takes (int, NumPy integers, 0-d integer
    arrays) except bools."""
    if not isinstance(value, bool | np.bool_):
        try:
            return operator.index(value)
        except Exception:  # TypeError, or whatever a hostile __index__ raises
            pass
    raise error(
        f"{name} must be an integer (not a bool, float, string or None), got "
        f"{short_repr(value)}{hint}"
    )


def short_repr(value) -> str:
    """repr(value), cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def int_at_least(name: str, value, bound: int, error: type[Exception] = ConfigError) -> int:
    """`value` as an int >= bound (bools refused), or `error` naming `name` and the bound."""
    value = as_int(name, value, error)
    if value < bound:
        raise error(f"{name}={value} is below {bound}; give {name} >= {bound}")
    return value


def at_most(name: str, value: int, bound: int, error: type[Exception] = ConfigError) -> int:
    """`value` (an int) when it is <= bound, else `error` naming `name` and the bound."""
    if value > bound:
        raise error(f"{name}={value} exceeds {bound}; give {name} <= {bound}")
    return value


def real(name: str, value, error: type[Exception]) -> float:
    """`value` as a float when it is a real number (not a bool, not a str), else `error`."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        return float(value)
    raise error(f"{name} must be a real number, got {value!r}")


def token_ids(name: str, tokens, vocab_size: int, error: type[Exception]) -> list[int]:
    """`tokens` as a non-empty list of ints in [0, vocab_size), or `error` naming the first
    bad entry. Takes a sequence of integers or a 1-d integer array; refuses a str, bytes,
    sets and iterators (no order or no second look), and arrays of another rank or dtype."""
    expected = f"token ids: a non-empty list of ints in [0, {vocab_size})"
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise error(
                f"{name} is an array of shape {tokens.shape} and dtype {tokens.dtype}; "
                f"expected {expected} (a 1-d integer array)"
            )
        tokens = tokens.tolist()
    elif isinstance(tokens, str | bytes | bytearray) or not isinstance(tokens, Sequence):
        raise error(
            f"{name} must be {expected}, got a {type(tokens).__name__} "
            f"{short_repr(tokens)}; give list(...) of the ids"
        )
    hint = f"; {name} holds {expected}"
    checked = [as_int(f"{name}[{i}]", t, error, hint) for i, t in enumerate(tokens)]
    if not checked:
        raise error(f"{name} is empty; expected {expected}")
    for i, t in enumerate(checked):
        if not 0 <= t < vocab_size:
            raise error(
                f"{name}[{i}] = {t} is outside the vocabulary [0, {vocab_size}); expected "
                f"{expected}"
            )
    return checked


# -- calls of the caches -----------------------------------------------------------

SHOWN_IDS = 8  # live ids a SequenceError lists, at most
FLOAT_NAMES = ("bfloat16",)  # float dtypes NumPy knows only through ml_dtypes


def as_host(x) -> np.ndarray:
    """A NumPy view of x; device arrays (with `copy_to_host`) are copied over."""
    if hasattr(x, "copy_to_host"):
        x = x.copy_to_host()
    return np.asarray(x)


def host_floats(name: str, x) -> np.ndarray:
    """x as a NumPy array of a real float dtype (float16/32/64, ml_dtypes' bfloat16), or
    StepError. Takes what NumPy converts (lists, any strides or order, torch CPU tensors,
    those that require grad included), host bfloat16 tensors through DLPack (widened to
    float32, exactly) and device arrays with `copy_to_host`; refuses integer, bool, complex,
    object and string arrays, which no cast makes into K/V."""
    if not hasattr(x, "copy_to_host") and dlpack.is_foreign_device_array(x):
        raise StepError(
            f"{name}: {type(x).__name__} is a foreign device array; the reference reads host "
            "arrays and numba device arrays: copy it to the host first (.get(), .cpu())"
        )
    try:
        if hasattr(x, "detach"):  # a torch tensor that requires grad refuses __array__
            x = x.detach()
        array, error = as_host(x), None
    except Exception as raised:  # whatever the object's conversion raises
        array, error = None, raised
    is_float = array is not None and (array.dtype.kind == "f" or array.dtype.name in FLOAT_NAMES)
    if not is_float and not isinstance(x, np.ndarray) and dlpack.has_dlpack(x):
        return dlpack.host_floats(name, x)  # what NumPy cannot read: a bfloat16 tensor
    if array is None:
        raise StepError(
            f"{name}: cannot convert {type(x).__name__} to a NumPy array ({error!r}); pass "
            "an array of float32, float16 or bfloat16, or a tensor that has __dlpack__"
        ) from error
    if not is_float:
        raise StepError(
            f"{name} has dtype {array.dtype}; K, V and q are real floats: give float32, "
            "float16, float64 or bfloat16 values"
        )
    return array


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


def check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(expected):
        raise StepError(f"{name} has shape {tuple(shape)}; this step expects {list(expected)}")


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
