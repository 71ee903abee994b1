"""Reading an `.npz` of plain arrays without trusting it (numba-free): what the trace file
(`numbakv.trace.file`) and the saved-state file (`numbakv.core.seq_file`, docs/contract.md §13)
share.

An `.npz` is a zip of `.npy` members. `read` opens one and hands the archive to a reader
of its kind (a `Kind`: its name in messages, its error class, what to do about a bad file),
turning every refusal into that error, naming the file and the reason. The reader takes its
members through `members` and `read_array` / `read_json`, which refuse, before anything is
allocated, what numpy's writer never writes: another file type, an encrypted member or a
compression method other than stored/deflate, a member that would expand past deflate's
limit, an `.npy` header whose shape needs more (or fewer) bytes than the member holds, a
dtype or shape other than the expected one (object dtypes, i.e. pickles, included), text
that is not UTF-32 or not strict JSON.
"""

import json
import math
import os
import stat
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

import numpy as np
from numpy.lib.format import read_array_header_1_0, read_array_header_2_0, read_magic

from numbakv.core.values import short_repr

T = TypeVar("T")
METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
MAX_DEFLATE_RATIO = 1032  # deflate expands a stream by at most this factor
NPY_VERSIONS = {(1, 0): read_array_header_1_0, (2, 0): read_array_header_2_0}
CHUNK = 1 << 20  # bytes read from a member at a time
# what a damaged zip raises from zipfile and zlib (reading it or its members)
ZIP_ERRORS = (
    zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError,
    struct.error, OSError,
)  # fmt: skip
# what numpy's .npy header parser raises on a damaged header (tokenize: its Python 2 fallback)
HEADER_ERRORS = (ValueError, TypeError, KeyError, SyntaxError, RecursionError, tokenize.TokenError)
Shape = tuple[int | None, ...]  # an expected shape: None where any length will do


class Refused(Exception):
    """An archive or member its writer never writes (the message says which)."""


@dataclass(frozen=True)
class Kind:
    """A kind of `.npz` file, as its messages name it.

    noun     : "trace": "no trace file at PATH", "PATH is not a readable numbakv trace"
    contents : what one holds, e.g. "13 arrays": "a trace is an .npz of 13 arrays"
    error    : the exception class every refusal is raised as
    advice   : what to do about a file that is not readable, e.g. "record it again"
    """

    noun: str
    contents: str
    error: type[Exception]
    advice: str


def read(path, kind: Kind, reader: Callable[[zipfile.ZipFile, int], T]) -> T:
    """`reader(archive, size)` on the `.npz` at `path` (`size`: the file's bytes), its
    `Refused` and every damaged-zip error raised as `kind.error` naming the file and the
    reason, as are a missing file, a folder and a file that cannot be read."""
    path = Path(path)
    noun, error_class = kind.noun, kind.error
    try:
        if path.exists() and not (path.is_dir() or stat.S_ISREG(path.stat().st_mode)):
            raise Refused("it is not a regular file")  # a fifo, /dev/zero: read forever
        with open(path, "rb") as file:
            return _read(file, kind, reader)
    except FileNotFoundError:
        raise error_class(f"no {noun} file at {path}; check the path") from None
    except IsADirectoryError:
        raise error_class(f"{path} is a folder, not a {noun} file; give the .npz file") from None
    except PermissionError as error:
        raise error_class(f"cannot read {path} ({error.strerror}); check its permissions") from None
    except Refused as error:
        message = f"{path} is not a readable numbakv {noun} ({error}); {kind.advice}"
        raise error_class(message) from None
    except ZIP_ERRORS as error:
        message = f"{path} is not a readable numbakv {noun} ({reason(error)}); {kind.advice}"
        raise error_class(message) from None


def _read(file: IO[bytes], kind: Kind, reader: Callable[[zipfile.ZipFile, int], T]) -> T:
    if file.read(6) == b"\x93NUMPY":
        raise Refused(f"it is a single .npy array; a {kind.noun} is an .npz of {kind.contents}")
    file.seek(0)
    size = os.fstat(file.fileno()).st_size
    with zipfile.ZipFile(file) as archive:
        return reader(archive, size)


def reason(error: BaseException) -> str:
    """'Type: message' of `error`, cut to 200 characters."""
    return f"{type(error).__name__}: {error}"[:200]


