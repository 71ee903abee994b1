"""The saved-state file (docs/contract.md §13): one `.npz` of plain arrays that
`SeqState.save` writes and `SeqState.load` reads without trusting it (numba-free). Below
`numbakv.core.seq_state`: it reads a file into the fields of a state, and the state is
made from them there.

Its members, each an `.npy`:

    header        a JSON string (0-d str): {"magic": MAGIC, "version": VERSION,
                  "geometry": `Geometry.as_dict()` (tuples as lists), "n_tokens": n,
                  "start": s, "checksums": {member: sha256 hex}}: a checksum of every
                  other member (its array's bytes in C order) and of "header" (the rest of
                  the header as canonical JSON, `header_checksum`): which members there are
                  is sealed too
    positions     [n] int32: s, s + 1, ..., s + n - 1
    tokens        only when the state has them: [s + n] int64, the token ids of positions
                  0 .. s + n - 1
    k_<i>, v_<i>  [n, n_kv_heads, row_width] of layer i's K (V) format's array dtype
                  (`numbakv.core.formats`: ARRAY_DTYPES, row_width), entry j for positions[j]

Written stored, not deflated: K/V bytes hardly compress. `read_state` refuses with a
StateError naming the file and the reason, before any K/V is allocated, what `write_state`
never writes: the damaged and hostile archives and members `numbakv.core.npz` refuses, a header
that is not such an object (another magic or version, a missing or extra field, a value of
another type, a geometry no cache has: `geometry_fields`), a member missing or extra for
the geometry's layers, a member whose dtype or shape is not what the header implies; and,
reading them, positions that are not consecutive and a member or header whose checksum
disagrees.
"""

import hashlib
import json
import os
import re
import zipfile
from typing import Protocol

import numpy as np

from numbakv.core import npz
from numbakv.core.config import INT32_MAX, CacheConfig
from numbakv.core.errors import CacheError, StateError
from numbakv.core.formats import ARRAY_DTYPES, row_width
from numbakv.core.paths import new_file
from numbakv.core.values import short_repr

VERSION = 1  # of the state (`SeqState.version`) and of its file
MAGIC = "numbakv-seqstate"
GEOMETRY_FIELDS = ("n_layers", "n_kv_heads", "head_dim", "windows", "formats", "fp8_scales")
FIELDS = ("magic", "version", "geometry", "n_tokens", "start")  # the header's, beside checksums
ADVICE = "save the sequence again (cache.seq_save(seq).save(path))"
KIND = npz.Kind("state", "a header, positions and each layer's K and V", StateError, ADVICE)
SHA256 = re.compile("[0-9a-f]{64}")


def member_names(n_layers: int, has_tokens: bool) -> tuple[str, ...]:
    """Every member of a state file of `n_layers` layers, with tokens or not (names without
    .npy), in writing order."""
    layers = (f"{which}_{layer}" for layer in range(n_layers) for which in "kv")
    return ("header", "positions", *(("tokens",) if has_tokens else ()), *layers)


def checksum(array: np.ndarray) -> str:
    """The sha256 hex digest of `array`'s bytes in C order."""
    return hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8)).hexdigest()


def header_checksum(header: dict) -> str:
    """The sha256 hex digest of `header` less its own checksum (checksums["header"]) as
    canonical JSON: keys sorted, no spaces."""
    others = {name: sha for name, sha in header["checksums"].items() if name != "header"}
    text = json.dumps(header | {"checksums": others}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False)  # fmt: skip
    return hashlib.sha256(text.encode()).hexdigest()


def state_path(path) -> "os.PathLike":
    """`path` (a str or an os.PathLike) as given, else StateError naming it."""
    if not isinstance(path, str | os.PathLike):
        raise StateError(f"a state's path is a str or a path, got {short_repr(path)}")
    return path


class Saved(Protocol):
    """What `write_state` reads of a state: `SeqState`'s fields (this module is below it)."""

    version: int
    geometry: object  # a Geometry: `as_dict()` and `n_layers`
    positions: np.ndarray
    tokens: np.ndarray | None
    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    start: int

    @property
    def n_tokens(self) -> int: ...


