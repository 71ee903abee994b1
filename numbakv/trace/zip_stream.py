"""A zip archive of members deflated as they grow, on one background thread: how a
`Recorder` writes its trace file without deflating the whole trace when it saves
(numba-free).

A `Stream` takes a member's body in chunks, in order, and deflates each on the module's
worker thread as it arrives (zlib lets go of the GIL while it deflates, so the recording
thread runs on beside it). `Stream.finish` puts the member's head in front (an `.npy`
header, known only once the body's length is) and gives the member as `Deflated`:
`write_zip` writes those as one archive that `zipfile` and numpy read, zip64 where a size
or an offset needs it. The head is deflated on its own and ends on a full flush (byte
aligned, not the last block), so the body's deflate stream follows it as one stream; the
CRC-32 of both comes from theirs (`crc32_combine`, zlib's). Each hand-off's part of the
body ends on a sync flush, so `Stream.contents` can inflate the parts so far whole, and a
chunk the worker fails to deflate is kept as it came, with those after it.
"""

import contextlib
import io
import os
import struct
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

import numpy as np

# every member's zlib level, by measurement: the trace of `benchmarks.record_large --scale
# gpu --steps 2000` (34 MiB of arrays) deflates in 0.83 s to 4.2 MiB at numpy's 6, in 0.20 s
# to 4.7 MiB at 2 and in 0.20 s to 5.8 MiB at 1; every member deflates 2.5:1 or better, so
# none is stored
LEVEL = 2
ZIP64_FROM = 0xFFFFFFFF  # a size or offset from here on is written in a zip64 extra field
_WIDE = 0xFFFFFFFF  # what the 32-bit field of such a value holds
# chunks go to the worker once a stream's waiting ones hold this much: each deflate call
# takes the GIL back from the recording thread when it returns, so fewer, longer calls
# (a recorder's batch is tens of KiB a column) disturb that thread less
HANDOFF_BYTES = 1 << 20
_DOS_DATE = (1 << 5) | 1  # 1980-01-01, zipfile's date for a member without one
_worker: ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


@dataclass(frozen=True)
class Deflated:
    """A member ready to write: its deflate stream (in parts), CRC-32 and size inflated."""

    parts: list[bytes]
    crc: int
    size: int


class Stream:
    """One member's deflate stream, its body appended chunk by chunk and deflated on the
    worker thread in the order appended."""

    def __init__(self):
        self._deflate = None  # zlib's state (256 KiB), made when the first chunk is deflated
        self._parts: list[bytes] = []
        self._crc = self._size = 0
        self._error: BaseException | None = None
        self._waiting: list[np.ndarray] = []  # chunks appended, not yet handed to the worker
        self._waiting_bytes = 0
        self._kept: list[np.ndarray] = []  # the chunks from the first that failed on, raw

    def append(self, chunk: np.ndarray) -> None:
        """Deflates `chunk` (a C-contiguous array its owner no longer changes) after every
        chunk appended before it."""
        self._waiting.append(chunk)
        self._waiting_bytes += chunk.nbytes
        if self._waiting_bytes >= HANDOFF_BYTES:
            self._hand_off()

    def finish(self, head: bytes) -> Deflated:
        """The member `head` + every chunk appended so far; appending may go on after. It
        waits for the worker to deflate what is queued before (other streams' chunks
        too). A chunk the worker failed to deflate fails this stream for good: every
        `finish` raises that error."""
        self._hand_off()
        parts, crc, size = _submit(self._end).result()
        if self._error is not None:
            raise self._error
        deflate = _raw_deflate()
        first = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
        crc = crc32_combine(zlib.crc32(head), crc, size)
        return Deflated([first, *parts], crc, len(head) + size)

    def contents(self) -> bytes:
        """Every byte appended so far (the body, no head), once the worker is done with what
        was queued before: the deflated chunks inflated, then those kept as they came from
        the first that failed to deflate on (which `finish` raises, and this does not)."""
        self._hand_off()
        parts, kept = _submit(lambda: (list(self._parts), list(self._kept))).result()
        inflate = zlib.decompressobj(-15)
        body = [inflate.decompress(part) for part in parts]
        return b"".join([*body, *(chunk.tobytes() for chunk in kept)])

    def _hand_off(self) -> None:
        if self._waiting:
            _submit(self._deflate_chunks, self._waiting)
            self._waiting, self._waiting_bytes = [], 0

    def _deflate_chunks(self, chunks: list[np.ndarray]) -> None:
        if self._error is None:
            try:
                flat = [c.reshape(-1).view(np.uint8) for c in chunks]
                chunk = flat[0] if len(flat) == 1 else np.concatenate(flat)
                deflate = self._compressor()
                # a sync flush ends each hand-off's part on a byte boundary, all of it out:
                # `contents` inflates the parts whole whatever fails after them
                self._parts.append(deflate.compress(chunk) + deflate.flush(zlib.Z_SYNC_FLUSH))
                self._crc = zlib.crc32(chunk, self._crc)
                self._size += chunk.nbytes
                return
            except BaseException as error:  # raised by `finish`, on the caller's thread
                self._error = error
        self._kept.extend(chunks)

    def _end(self) -> tuple[list[bytes], int, int]:
        return [*self._parts, self._compressor().copy().flush()], self._crc, self._size

    def _compressor(self):
        if self._deflate is None:
            self._deflate = _raw_deflate()
        return self._deflate


