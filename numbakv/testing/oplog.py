"""`OpLog`: record what a scheduler does to a cache as an op script, to replay it later
against the reference (`numbakv.testing.replay`).

    log = OpLog(numbakv.CellCache(config))     # hand `log` to the scheduler instead
    ...                                        # serve as usual
    log.save("oplog.json")                     # then: numbakv replay oplog.json --against ...

The file is JSON: {"format": "numbakv-oplog", "version": 1, "config": {CacheConfig
fields}, "ops": [[verb, args], ...]}; `load_ops` reads it back.
"""

import json
import operator
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from numbakv.config import CacheConfig
from numbakv.errors import CacheError
from numbakv.testing.ops import MODES, VERBS, Op

FORMAT, VERSION = "numbakv-oplog", 1
ARITY = {"seq_new": (0,), "seq_clone": (1, 2), "seq_rm": (1,), "rewind": (2,), "clear": (0,),
         "step": (4, 5)}  # fmt: skip
TABLE_VERBS = ("seq_clone", "seq_rm", "rewind", "clear")  # those that drop a declaration


class OpLog:
    """A transparent proxy of `cache` (a numbakv cache or any `CacheUnderTest`) that records
    the verbs called through it as `Op`s (`ops`, a list[Op]).

    Every attribute passes through to the cache. `seq_new`, `seq_clone(src, upto=None)`,
    `seq_rm(seq)`, `rewind(seq, position)` and `clear()` are recorded with their arguments
    before the call, and kept whether the cache accepts or refuses them: refusals are part
    of the contract. `declare_step(seq_ids)` then `prepare_step(width)` is recorded as one
    `Op("step", (seq_ids, width, 1, seed))` with seed = the op's index in the log; a refused
    declaration is recorded as a step of width None (it is refused again on replay).

    Not recorded: the step's K/V and queries (a replayed step writes and attends synthetic
    K/V drawn from its seed, with one query head per KV head), `prepare_step` with nothing
    declared, and calls whose arguments are not JSON scalars (ints, floats, bools, strings,
    None). Write and attend calls pass through unrecorded.
    """

    def __init__(self, cache):
        self.cache = cache
        self.ops: list[Op] = []
        self._declared: tuple[int, ...] | None = None

    def __getattr__(self, name: str):
        return getattr(self.cache, name)

    def seq_new(self) -> int:
        """The cache's `seq_new()`, recorded."""
        return self._call("seq_new")

    def seq_clone(self, src, upto=None) -> int:
        """The cache's `seq_clone(src, upto)`, recorded (upto None: the whole of src)."""
        return self._call("seq_clone", src) if upto is None else self._call("seq_clone", src, upto)

    def seq_rm(self, seq) -> None:
        """The cache's `seq_rm(seq)`, recorded."""
        return self._call("seq_rm", seq)

    def rewind(self, seq, position) -> None:
        """The cache's `rewind(seq, position)`, recorded."""
        return self._call("rewind", seq, position)

    def clear(self) -> None:
        """The cache's `clear()`, recorded."""
        return self._call("clear")

    def declare_step(self, seq_ids) -> None:
        """The cache's `declare_step(seq_ids)`; recorded with the `prepare_step` that
        follows, or at once as a refused step when the cache refuses it."""
        ids = _ids(seq_ids)
        try:
            result = self.cache.declare_step(seq_ids)
        except CacheError:
            if ids is not None:
                self.ops.append(Op("step", (ids, None, 1, len(self.ops))))
            raise
        self._declared = ids
        return result

    def prepare_step(self, width=None):
        """The cache's `prepare_step(width)`, recorded as a step of the pending declaration
        (a refused one keeps the declaration, as the cache does)."""
        width_arg = _plain(width)
        if self._declared is None or width_arg is _UNRECORDABLE:
            return self.cache.prepare_step(width)
        self.ops.append(Op("step", (self._declared, width_arg, 1, len(self.ops))))
        step = self.cache.prepare_step(width)
        self._declared = None
        return step

    def save(self, path) -> None:
        """Writes the config and the ops to `path` as JSON (see the module docstring)."""
        document = {
            "format": FORMAT,
            "version": VERSION,
            "config": asdict(self.cache.config),
            "ops": [[op.verb, list(op.args)] for op in self.ops],
        }
        Path(path).write_text(json.dumps(document, separators=(",", ":")) + "\n")

    def _call(self, verb: str, *args):
        plain = tuple(_plain(a) for a in args)
        if _UNRECORDABLE not in plain:
            self.ops.append(Op(verb, plain))
        if verb in TABLE_VERBS:
            self._declared = None  # the cache drops it too (even when refusing, harmlessly)
        return getattr(self.cache, verb)(*args)


