"""`OpLog`: record what a scheduler does to a cache as an op script, to replay it later
against the reference (`numbakv.testing.replay`).

    log = OpLog(numbakv.CellCache(config))     # hand `log` to the scheduler instead
    ...                                        # serve as usual
    log.save("oplog.json")                     # then: numbakv replay oplog.json --against ...

The file, its ops and what reading it back refuses: `numbakv.testing.oplog_file`. A state
the cache loads that no logged `seq_save` made (a file of another process, a host tier's
copy) is written beside the log, `oplog.states/<i>.npz`, and named by its load op.
"""

import json
import operator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from numbakv.core.seq_state import SeqState
from numbakv.testing.op import Op
from numbakv.testing.oplog_file import (
    FORMAT,
    PARAMETERS,
    STATES,
    TABLE_VERBS,
    VERSION,
    _dtype_name,
)


def _recorded(verb: str):
    """OpLog's method `verb` (a table verb): the cache's, recorded (`OpLog._verb`)."""

    def call(self, *args, **kwargs):
        return self._verb(verb, args, kwargs)

    params = ", ".join(PARAMETERS[verb]).replace("upto", "upto=None")
    call.__name__, call.__doc__ = verb, f"The cache's `{verb}({params})`, recorded."
    return call


class OpLog:
    """A transparent proxy of `cache` (a numbakv cache or any `CacheUnderTest`) that records
    the verbs called through it as `Op`s (`ops`, a list[Op]).

    Every attribute passes through to the cache, and every call passes on all its positional
    and keyword arguments (`prepare_step(width, stream=s)`, `attend(..., out=o)`). The table
    verbs are recorded with their arguments (by position or by the protocol's names) before
    the call, and kept whether the cache accepts or refuses them: refusals are part of the
    contract. `declare_step(seq_ids)` directly followed by `prepare_step(width)` is one
    `Op("step", (seq_ids, width, 1, seed))`, seed the op's index (a replayed step writes and
    attends synthetic K/V drawn from it, one query head per KV head); a refused declaration
    is a step of width None.

    A declaration stays pending, as in the cache (docs/contract.md §3), until a prepare
    consumes it or a successful seq_clone, seq_rm, rewind or clear drops it. A call between
    it and its prepare (refused or not) first records it as `Op("declare", (ids,))`; the
    prepare is then `Op("prepare", (width,))`, as is a prepare with nothing declared, and the
    step's `write`s and `attend`s are recorded as `Op("write", ...)` and `Op("attend", ...)`
    (synthetic K/V and q of the shapes given). Not recorded: the K/V and queries themselves,
    the writes and attends of a step op, and calls whose arguments are not JSON scalars.
    """

    def __init__(self, cache):
        self.cache = cache
        self.ops: list[Op] = []
        self._pending = False  # whether the cache holds a declaration
        self._declared = None  # its ids: a tuple of ints, a scalar, or _UNRECORDABLE
        self._flushed = False  # whether `ops` already declares it (a declare op, a step op)
        self._record_kv = True  # False while the cache's step is a step op's (K/V implied)
        self._saved: dict[int, tuple[int, SeqState]] = {}  # id(state) -> (save op, state)

    def __getattr__(self, name: str):
        return getattr(self.cache, name)

    seq_new, seq_clone, seq_rm, rewind, clear = (_recorded(verb) for verb in PARAMETERS)

    def declare_step(self, *args, **kwargs) -> None:
        """The cache's `declare_step(seq_ids)`; recorded with the `prepare_step` that
        follows, or at once when the cache refuses it or a declaration is pending."""
        (seq_ids,) = _bind(("seq_ids",), args, kwargs) or (_UNRECORDABLE,)
        ids, pending = _ids(seq_ids), self._flush()
        try:
            result = self.cache.declare_step(*args, **kwargs)
        except Exception:  # refused (or crashed): a pending declaration stays
            if isinstance(ids, tuple) and not pending:
                self._record("step", ids, None, 1, len(self.ops))
            else:
                self._record("declare", ids)
            raise
        self._pending, self._declared, self._record_kv = True, ids, True
        self._flushed = not isinstance(ids, tuple)
        if self._flushed:  # a scalar the cache took
            self._record("declare", ids)
        return result

    def prepare_step(self, *args, **kwargs):
        """The cache's `prepare_step(width)`: a step op of a declaration not yet recorded,
        else a prepare op (a refused one keeps the declaration, as the cache does)."""
        (width,) = _bind(("width",), args, kwargs, required=0)
        width, granular = _plain(width), True
        if width is _UNRECORDABLE or (self._pending and self._declared is _UNRECORDABLE):
            granular = False
        elif self._pending and not self._flushed:
            self._record("step", self._declared, width, 1, len(self.ops))
            self._flushed, granular = True, False  # replayed, the step op declares it
        else:
            self._record("prepare", width)
        step = self.cache.prepare_step(*args, **kwargs)
        self._pending, self._declared, self._record_kv = False, None, granular
        return step

    def write(self, *args, **kwargs) -> None:
        """The cache's `write(layer, k, v)`, recorded unless the step is a step op's (as
        K/V of k's rows, and its dtype when not float32)."""
        bound = _bind(("layer", "k", "v"), args, kwargs)
        self._flush()
        if bound and self._record_kv and np.ndim(bound[1]) >= 1:
            dtype = _dtype_name(getattr(bound[1], "dtype", None))
            extra = () if dtype in (None, "float32") else (dtype,)
            self._record("write", _plain(bound[0]), np.shape(bound[1])[0], len(self.ops), *extra)
        return self.cache.write(*args, **kwargs)

    def attend(self, *args, **kwargs):
        """The cache's `attend(layer, q, scale=None, mode=...)`, recorded unless the step is
        a step op's (as a q of q's rows and heads; scale and mode null when not given)."""
        bound = _bind(("layer", "q", "scale", "mode"), args, kwargs, required=2)
        self._flush()
        if bound and self._record_kv and np.ndim(bound[1]) >= 2:
            layer, q, scale, mode = bound
            rows, n_heads = np.shape(q)[:2]
            scale, mode = _plain(scale), _plain(mode)
            if not isinstance(scale, bool | str) and (mode is None or isinstance(mode, str)):
                self._record("attend", _plain(layer), rows, n_heads, len(self.ops), scale, mode)
        return self.cache.attend(*args, **kwargs)

    def seq_save(self, *args, **kwargs) -> SeqState:
        """The cache's `seq_save(seq, start=0)`, recorded (a load of the state it returns
        names this save op)."""
        bound = _bind(("seq", "start"), args, kwargs, required=1)
        self._flush()
        index = sum(op.verb == "save" for op in self.ops)
        start = 0 if bound is None or bound[1] is None else _plain(bound[1])
        recorded = bound is not None and self._record("save", _plain(bound[0]), start)
        state = self.cache.seq_save(*args, **kwargs)
        if recorded:
            self._saved[id(state)] = (index, state)  # the state kept: its id stays its own
        return state

    def seq_load(self, *args, **kwargs) -> int:
        """The cache's `seq_load(state, onto=None, convert=False)`, recorded: its source the
        save op that made `state`, else the state itself (written beside the log)."""
        bound = _bind(("state", "onto", "convert"), args, kwargs, required=1)
        self._flush()
        if bound is not None:
            state, onto, convert = bound
            index, saved = self._saved.get(id(state), (None, None))
            source = index if saved is state else state
            extra = () if convert is None else (_plain(convert),)
            if isinstance(source, int) or isinstance(state, SeqState):
                self._record("load", source, _plain(onto), *extra)
        seq = self.cache.seq_load(*args, **kwargs)
        self._pending, self._declared, self._record_kv = False, None, True  # a table change
        return seq

    def save(self, path) -> None:
        """Writes the config and the ops to `path` as JSON (`oplog_file`), and the states
        loaded that no logged save made to `<path stem>.states/<i>.npz` beside it."""
        path = Path(path)
        folder = path.with_name(path.stem + STATES)
        ops = []
        for i, op in enumerate(self.ops):
            args = list(op.args)
            if op.verb == "load" and isinstance(args[0], SeqState):
                folder.mkdir(exist_ok=True)
                args[0].save(folder / f"{i}.npz")  # named by its op: a second save rewrites
                args[0] = f"{folder.name}/{i}.npz"
            ops.append([op.verb, args])
        document = {
            "format": FORMAT,
            "version": VERSION,
            "config": asdict(self.cache.config),
            "ops": ops,
        }
        path.write_text(json.dumps(document, separators=(",", ":")) + "\n")

    def _verb(self, verb: str, args: tuple, kwargs: dict):
        bound = _bind(PARAMETERS[verb], args, kwargs, required=1 if verb == "seq_clone" else None)
        self._flush()
        if bound is not None:
            upto_omitted = verb == "seq_clone" and bound[1] is None
            self._record(verb, *(_plain(a) for a in bound[: 1 if upto_omitted else None]))
        result = getattr(self.cache, verb)(*args, **kwargs)
        if verb in TABLE_VERBS:  # succeeded: the cache dropped the declaration, the step
            self._pending, self._declared, self._record_kv = False, None, True
        return result

    def _flush(self) -> bool:
        """Records a pending declaration not yet in `ops` as a declare op (a call comes
        between it and its prepare); whether one is pending."""
        if self._pending and not self._flushed:
            self._record("declare", self._declared)
            self._flushed = True
        return self._pending

    def _record(self, verb: str, *args) -> bool:
        """Appends Op(verb, args) unless an arg cannot be recorded; whether it did."""
        if any(a is _UNRECORDABLE for a in args):
            return False
        self.ops.append(Op(verb, args))
        return True


