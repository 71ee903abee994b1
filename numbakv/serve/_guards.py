"""Private argument checks of the serving stack that raise the caller's choice of numbakv
error (SPEC §6). Integers are `numbakv.config.as_int`'s: anything `operator.index` takes
except a bool (`True` is not a token id); floats (even 2.0), strings, None and arrays of
rank >= 1 are refused. The thread-safe classes use `numbakv.observe.locked`.
"""

import numbers
from collections.abc import Sequence

import numpy as np

from numbakv.config import as_int
from numbakv.errors import CacheError


def real(name: str, value, error: type[CacheError]) -> float:
    """`value` as a float when it is a real number (not a bool, not a str), else `error`."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_):
        return float(value)
    raise error(f"{name} must be a real number, got {value!r}")


def token_ids(name: str, tokens, vocab_size: int, error: type[CacheError]) -> list[int]:
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
        raise error(f"{name} must be {expected}, got {tokens!r}; give list(...) of the ids")
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
