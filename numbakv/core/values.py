"""Checks of plain values: integers, reals, token ids, shapes. What the config, the caches,
the serving stack and the command line (its argparse types, `numbakv.cli.args`) all take;
file paths are `numbakv.core.paths`. Each returns the checked value or raises the error its
caller names (for a cache, the error of docs/contract.md §6), naming the bad value and what
to do, and changes nothing.
"""

import numbers
import operator
import reprlib
from collections.abc import Sequence

import numpy as np

from numbakv.core.errors import ConfigError, StepError


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
    """repr(value) cut to 60 characters, made without the whole repr of a long string or a
    deep or long container (a hostile file's or caller's value may be huge): the message's
    one way to show a value. Equal to repr(value) whenever that fits and nests at most six
    deep."""
    text = _REPR.repr(value)
    return text if len(text) <= SHORT else text[: SHORT - 3] + "..."


SHORT = 60
_REPR = reprlib.Repr()  # limits past what SHORT characters can show
_REPR.maxlevel = 6
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdict = 20
_REPR.maxdeque = _REPR.maxarray = 20
_REPR.maxstring = _REPR.maxlong = _REPR.maxother = 4 * SHORT


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


def check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(expected):
        raise StepError(f"{name} has shape {tuple(shape)}; this step expects {list(expected)}")
