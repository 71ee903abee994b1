"""The `.npz` trace file: its arrays, writing one, and reading one without trusting it
(numba-free).

A trace file is a zip of `.npy` members: `header.npy` (a JSON string: the format and the
cache's config), one member per entry of ARRAYS and, from format 2 on, `annotations.npy`
(a JSON string: the list of annotations, each `{"frame": int, "kind": str, "data": {...}}`,
in recording order). Format 1 files (no annotations) still load, with none.
`read_trace_file` refuses, before it allocates anything, what `Trace.save` never writes:
another file type, an encrypted member or a compression method other than stored/deflate,
a member that would expand past deflate's limit, an `.npy` header whose shape needs more
(or fewer) bytes than the member holds, a dtype other than the expected one (object
dtypes, i.e. pickles, included), text that is not UTF-32 or not strict JSON.
`numbakv.trace.checks` then holds the arrays to the cell table's invariants and the
annotations to theirs.
"""

import dataclasses
import json
import math
import os
import reprlib
import struct
import tokenize
import zipfile
import zlib
from pathlib import Path

import numpy as np
from numpy.lib.format import read_array_header_1_0, read_array_header_2_0, read_magic

from numbakv.config import CacheConfig
from numbakv.errors import CacheError, TraceError
from numbakv.observe import EVENTS

FORMAT = "numbakv-trace/2"  # what `Trace.save` writes
FORMATS = ("numbakv-trace/1", FORMAT)  # what `read_trace_file` reads; /1 has no annotations
FRAME_EVENTS = ("start", *EVENTS)
STEP_EVENT = FRAME_EVENTS.index("prepare_step")

# name -> (dtype, dimensions after the first); every array of a trace, as saved
ARRAYS = {
    "events": (np.uint8, 0),  # [n_frames] index into FRAME_EVENTS
    "read_len": (np.int32, 0),  # [n_frames]
    "rows": (np.int32, 0),  # [n_frames]
    "live": (np.bool_, 1),  # [n_frames, max_seqs]
    "delta_offsets": (np.int64, 0),  # [n_frames + 1] frame f's changes: [offsets[f], offsets[f+1])
    "delta_cells": (np.int32, 0),  # [n_changes] cell index
    "delta_pos": (np.int32, 0),  # [n_changes] its new position
    "delta_owners": (np.uint64, 1),  # [n_changes, n_owner_words] its new owners
    "step_offsets": (np.int64, 0),  # [n_frames + 1] frame f's step rows (empty unless a step)
    "step_cells": (np.int32, 0),  # [n_rows]
    "step_positions": (np.int32, 0),  # [n_rows]
    "step_seq_ids": (np.int32, 0),  # [n_rows]
}
MEMBERS = ("header", *ARRAYS)  # every trace file's
TEXT_MEMBERS = ("header", "annotations")  # 0-d str members, each a JSON text
MAX_DEFLATE_RATIO = 1032  # deflate expands a stream by at most this factor
NPY_VERSIONS = {(1, 0): read_array_header_1_0, (2, 0): read_array_header_2_0}
# what a damaged zip raises from zipfile and zlib (reading it or its members)
ZIP_ERRORS = (
    zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError,
    struct.error, OSError,
)  # fmt: skip
# what numpy's .npy header parser raises on a damaged header (tokenize: its Python 2 fallback)
HEADER_ERRORS = (ValueError, TypeError, KeyError, SyntaxError, RecursionError, tokenize.TokenError)
ADVICE = "record it again (Recorder.save or `numbakv demo --trace`)"


def write_trace_file(path, config: CacheConfig, arrays: dict[str, np.ndarray],
                     annotations: list[dict]) -> None:  # fmt: skip
    """Writes one compressed `.npz` of FORMAT: the header (format and config), `arrays` (those
    of ARRAYS) and `annotations` (`{"frame", "kind", "data"}` dicts, strict JSON)."""
    header = json.dumps({"format": FORMAT, "config": dataclasses.asdict(config)})
    text = np.array(json.dumps(annotations, allow_nan=False))
    np.savez_compressed(path, header=np.array(header), annotations=text, **arrays)


def read_trace_file(path) -> tuple[CacheConfig, dict[str, np.ndarray], object]:
    """(config, arrays, annotations) of the trace file at `path`: arrays as ARRAYS names them
    (not yet checked against each other: `check_arrays` does that), annotations as parsed
    from the JSON (not yet checked: `annotation_records` does that; [] for format 1);
    TraceError for anything else."""
    path = Path(path)
    try:
        header, arrays, annotations = _read(path)
    except FileNotFoundError:
        raise TraceError(f"no trace file at {path}; check the path") from None
    except IsADirectoryError:
        raise TraceError(f"{path} is a folder, not a trace file; give the .npz file") from None
    except PermissionError as error:
        raise TraceError(f"cannot read {path} ({error.strerror}); check its permissions") from None
    except _Refused as error:
        raise TraceError(f"{path} is not a readable numbakv trace ({error}); {ADVICE}") from None
    except ZIP_ERRORS as error:
        reason = _reason(error)
        raise TraceError(f"{path} is not a readable numbakv trace ({reason}); {ADVICE}") from None
    try:
        config = CacheConfig(**header["config"])
    except (CacheError, TypeError, ValueError, KeyError, RecursionError) as error:
        raise TraceError(f"{path} holds a bad cache config ({_reason(error)}); {ADVICE}") from None
    return config, arrays, annotations