_UNRECORDABLE = object()


def _bind(names: tuple, args: tuple, kwargs: dict, required: int | None = None):
    """The values of the protocol parameters `names` from a call's arguments (missing ones
    None, at least `required` given, default all), or None when they cannot be told."""
    if len(args) > len(names) or any(name in kwargs for name in names[: len(args)]):
        return None
    values = (*args, *(kwargs.get(name) for name in names[len(args) :]))
    given = len(args) + sum(name in kwargs for name in names[len(args) :])
    return values if given >= (len(names) if required is None else required) else None


def _plain(value):
    """`value` as a JSON scalar (NumPy scalars converted), or _UNRECORDABLE."""
    if value is None or isinstance(value, bool | float | str):
        return value
    if isinstance(value, np.bool_ | np.floating | np.str_):
        return value.item()
    try:
        return operator.index(value)
    except TypeError:
        return _UNRECORDABLE


def _ids(seq_ids):
    """Declared ids as a tuple of ints, a JSON scalar (a hostile declaration), else
    _UNRECORDABLE."""
    if isinstance(seq_ids, str) or _plain(seq_ids) is not _UNRECORDABLE:
        return _plain(seq_ids)
    try:
        ids = tuple(seq_ids)
        return tuple(_UNRECORDABLE if isinstance(i, bool | np.bool_) else operator.index(i)
                     for i in ids)  # fmt: skip
    except TypeError:  # not iterable, or an id that is not an integer
        return _UNRECORDABLE