_UNRECORDABLE = object()


def _plain(value):
    """`value` as a JSON scalar (NumPy scalars converted), or _UNRECORDABLE."""
    if value is None or isinstance(value, bool | float | str):
        return value
    if isinstance(value, np.bool_ | np.floating):
        return value.item()
    try:
        return operator.index(value)
    except TypeError:
        return _UNRECORDABLE


def _ids(seq_ids) -> tuple[int, ...] | None:
    """The declared ids as a tuple of ints, or None when they are not all integers."""
    try:
        ids = tuple(seq_ids)
    except TypeError:
        return None
    if any(isinstance(i, bool | np.bool_) for i in ids):
        return None
    try:
        return tuple(operator.index(i) for i in ids)
    except TypeError:
        return None


def load_ops(path) -> tuple[CacheConfig, list[Op]]:
    """The (CacheConfig, ops) of an op log saved by `OpLog.save`; ValueError naming the file
    and what is wrong when it is not one."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read it as JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f'{path}: not a numbakv op log (no "format": "{FORMAT}")')
    if document.get("version") != VERSION:
        raise ValueError(f"{path}: version {document.get('version')!r}, this numbakv reads 1")
    return _config(path, document.get("config")), _ops(path, document.get("ops"))


def _config(path, config) -> CacheConfig:
    names = {f.name for f in fields(CacheConfig)}
    if not isinstance(config, dict) or not set(config) <= names:
        raise ValueError(f"{path}: config must be an object of CacheConfig fields {sorted(names)}")
    if isinstance(config.get("windows"), list):
        config = {**config, "windows": tuple(config["windows"])}
    try:
        return CacheConfig(**config)
    except (TypeError, CacheError) as error:
        raise ValueError(f"{path}: bad config ({error})") from None


def _ops(path, ops) -> list[Op]:
    if not isinstance(ops, list):
        raise ValueError(f'{path}: "ops" must be a list of [verb, args]')
    return [_op(path, i, entry) for i, entry in enumerate(ops)]


def _op(path, i: int, entry) -> Op:
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
        raise ValueError(f"{path}: op {i} is {entry!r}, not [verb, [args]]")
    verb, args = entry
    if verb not in VERBS:
        raise ValueError(f"{path}: op {i} has verb {verb!r}; give one of {VERBS}")
    if len(args) not in ARITY[verb]:
        raise ValueError(f"{path}: op {i} ({verb}) has {len(args)} args, not {ARITY[verb]}")
    if verb != "step":
        if any(isinstance(a, list | dict) for a in args):
            raise ValueError(f"{path}: op {i} ({verb}) has a non-scalar arg in {args!r}")
        return Op(verb, tuple(args))
    ids, width, group, seed, *mode = args
    ints = isinstance(ids, list) and all(type(x) is int for x in ids)
    counts = all(type(x) is int and x >= n for x, n in ((group, 1), (seed, 0)))
    modes = all(m in MODES for m in mode)
    if not ints or not counts or not modes or isinstance(width, list | dict):
        raise ValueError(
            f"{path}: op {i} (step) needs [[ids], width or null, group >= 1, seed >= 0] and "
            f"optionally a mode of {MODES}, got {args!r}"
        )
    return Op("step", (tuple(ids), width, group, seed, *mode))
