"""What a `PrefixCache` asks of its target and of the tokens it is given (docs/contract.md
§9.2, §13): the verbs of a cache or of an executor's sessions, and the checks of token ids
and salts.

A cache answers `seq_clone`, `rewind`, `seq_rm`, `pos` and, to save and load sequences,
`seq_save`, `seq_load`; an executor (`Executor`, `Lockstep`) answers `clone`, `rewind`,
`close_session`, `length` and `save_session`, `load_session`.
"""

from collections.abc import Callable

import numpy as np

from numbakv.core.errors import ConfigError
from numbakv.core.values import short_repr

CACHE_VERBS = ("seq_clone", "rewind", "seq_rm", "pos")
SESSION_VERBS = ("clone", "rewind", "close_session", "length")
SAVING_VERBS = {
    CACHE_VERBS: ("seq_save", "seq_load"),
    SESSION_VERBS: ("save_session", "load_session"),
}


def verbs(target, completing) -> tuple[Callable, ...]:
    """(clone, rewind, remove, length) of a cache or of an executor's sessions, taken from
    `completing` (the target seen through an `Observed` log)."""
    names = kind_of(target)
    return tuple(getattr(completing, name) for name in names)


def saving_verbs(target, completing) -> tuple[Callable, Callable]:
    """(save, load) of the target, from `completing`: `save(seq, start)` gives a `SeqState`,
    `load(state, onto, **clone)` a new sequence (an executor's `load_session` takes the
    clone's `sampling` and `drawn`; a cache's `seq_load` takes none); ConfigError naming
    what is missing when the target lacks them (a host tier needs them)."""
    names = SAVING_VERBS[kind_of(target)]
    missing = [name for name in names if not callable(getattr(target, name, None))]
    if missing:
        raise ConfigError(
            f"a host tier (host_bytes) needs the target to save and load sequences; "
            f"{short_repr(target)} has no {', '.join(missing)}"
        )
    return getattr(completing, names[0]), getattr(completing, names[1])


def kind_of(target) -> tuple[str, ...]:
    """CACHE_VERBS or SESSION_VERBS: the verbs `target` answers, else ConfigError."""
    for names in (CACHE_VERBS, SESSION_VERBS):
        if all(callable(getattr(target, name, None)) for name in names):
            return names
    raise ConfigError(
        f"a prefix cache needs a cache ({', '.join(CACHE_VERBS)}) or an executor "
        f"({', '.join(SESSION_VERBS)}); {short_repr(target)} has neither"
    )


def check_salt(salt) -> str | None:
    """`salt` when it is None or a str, else ConfigError naming it."""
    if salt is not None and not isinstance(salt, str):
        raise ConfigError(f"cache_salt must be a str or None, got {short_repr(salt)}")
    return salt


def as_tokens(tokens, empty: bool = False) -> np.ndarray:
    """`tokens` as a 1-d int64 array, or ConfigError naming them."""
    array = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    if array.ndim != 1 or (array.dtype.kind not in "iu" and len(array)):
        raise ConfigError(f"tokens must be a 1-d list of token ids, got {short_repr(tokens)}")
    if array.dtype.kind == "u" and len(array) and array.max() > np.iinfo(np.int64).max:
        raise ConfigError(f"token ids must fit int64, got {short_repr(tokens)}")
    if not len(array) and not empty:
        raise ConfigError("tokens must hold at least one token id, got none")
    return array.astype(np.int64, copy=False)