def write_state(path, state: Saved) -> None:
    """Writes `state` to `path` (any name: no suffix is added) as one stored `.npz`: its
    header, positions ([n] int32), tokens when it has them ([end] int64) and each layer's K
    and V ([n, n_kv_heads, row_width] of their storage dtypes); StateError for a folder, a
    missing folder or a failed write."""
    path = new_file(state_path(path), error=StateError)
    arrays = {"positions": state.positions}
    if state.tokens is not None:
        arrays["tokens"] = state.tokens
    for layer in range(state.geometry.n_layers):
        arrays |= {f"k_{layer}": state.k[layer], f"v_{layer}": state.v[layer]}
    fields = {
        "magic": MAGIC, "version": state.version, "geometry": state.geometry.as_dict(),
        "n_tokens": state.n_tokens, "start": state.start,
    }  # fmt: skip
    header = fields | {"checksums": {name: checksum(array) for name, array in arrays.items()}}
    header["checksums"]["header"] = header_checksum(header)
    text = json.dumps(header, allow_nan=False)
    partial = path.with_name(f".{path.name}.partial")  # a failed write keeps the old file
    try:
        with open(partial, "wb") as file:
            np.savez(file, header=np.array(text), **arrays)
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise StateError(f"cannot write {path} ({error.strerror}); check the folder") from None


Fields = tuple[
    dict, np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...], int, np.ndarray | None
]


def read_state(path) -> Fields:
    """(geometry, positions, k, v, start, tokens) of the state in the file at `path`, those
    of the state `write_state` wrote there: the geometry's fields as `Geometry` holds them
    (`geometry_fields`), positions [n] int32, k and v per layer [n, n_kv_heads, row_width]
    of the layer's K (V) array dtype, tokens None or [start + n] int64; every array
    C-contiguous. StateError naming the file and the reason for a missing, damaged,
    hostile or inconsistent file, raised before any K/V is allocated unless the reason is
    in the K/V bytes themselves (their checksum)."""
    return npz.read(state_path(path), KIND, _read)


def _read(archive: zipfile.ZipFile, size: int) -> Fields:
    """The state in `archive` (a file of `size` bytes): the header checked, then every
    member's .npy header against it, then the members read and checked one by one."""
    members = npz.members(archive, size, ("header", "positions"), None, deflate=False)
    geometry, n, start, checksums = _header(npz.read_json(archive, members["header"], "header"))
    n_layers = geometry["n_layers"]
    names = member_names(n_layers, "tokens" in checksums)
    extra = [name for name in members if name not in names]
    if extra:
        member = short_repr(f"{extra[0]}.npy")
        raise npz.Refused(f"it holds a member {member}, which a state of {n_layers} layers has not")
    missing = [name for name in names if name not in members]
    if missing:
        raise npz.Refused(f"it has no {missing[0]}.npy member")
    expected = {"positions": (np.dtype(np.int32), (n,))}
    if "tokens" in checksums:
        expected["tokens"] = (np.dtype(np.int64), (start + n,))
    for layer, pair in enumerate(geometry["formats"]):
        for which, fmt in enumerate(pair):
            shape = (n, geometry["n_kv_heads"], row_width(fmt, geometry["head_dim"]))
            expected[f"{'kv'[which]}_{layer}"] = (ARRAY_DTYPES[fmt], shape)
    for name, (dtype, shape) in expected.items():
        npz.check_array(archive, members[name], dtype, shape)
    arrays = {}
    for name, (dtype, shape) in expected.items():
        array = np.ascontiguousarray(npz.read_array(archive, members[name], dtype, shape))
        if name == "positions" and not np.array_equal(array, start + np.arange(n)):
            raise npz.Refused(f"its positions are not {start}, {start + 1}, ... as its header says")
        if checksum(array) != checksums[name]:
            raise npz.Refused(f"member {name}.npy's bytes do not match the header's checksum")
        arrays[name] = array
    k = tuple(arrays[f"k_{layer}"] for layer in range(n_layers))
    v = tuple(arrays[f"v_{layer}"] for layer in range(n_layers))
    return geometry, arrays["positions"], k, v, start, arrays.get("tokens")


