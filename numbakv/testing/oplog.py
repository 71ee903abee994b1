"""`OpLog`: record what a scheduler does to a cache as an op script, to replay it later
against the reference (`numbakv.testing.replay`).

    log = OpLog(numbakv.CellCache(config))     # hand `log` to the scheduler instead
    ...                                        # serve as usual
    log.save("oplog.json")                     # then: numbakv replay oplog.json --against ...

The file is JSON: {"format": "numbakv-oplog", "version": 1, "config": {CacheConfig
fields}, "ops": [[verb, [args]], ...]}, the ops of `numbakv.testing.ops` (a verb's ids and
positions, widths and layers may be any JSON scalar, declared ids any ints: a hostile one
replays as a refusal):

    ["seq_new", []], ["seq_clone", [src]], ["seq_clone", [src, upto]], ["seq_rm", [seq]],
    ["rewind", [seq, position]], ["clear", []]
    ["step", [[ids], width, group, seed]], ["step", [[ids], width, group, seed, mode]]
    ["declare", [[ids]]] or ["declare", [id]]   declare_step(ids); a scalar is refused
    ["prepare", [width]]                        prepare_step(width)
    ["write", [layer, rows, seed]], ["write", [layer, rows, seed, dtype]]
    ["attend", [layer, rows, n_heads, seed, scale, mode]]   scale, mode: null or a value
    ["read", [field]], ["read", ["mask", window]]

`load_ops` reads it back and refuses, with a ValueError naming the file, anything else and
anything a replay could not hold: a file past MAX_LOG_BYTES, a config whose cache
(`CacheConfig.device_bytes()`) or an op whose synthetic K/V or q would pass `max_bytes`
(MAX_REPLAY_BYTES), a group past MAX_GROUP query heads per KV head, a seed past 2**64.
"""

import json
import operator
import os
import reprlib
import stat
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from numbakv.config import CacheConfig
from numbakv.testing.ops import MODES, Op
from numbakv.testing.protocol import LAYOUT_FIELDS, SEMANTIC_FIELDS

FORMAT, VERSION = "numbakv-oplog", 1
ARITY = {"seq_new": (0,), "seq_clone": (1, 2), "seq_rm": (1,), "rewind": (2,), "clear": (0,),
         "step": (4, 5), "declare": (1,), "prepare": (1,), "write": (3, 4), "attend": (6,),
         "read": (1, 2)}  # fmt: skip
PARAMETERS = {"seq_new": (), "seq_clone": ("src", "upto"), "seq_rm": ("seq",),
              "rewind": ("seq", "position"), "clear": ()}  # fmt: skip
TABLE_VERBS = ("seq_clone", "seq_rm", "rewind", "clear")  # those that drop a declaration
READ_FIELDS = (*SEMANTIC_FIELDS, *(f for f in LAYOUT_FIELDS if f != "mask"), "is_stale", "windows")
MAX_LOG_BYTES = 2**28  # 256 MiB of JSON: some 10 million ops
MAX_REPLAY_BYTES = 2**30  # what one replayed cache, or one op's synthetic array, may take
MAX_GROUP = 256  # query heads per KV head: past any model's (Llama 3.1 405B has 16)
SEEDS = 2**64
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 40
_show = _REPR.repr  # a value in a message, cut short


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

    def save(self, path) -> None:
        """Writes the config and the ops to `path` as JSON (see the module docstring)."""
        document = {
            "format": FORMAT,
            "version": VERSION,
            "config": asdict(self.cache.config),
            "ops": [[op.verb, list(op.args)] for op in self.ops],
        }
        Path(path).write_text(json.dumps(document, separators=(",", ":")) + "\n")

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

    def _record(self, verb: str, *args) -> None:
        if _UNRECORDABLE not in args:
            self.ops.append(Op(verb, args))


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


def _dtype_name(dtype) -> str | None:
    """A write op's dtype: the name of a bool, int, float or complex dtype (bfloat16 with
    ml_dtypes), else None."""
    if dtype is None or (isinstance(dtype, str) and len(dtype) > 16):
        return None
    try:
        if isinstance(dtype, str) and dtype == "bfloat16":
            import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
        dtype = np.dtype(dtype)
    except Exception:  # no ml_dtypes; TypeError, or what a hostile name makes NumPy raise
        return None
    return dtype.name if dtype.kind in "biufc" or dtype.name == "bfloat16" else None


def load_ops(path, max_bytes: int = MAX_REPLAY_BYTES) -> tuple[CacheConfig, list[Op]]:
    """The (CacheConfig, ops) of an op log saved by `OpLog.save`; ValueError naming the file
    and what is wrong when it is not one, or when replaying it would take more than
    `max_bytes` at once (see the module docstring)."""
    document = _json(path)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f'{path}: not a numbakv op log (no "format": "{FORMAT}")')
    version = document.get("version")
    if type(version) is not int or version != VERSION:
        raise ValueError(f"{path}: version {_show(version)}, this numbakv reads {VERSION}")
    config = _config(path, document.get("config"), max_bytes)
    ops = document.get("ops")
    if not isinstance(ops, list):
        raise ValueError(f'{path}: "ops" must be a list of [verb, args]')
    return config, [_op(path, i, entry, config, max_bytes) for i, entry in enumerate(ops)]