class _Refused(Exception):
    """An archive or member that `Trace.save` never writes (the message says which)."""


def short(value: object) -> str:
    """`repr(value)`, cut short: a hostile file's values may be huge or deeply nested."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:200]


def _read(path: Path) -> tuple[dict, dict[str, np.ndarray], object]:
    """(the parsed JSON header, the arrays, the parsed JSON annotations) of the archive at
    `path`; the header's format is one of FORMATS and the members are that format's."""
    with open(path, "rb") as file:
        if file.read(6) == b"\x93NUMPY":
            raise _Refused(
                f"it is a single .npy array; a trace is an .npz of {len(MEMBERS)} arrays"
            )
        file.seek(0)
        size = os.fstat(file.fileno()).st_size
        with zipfile.ZipFile(file) as archive:
            members = _members(archive, size)
            header = _json("header", _read_member(archive, members["header"], "header"))
            if not isinstance(header, dict) or header.get("format") not in FORMATS:
                found = header.get("format") if isinstance(header, dict) else header
                formats = " or ".join(FORMATS)
                raise _Refused(f"its header names format {short(found)}, not {formats}")
            has_annotations = header["format"] != FORMATS[0]
            if has_annotations != ("annotations" in members):
                raise _Refused(
                    f"a {header['format']} file has "
                    f"{'an' if has_annotations else 'no'} annotations.npy member; this one "
                    f"{'lacks it' if has_annotations else 'has one'}"
                )
            arrays = {name: _read_member(archive, members[name], name) for name in ARRAYS}
            annotations = []
            if has_annotations:
                text = _read_member(archive, members["annotations"], "annotations")
                annotations = _json("annotations", text)
    return header, arrays, annotations


def _json(name: str, text: np.ndarray) -> object:
    """The JSON value of a text member (a 0-d str array), strict: no NaN or Infinity."""
    try:
        little = np.ascontiguousarray(text, dtype=text.dtype.newbyteorder("<"))
        return json.loads(little.tobytes().decode("utf-32-le").rstrip("\x00"), parse_constant=_nan)
    except (ValueError, RecursionError) as error:
        raise _Refused(f"its {name} is not JSON: {_reason(error)}") from None


def _nan(constant: str) -> None:
    raise ValueError(f"{constant} is not strict JSON")


def _members(archive: zipfile.ZipFile, size: int) -> dict[str, zipfile.ZipInfo]:
    """The ZipInfo of each of MEMBERS and of annotations.npy when there is one, once each,
    each plausible in a file of `size` bytes."""
    found: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if name in (*MEMBERS, "annotations") and info.filename.endswith(".npy"):
            if name in found:
                raise _Refused(f"it holds two {info.filename} members")
            found[name] = info
    missing = [f"{name}.npy" for name in MEMBERS if name not in found]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise _Refused(f"it has no {missing[0]} member{more}")
    ratio = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: MAX_DEFLATE_RATIO}
    for info in found.values():
        if info.flag_bits & 0x1:
            raise _Refused(f"member {info.filename} is encrypted")
        if info.compress_type not in ratio:
            raise _Refused(
                f"member {info.filename} uses compression method {info.compress_type}, "
                "not stored (0) or deflate (8)"
            )
        most = ratio[info.compress_type] * info.compress_size
        if info.compress_size > size or info.file_size > most:
            raise _Refused(
                f"member {info.filename} claims {info.file_size} bytes from "
                f"{info.compress_size} stored bytes, in a file of {size}"
            )
    return found


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> np.ndarray:
    """The array in member `info` (the .npy of `name`): its header checked against ARRAYS
    and the member's size before the data is read."""
    with archive.open(info) as member:
        try:
            version = read_magic(member)
            if version not in NPY_VERSIONS:
                raise _Refused(f"member {info.filename} is .npy version {version}, not 1.0/2.0")
            shape, fortran_order, dtype = NPY_VERSIONS[version](member)
        except HEADER_ERRORS as error:
            raise _Refused(f"member {info.filename}: {_reason(error)}") from None
        if dtype.hasobject:
            raise _Refused(f"member {info.filename} holds Python objects (a pickle); refused")
        if name in TEXT_MEMBERS:
            is_expected, want = dtype.kind == "U" and shape == (), "a str"
        else:
            want_dtype, n_dims = np.dtype(ARRAYS[name][0]), ARRAYS[name][1] + 1
            is_expected = dtype == want_dtype and len(shape) == n_dims
            want = f"{want_dtype} with {n_dims} dims"
        if not is_expected:
            raise _Refused(f"member {info.filename} is {dtype} with shape {shape}, not {want}")
        start = member.tell()
        n_bytes = math.prod(shape) * dtype.itemsize
        if min(shape, default=0) < 0 or start + n_bytes != info.file_size:
            raise _Refused(
                f"member {info.filename} declares shape {shape} of {dtype} ({n_bytes} bytes) "
                f"but holds {info.file_size - start} bytes of data"
            )
        data = bytearray(member.read(n_bytes))
        if len(data) != n_bytes or member.read(1):  # reading to the end checks the CRC
            raise _Refused(f"member {info.filename} ends early")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape))
    return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)