def _header(header: object) -> tuple[dict, int, int, dict[str, str]]:
    """(geometry, n_tokens, start, checksums) of a state file's parsed header, each checked;
    npz.Refused naming the first field that is not as `write_state` writes it."""
    if not isinstance(header, dict):
        raise npz.Refused(f"its header is {short_repr(header)}, not a JSON object")
    if header.get("magic") != MAGIC:
        raise npz.Refused(f"its header's magic is {short_repr(header.get('magic'))}, not {MAGIC!r}")
    version = header.get("version")
    if type(version) is not int or version != VERSION:
        raise npz.Refused(
            f"it is a version {short_repr(version)} state; this numbakv reads {VERSION}"
        )
    if sorted(header) != sorted((*FIELDS, "checksums")):
        raise npz.Refused(
            f"its header has the fields {short_repr(sorted(header))}, not {[*FIELDS, 'checksums']}"
        )
    geometry = geometry_fields(header["geometry"])
    n, start = header["n_tokens"], header["start"]
    for name, value in (("n_tokens", n), ("start", start)):
        if type(value) is not int or not 0 <= value <= INT32_MAX:
            raise npz.Refused(
                f"its header's {name} is {short_repr(value)}, not an int in [0, 2**31)"
            )
    if start + n - 1 > INT32_MAX:
        raise npz.Refused(f"its positions {start} .. {start + n - 1} pass int32's {INT32_MAX}")
    checksums = header["checksums"]
    has_tokens = isinstance(checksums, dict) and "tokens" in checksums
    names = member_names(geometry["n_layers"], has_tokens)
    if not isinstance(checksums, dict) or sorted(checksums) != sorted(names):
        found = sorted(checksums) if isinstance(checksums, dict) else checksums
        raise npz.Refused(
            f"its header's checksums are of {short_repr(found)}, not of {short_repr(list(names))}"
        )
    bad = [name for name in names if not isinstance(checksums[name], str)
           or not SHA256.fullmatch(checksums[name])]  # fmt: skip
    if bad:
        raise npz.Refused(f"its header's checksum of {bad[0]} is no sha256 hex digest")
    if header_checksum(header) != checksums["header"]:
        raise npz.Refused("its header does not match its checksum")
    return geometry, n, start, checksums


def geometry_fields(values: object) -> dict:
    """{field: value} of `Geometry` from the header's geometry (`Geometry.as_dict()` with
    lists for tuples, as JSON holds it), as a `CacheConfig` of those fields holds them
    (tuples; fp8_scales [n_layers][2][n_kv_heads] floats); npz.Refused naming the first
    field that is missing or extra, of another type (a bool, a float or a str for an int,
    an int for a float scale) or not a cache's (`CacheConfig`'s bounds: windows >= 0,
    formats of FORMATS, head_dim a multiple of 32 for q8_0 / q4_0, finite positive float32
    fp8 scales)."""
    if not isinstance(values, dict) or sorted(values) != sorted(GEOMETRY_FIELDS):
        found = sorted(values) if isinstance(values, dict) else values
        raise npz.Refused(
            f"its geometry has the fields {short_repr(found)}, not {list(GEOMETRY_FIELDS)}"
        )
    try:
        config = CacheConfig(
            values["n_layers"], values["n_kv_heads"], values["head_dim"], capacity=1,
            max_width=1, max_seqs=1, windows=values["windows"],
            layer_dtypes=values["formats"], fp8_scales=values["fp8_scales"],
        )  # fmt: skip
    except (CacheError, TypeError, ValueError, KeyError, RecursionError) as error:
        raise npz.Refused(f"its geometry is no cache's ({npz.reason(error)})") from None
    fields = {name: getattr(config, name) for name in GEOMETRY_FIELDS}
    for name in GEOMETRY_FIELDS:  # JSON's text of a value tells a bool, an int, a float apart
        if json.dumps(fields[name]) != json.dumps(values[name]):
            raise npz.Refused(
                f"its geometry's {name} is {short_repr(values[name])}, not as a cache holds it: "
                f"{short_repr(fields[name])}"
            )
    return fields
