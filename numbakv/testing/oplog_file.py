"""Reading an op log back (`load_ops`): the file `OpLog.save` writes, checked before anything
of it runs, and the states its `load` ops name beside it.

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
    ["save", [seq, start]]                      seq_save(seq, start=start)
    ["load", [source, onto]], ["load", [source, onto, convert]]   seq_load(state, onto=,
        convert=): source the index of the log's save op whose state it loads (each side
        loads its own), or the name of a state file beside the log ("<log>.states/3.npz")

`load_ops` refuses, with a ValueError naming the file, anything else and anything a replay
could not hold: a file past MAX_LOG_BYTES, a config whose cache
(`CacheConfig.device_bytes()`) or an op whose synthetic K/V or q would pass `max_bytes`
(MAX_REPLAY_BYTES), a group past MAX_GROUP query heads per KV head, a seed past 2**64, a
state file outside the log's folder, missing or damaged (`SeqState.load`).
"""

import json
import os
import stat
from dataclasses import fields
from pathlib import Path

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import StateError
from numbakv.core.seq_state import SeqState
from numbakv.core.values import short_repr
from numbakv.testing.op import Op
from numbakv.testing.ops import MODES
from numbakv.testing.protocol import LAYOUT_FIELDS, SEMANTIC_FIELDS

FORMAT, VERSION = "numbakv-oplog", 1
ARITY = {"seq_new": (0,), "seq_clone": (1, 2), "seq_rm": (1,), "rewind": (2,), "clear": (0,),
         "step": (4, 5), "declare": (1,), "prepare": (1,), "write": (3, 4), "attend": (6,),
         "read": (1, 2), "save": (2,), "load": (2, 3)}  # fmt: skip
PARAMETERS = {"seq_new": (), "seq_clone": ("src", "upto"), "seq_rm": ("seq",),
              "rewind": ("seq", "position"), "clear": ()}  # fmt: skip
TABLE_VERBS = ("seq_clone", "seq_rm", "rewind", "clear")  # those that drop a declaration
READ_FIELDS = (*SEMANTIC_FIELDS, *(f for f in LAYOUT_FIELDS if f != "mask"), "is_stale", "windows")
MAX_LOG_BYTES = 2**28  # 256 MiB of JSON: some 10 million ops
MAX_REPLAY_BYTES = 2**30  # what one replayed cache, or one op's synthetic array, may take
MAX_GROUP = 256  # query heads per KV head: past any model's (Llama 3.1 405B has 16)
SEEDS = 2**64
STATES = ".states"  # the folder beside a log (its stem + this) of the states it loads


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
        raise ValueError(f"{path}: version {short_repr(version)}, this numbakv reads {VERSION}")
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
        raise ValueError(f"{path}: op {i} is {short_repr(entry)}, not [verb, [args]]")
    verb, args = entry
    if not isinstance(verb, str) or verb not in ARITY:
        raise ValueError(f"{path}: op {i} has verb {short_repr(verb)}; give one of {tuple(ARITY)}")
    if len(args) not in ARITY[verb]:
        raise ValueError(f"{path}: op {i} ({verb}) has {len(args)} args, not {ARITY[verb]}")
    if not _valid(verb, args, config):
        needs = f"needs {NEEDS[verb]}" if verb in NEEDS else "has a non-scalar arg"
        raise ValueError(f"{path}: op {i} ({verb}) {needs}, got {short_repr(args)}")
    for shape, what in _arrays(verb, args, config):
        size = 4 * int(np.prod(shape, dtype=object))
        if size > max_bytes:
            raise ValueError(
                f"{path}: op {i} ({verb}) would make {what} {list(shape)} float32, {size:,} "
                f"bytes, more than max_bytes={max_bytes:,}; no model's step is that large"
            )
    if verb in ("step", "declare") and isinstance(args[0], list):
        args = [tuple(args[0]), *args[1:]]
    if verb == "load" and isinstance(args[0], str):
        args = [_state(path, i, args[0], max_bytes), *args[1:]]
    return Op(verb, tuple(args))


def _state(path, i: int, name: str, max_bytes: int) -> SeqState:
    """The state file `name` of op i, in the log's `<stem>.states` folder and nowhere else."""
    folder = Path(path).with_name(Path(path).stem + STATES)
    where = Path(name)
    if where.parent.name != folder.name or len(where.parts) != 2 or where.suffix != ".npz":
        raise ValueError(
            f"{path}: op {i} (load) names {short_repr(name)}; a state lies in {folder.name}/ "
            "beside the log, as <name>.npz"
        )
    file = folder / where.name
    try:
        if file.stat().st_size > max_bytes:
            raise ValueError(f"{path}: op {i} (load): {file} is larger than {max_bytes:,} bytes")
        return SeqState.load(file)
    except (OSError, StateError) as error:
        raise ValueError(f"{path}: op {i} (load): {error}") from None


NEEDS = {  # what load_ops takes for each op's args (the table verbs' are JSON scalars)
    "step": f"[[ids], width or null, group in [1, {MAX_GROUP}], seed in [0, 2**64)] and "
            f"optionally a mode of {MODES}",
    "declare": "[[ids]] (ints) or [a scalar]",
    "prepare": "[width], a scalar",
    "write": "[layer, rows >= 0, seed in [0, 2**64)] and optionally a numeric dtype's name",
    "attend": f"[layer, rows >= 0, n_heads in [0, {MAX_GROUP} x n_kv_heads], seed in "
              "[0, 2**64), scale null or a number, mode null or a string]",
    "read": f'[a field of {READ_FIELDS}] or ["mask", window]',
    "save": "[seq, start], scalars",
    "load": f'[source, onto] or [source, onto, convert]: source a save op\'s index (an int '
            f'>= 0) or "<log>{STATES}/<name>.npz", onto and convert scalars',
}  # fmt: skip


def _valid(verb: str, args: list, config: CacheConfig) -> bool:
    """Whether `args` are what `NEEDS[verb]` says."""
    if verb in PARAMETERS or verb in ("prepare", "save"):
        return all(map(_scalar, args))
    if verb == "load":
        source, *rest = args
        return (_count(source, 0, 2**63) or isinstance(source, str)) and all(map(_scalar, rest))
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