def _raw_deflate():
    """A deflate stream at LEVEL, raw (no zlib header or trailer: zip's own)."""
    return zlib.compressobj(LEVEL, zlib.DEFLATED, -15)


def deflated(array: np.ndarray) -> Deflated:
    """The `.npy` member of `array`: the bytes `np.save` writes, deflated."""
    stream = Stream()
    stream.append(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return stream.finish(npy_head(array.shape, array.dtype))


def npy_head(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The `.npy` header `np.save` writes for a C-ordered array of `shape` and `dtype`."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def write_zip(file: IO[bytes], members: dict[str, Deflated]) -> None:
    """Writes `members` (name -> member, in order) as a zip archive to the binary `file`
    from where it stands: what zipfile writes of deflated members, zip64 only where
    needed, offsets counted from the file's start (as zipfile counts them)."""
    directory, offset = [], _position(file)
    for name, member in members.items():
        encoded, size = name.encode(), sum(len(part) for part in member.parts)
        big = max(member.size, size) >= ZIP64_FROM  # both sizes go in the local zip64 extra
        extra = struct.pack("<HHQQ", 1, 16, member.size, size) if big else b""
        local = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 45 if big else 20, 0, 0, 8, 0,
                            _DOS_DATE, member.crc, *([_WIDE] * 2 if big else [size, member.size]),
                            len(encoded), len(extra)) + encoded + extra  # fmt: skip
        file.write(local)
        for part in member.parts:
            file.write(part)
        directory.append(_central(encoded, member, size, offset))
        offset += len(local) + size
    _write_directory(file, directory, offset)


def _position(file: IO[bytes]) -> int:
    """Where `file` stands: 0 for a stream that cannot tell."""
    try:
        return file.tell()
    except (AttributeError, OSError):
        return 0


def _central(name: bytes, member: Deflated, size: int, offset: int) -> bytes:
    """The central directory's entry of `member` (`size` bytes deflated, at `offset`): a
    zip64 extra holds whichever of its sizes and offset need it, in zip's order."""
    wide = [value for value in (member.size, size, offset) if value >= ZIP64_FROM]
    extra = struct.pack(f"<HH{len(wide)}Q", 1, 8 * len(wide), *wide) if wide else b""
    version = 45 if wide else 20
    return struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", version, 3, version, 0, 0, 8, 0,
                       _DOS_DATE, member.crc, *(_narrow(v) for v in (size, member.size)),
                       len(name), len(extra), 0, 0, 0, 0o600 << 16, _narrow(offset)
                       ) + name + extra  # fmt: skip


def _narrow(value: int) -> int:
    """A 32-bit field's value: `value`, or _WIDE where a zip64 extra holds it."""
    return _WIDE if value >= ZIP64_FROM else value


def _write_directory(file: IO[bytes], directory: list[bytes], start: int) -> None:
    """The central directory (`directory`, an entry a member) at offset `start`, and its end
    records (zip64's where a count, size or offset needs it)."""
    size = sum(len(entry) for entry in directory)
    for entry in directory:
        file.write(entry)
    count = len(directory)
    if count >= 0xFFFF or size >= ZIP64_FROM or start >= ZIP64_FROM:
        file.write(struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count,
                               size, start))  # fmt: skip
        file.write(struct.pack("<4sLQL", b"PK\x06\x07", 0, start + size, 1))
        count, size, start = min(count, 0xFFFF), _WIDE, _WIDE
    file.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, size, start, 0))


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """zlib.crc32(a + b) from crc1 = zlib.crc32(a), crc2 = zlib.crc32(b) and len2 = len(b)
    (zlib's crc32_combine: crc1 times x^(8 len2) modulo the CRC-32 polynomial, plus crc2)."""
    power, square, n = 1 << 31, _times(1 << 30, 1 << 30), len2  # x^0; x^2; bytes to go
    square = _times(_times(square, square), _times(square, square))  # x^8: one byte
    while n:
        if n & 1:
            power = _times(square, power)
        square, n = _times(square, square), n >> 1
    return _times(power, crc1) ^ crc2


def _times(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial, bits reflected as zlib keeps them (a != 0)."""
    m, product = 1 << 31, 0
    while True:
        if a & m:
            product ^= b
            if not a & (m - 1):
                return product
        m >>= 1
        b = (b >> 1) ^ 0xEDB88320 if b & 1 else b >> 1


def _submit(fn, *args) -> Future:
    """`fn(*args)` on the one worker thread every stream deflates on (started when first
    wanted), after every job submitted before; run here and now once the interpreter is
    shutting down (an `atexit` handler's save), when no thread may start."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(1, thread_name_prefix="numbakv-deflate")
        try:
            return _worker.submit(fn, *args)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
            _worker.shutdown(wait=True)  # what it has queued goes first
            done: Future = Future()
            done.set_result(fn(*args))
            return done


def _before_fork() -> None:
    """Empties the worker's queue before a fork: a child starts with every stream's
    chunks deflated and no deflate half done (its parent's worker does not go with it)."""
    _worker_lock.acquire()
    if _worker is not None:
        with contextlib.suppress(RuntimeError):  # shut down: its queue is empty
            _worker.submit(int).result()


def _after_fork_in_parent() -> None:
    _worker_lock.release()


def _after_fork_in_child() -> None:
    global _worker, _worker_lock
    _worker, _worker_lock = None, threading.Lock()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