def _json(path):
    """The JSON document in the file at `path`, or ValueError."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            with open(path, "rb") as file:
                data = file.read(MAX_LOG_BYTES + 1)
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror or error})") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"{path}: is a folder; give the op log in it")
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: not a regular file; give an op log")
    if len(data) > MAX_LOG_BYTES:
        raise ValueError(f"{path}: larger than {MAX_LOG_BYTES:,} bytes; record a shorter log")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path}: cannot read it as JSON (nested too deep)") from None
    except ValueError as error:  # not UTF-8, not JSON, an int of too many digits
        raise ValueError(f"{path}: cannot read it as JSON ({error})") from None


def check_config_bytes(config: CacheConfig, max_bytes: int = MAX_REPLAY_BYTES) -> None:
    """ValueError when a cache of `config` takes more than `max_bytes` at full capacity
    (`CacheConfig.device_bytes()`: the pool, masks and tables a replay may come to hold)."""
    total = config.device_bytes()["total"]
    if total > max_bytes:
        raise ValueError(
            f"a cache of this config takes {total:,} bytes at capacity (CacheConfig."
            f"device_bytes()), more than the {max_bytes:,} a replay holds; replay a log of a "
            "smaller config (capacity, n_layers, n_kv_heads, head_dim), or pass max_bytes"
        )


def _config(path, config, max_bytes: int) -> CacheConfig:
    names = {f.name for f in fields(CacheConfig)}
    if not isinstance(config, dict) or not set(config) <= names:
        raise ValueError(f"{path}: config must be an object of CacheConfig fields {sorted(names)}")
    if isinstance(config.get("windows"), list):
        config = {**config, "windows": tuple(config["windows"])}
    try:
        made = CacheConfig(**config)
        check_config_bytes(made, max_bytes)
    except Exception as error:  # ConfigError, TypeError (a field missing), ValueError
        raise ValueError(f"{path}: bad config ({error})") from None
    return made


def _op(path, i: int, entry, config: CacheConfig, max_bytes: int) -> Op:
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
        raise ValueError(f"{path}: op {i} is {_show(entry)}, not [verb, [args]]")
    verb, args = entry
    if not isinstance(verb, str) or verb not in ARITY:
        raise ValueError(f"{path}: op {i} has verb {_show(verb)}; give one of {tuple(ARITY)}")
    if len(args) not in ARITY[verb]:
        raise ValueError(f"{path}: op {i} ({verb}) has {len(args)} args, not {ARITY[verb]}")
    if not _valid(verb, args, config):
        needs = f"needs {NEEDS[verb]}" if verb in NEEDS else "has a non-scalar arg"
        raise ValueError(f"{path}: op {i} ({verb}) {needs}, got {_show(args)}")
    for shape, what in _arrays(verb, args, config):
        size = 4 * int(np.prod(shape, dtype=object))
        if size > max_bytes:
            raise ValueError(
                f"{path}: op {i} ({verb}) would make {what} {list(shape)} float32, {size:,} "
                f"bytes, more than max_bytes={max_bytes:,}; no model's step is that large"
            )
    if verb in ("step", "declare") and isinstance(args[0], list):
        args = [tuple(args[0]), *args[1:]]
    return Op(verb, tuple(args))


NEEDS = {  # what load_ops takes for each op's args (the table verbs' are JSON scalars)
    "step": f"[[ids], width or null, group in [1, {MAX_GROUP}], seed in [0, 2**64)] and "
            f"optionally a mode of {MODES}",
    "declare": "[[ids]] (ints) or [a scalar]",
    "prepare": "[width], a scalar",
    "write": "[layer, rows >= 0, seed in [0, 2**64)] and optionally a numeric dtype's name",
    "attend": f"[layer, rows >= 0, n_heads in [0, {MAX_GROUP} x n_kv_heads], seed in "
              "[0, 2**64), scale null or a number, mode null or a string]",
    "read": f'[a field of {READ_FIELDS}] or ["mask", window]',
}  # fmt: skip


def _valid(verb: str, args: list, config: CacheConfig) -> bool:
    """Whether `args` are what `NEEDS[verb]` says."""
    if verb in PARAMETERS or verb == "prepare":
        return all(map(_scalar, args))
    if verb == "declare":
        return _scalar(args[0]) or _int_list(args[0])
    if verb == "step":
        ids, width, group, seed, *mode = args
        return (_int_list(ids) and _scalar(width) and _count(group, 1, MAX_GROUP + 1)
                and _count(seed, 0, SEEDS) and all(m in MODES for m in mode))  # fmt: skip
    if verb == "write":
        layer, rows, seed, *dtype = args
        return (_scalar(layer) and _count(rows, 0, 2**63) and _count(seed, 0, SEEDS)
                and all(isinstance(d, str) and _dtype_name(d) == d for d in dtype))  # fmt: skip
    if verb == "attend":
        layer, rows, n_heads, seed, scale, mode = args
        heads = MAX_GROUP * config.n_kv_heads
        return (_scalar(layer) and _count(rows, 0, 2**63) and _count(n_heads, 0, heads + 1)
                and _count(seed, 0, SEEDS) and (scale is None or type(scale) in (int, float))
                and (mode is None or isinstance(mode, str)))  # fmt: skip
    field, *window = args  # read
    return (field == "mask" and len(window) == 1 and _scalar(window[0])) or (
        not window and field in READ_FIELDS
    )


def _arrays(verb: str, args: list, config: CacheConfig) -> list[tuple[tuple, str]]:
    """The float32 arrays a replay of the op makes before the cache sees them: (shape, what)."""
    kv_heads, head_dim = config.n_kv_heads, config.head_dim
    if verb == "step":  # at most max_width rows, once prepared
        return [((config.max_width, args[2] * kv_heads, head_dim), "a q of")]
    if verb == "write":
        return [((3, args[1], kv_heads, head_dim), "K, V and q of")]
    if verb == "attend":
        return [((args[1], args[2], head_dim), "a q of")]
    return []


def _scalar(x) -> bool:
    return x is None or isinstance(x, bool | int | float | str)


def _int_list(x) -> bool:
    return isinstance(x, list) and all(type(i) is int for i in x)


def _count(x, low: int, high: int) -> bool:
    return type(x) is int and low <= x < high