def members(
    archive: zipfile.ZipFile, size: int, required: Sequence[str],
    optional: Collection[str] | None = (), deflate: bool = True,
) -> dict[str, zipfile.ZipInfo]:  # fmt: skip
    """{name: ZipInfo} of the members `name.npy` of `required` (each must be there) and of
    `optional` (other members are ignored), or with `optional` None of every member (each
    must be an .npy); each once, unencrypted, stored or (when `deflate`) deflated, and
    plausible in a file of `size` bytes."""
    found: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if optional is None and not info.filename.endswith(".npy"):
            raise Refused(f"it holds a member {short_repr(info.filename)}, not an .npy")
        if optional is None or (name in (*required, *optional) and info.filename.endswith(".npy")):
            if name in found:
                raise Refused(f"it holds two {info.filename} members")
            found[name] = info
    missing = [f"{name}.npy" for name in required if name not in found]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise Refused(f"it has no {missing[0]} member{more}")
    ratio = {zipfile.ZIP_STORED: 1}
    if deflate:
        ratio[zipfile.ZIP_DEFLATED] = MAX_DEFLATE_RATIO
    for info in found.values():
        if info.flag_bits & 0x1:
            raise Refused(f"member {info.filename} is encrypted")
        if info.compress_type not in ratio:
            raise Refused(
                f"member {info.filename} uses compression method {info.compress_type}, "
                f"not {' or '.join(f'{METHODS[m]} ({m})' for m in ratio)}"
            )
        most = ratio[info.compress_type] * info.compress_size
        if info.compress_size > size or info.file_size > most:
            raise Refused(
                f"member {info.filename} claims {info.file_size} bytes from "
                f"{info.compress_size} stored bytes, in a file of {size}"
            )
    return found


def check_array(archive: zipfile.ZipFile, info: zipfile.ZipInfo, dtype, shape: Shape) -> None:
    """Refused unless member `info` is an .npy of `dtype` and `shape` (None: any length)
    whose data fills the member; reads its header only."""
    with archive.open(info) as member:
        _header(member, info, (np.dtype(dtype), shape))


def read_array(archive: zipfile.ZipFile, info: zipfile.ZipInfo, dtype, shape: Shape) -> np.ndarray:
    """The array in member `info`: an .npy of `dtype` and `shape` (None: any length), its
    header checked against them and the member's size before the data is read."""
    return _read_member(archive, info, (np.dtype(dtype), shape))


def read_json(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> object:
    """The JSON value of member `info` (the text member `name`: a 0-d str array), strict: no
    NaN or Infinity."""
    text = _read_member(archive, info, None)
    try:
        little = np.ascontiguousarray(text, dtype=text.dtype.newbyteorder("<"))
        return json.loads(little.tobytes().decode("utf-32-le").rstrip("\x00"), parse_constant=_nan)
    except (ValueError, RecursionError) as error:
        raise Refused(f"its {name} is not JSON: {reason(error)}") from None


def _nan(constant: str) -> None:
    raise ValueError(f"{constant} is not strict JSON")


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, want) -> np.ndarray:
    """The array in member `info`, of `want` ((dtype, shape), or None: a 0-d str)."""
    with archive.open(info) as member:
        shape, fortran_order, dtype, n_bytes = _header(member, info, want)
        data = np.empty(n_bytes, dtype=np.uint8)
        view, n_read = memoryview(data), 0
        # in chunks of 1 MiB: a zip member's readinto reads a bytes object of the chunk first
        while n_read < n_bytes and (got := member.readinto(view[n_read : n_read + CHUNK])):
            n_read += got
        if n_read != n_bytes or member.read(1):  # reading to the end checks the CRC
            raise Refused(f"member {info.filename} ends early")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape))
    return flat.reshape(shape[::-1]).T if fortran_order else flat.reshape(shape)


def _header(member: IO[bytes], info: zipfile.ZipInfo, want) -> tuple:
    """(shape, fortran_order, dtype, data bytes) of the .npy header at the start of
    `member`, checked against `want` ((dtype, shape), or None: a 0-d str) and against the
    bytes the member holds; the member is left at the start of the data."""
    try:
        version = read_magic(member)
        if version not in NPY_VERSIONS:
            raise Refused(f"member {info.filename} is .npy version {version}, not 1.0/2.0")
        shape, fortran_order, dtype = NPY_VERSIONS[version](member)
    except HEADER_ERRORS as error:
        raise Refused(f"member {info.filename}: {reason(error)}") from None
    if dtype.hasobject:
        raise Refused(f"member {info.filename} holds Python objects (a pickle); refused")
    if want is None:
        is_expected, expected = dtype.kind == "U" and shape == (), "a str"
    else:
        want_dtype, want_shape = want
        is_expected = (
            dtype == want_dtype
            and len(shape) == len(want_shape)
            and all(n is None or n == m for n, m in zip(want_shape, shape, strict=True))
        )
        if all(n is None for n in want_shape):
            expected = f"{want_dtype} with {len(want_shape)} dims"
        else:
            expected = f"{want_dtype} of shape {want_shape}"
    if not is_expected:
        raise Refused(f"member {info.filename} is {dtype} with shape {shape}, not {expected}")
    start = member.tell()
    n_bytes = math.prod(shape) * dtype.itemsize
    if min(shape, default=0) < 0 or start + n_bytes != info.file_size:
        raise Refused(
            f"member {info.filename} declares shape {shape} of {dtype} ({n_bytes} bytes) "
            f"but holds {info.file_size - start} bytes of data"
        )
    return shape, fortran_order, dtype, n_bytes
