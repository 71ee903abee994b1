"""`numbakv.trace.zip_stream`: the CRC-32 of a head and a body combined is zlib's of both;
a member deflated in chunks on the worker thread inflates to the head and the chunks, and
zipfile and numpy read the archive, zip64 included, written at a file's position too; an
error on the worker thread is raised by `finish`; a forked child finishes what its parent
appended, and a save at interpreter exit deflates in place."""

import io
import os
import struct
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv import load_trace
from numbakv.trace import zip_stream
from numbakv.trace.zip_stream import Stream, crc32_combine, deflated, npy_head, write_zip


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_crc32_combine_is_zlibs_crc_of_both(a, b):
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_crc32_combine_over_a_long_body():
    a, b = b"head", np.random.default_rng(0).bytes(3 << 20)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def archive(members: dict) -> zipfile.ZipFile:
    out = io.BytesIO()
    write_zip(out, members)
    return zipfile.ZipFile(io.BytesIO(out.getvalue()))


@pytest.mark.parametrize("zip64_from", [zip_stream.ZIP64_FROM, 0, 200])
def test_members_streamed_in_chunks_read_back_with_zipfile_and_numpy(monkeypatch, zip64_from):
    monkeypatch.setattr(zip_stream, "ZIP64_FROM", zip64_from)  # zip64 for every size, or some
    rng = np.random.default_rng(1)
    chunks = [rng.integers(0, 50, size=n, dtype=np.int32) for n in (0, 7, 1000, 1, 300)]
    stream = Stream()
    for chunk in chunks:
        stream.append(chunk)
    joined = np.concatenate(chunks)
    live = rng.random((9, 70)) < 0.5
    members = {
        "cells.npy": stream.finish(npy_head(joined.shape, joined.dtype)),
        "live.npy": deflated(live),
        "text.npy": deflated(np.array('{"format": "x"}')),
        "empty.npy": Stream().finish(npy_head((0,), np.dtype(np.int64))),
    }
    with archive(members) as zipped:
        assert zipped.testzip() is None  # every CRC matches
        assert [i.filename for i in zipped.infolist()] == list(members)
        assert {i.compress_type for i in zipped.infolist()} == {zipfile.ZIP_DEFLATED}
        loaded = {i.filename: np.load(io.BytesIO(zipped.read(i))) for i in zipped.infolist()}
    np.testing.assert_array_equal(loaded["cells.npy"], joined)
    np.testing.assert_array_equal(loaded["live.npy"], live)
    assert loaded["text.npy"][()] == '{"format": "x"}' and loaded["empty.npy"].shape == (0,)


def test_a_stream_finished_goes_on_and_finishes_again():
    stream = Stream()
    stream.append(np.arange(5, dtype=np.int32))
    first = stream.finish(npy_head((5,), np.dtype(np.int32)))
    assert stream.contents() == np.arange(5, dtype=np.int32).tobytes()
    stream.append(np.arange(5, 8, dtype=np.int32))
    second = stream.finish(npy_head((8,), np.dtype(np.int32)))
    assert stream.contents() == np.arange(8, dtype=np.int32).tobytes()
    with archive({"a.npy": first, "b.npy": second}) as zipped:
        np.testing.assert_array_equal(np.load(io.BytesIO(zipped.read("a.npy"))), np.arange(5))
        np.testing.assert_array_equal(np.load(io.BytesIO(zipped.read("b.npy"))), np.arange(8))


def test_an_error_on_the_worker_thread_is_raised_by_finish_and_loses_no_byte(monkeypatch):
    monkeypatch.setattr(zip_stream, "HANDOFF_BYTES", 1)  # each chunk handed off at once
    stream = Stream()
    chunks = [
        np.arange(6, dtype=np.int32),  # deflated
        np.arange(4, dtype=np.int32)[::2],  # not contiguous: zlib refuses it
        np.arange(3, dtype=np.int32),  # kept as it came, after the failure
    ]
    for chunk in chunks:
        stream.append(chunk)
    for _ in range(2):  # for good
        with pytest.raises((BufferError, ValueError, TypeError)):
            stream.finish(b"")
    assert stream.contents() == b"".join(np.ascontiguousarray(c).tobytes() for c in chunks)


def test_offsets_count_from_the_files_start_when_it_is_written_at_a_position():
    out = io.BytesIO()
    out.write(b"8 bytes!")
    write_zip(out, {"a.npy": deflated(np.arange(3))})
    data = out.getvalue()
    directory_at = struct.unpack("<L", data[-6:-2])[0]  # the end record's directory offset
    assert directory_at == data.index(b"PK\x01\x02")
    with zipfile.ZipFile(io.BytesIO(data)) as zipped:
        np.testing.assert_array_equal(np.load(io.BytesIO(zipped.read("a.npy"))), np.arange(3))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with a worker thread
def test_a_forked_child_finishes_what_was_appended_before_the_fork(tmp_path):
    body = np.random.default_rng(2).integers(0, 9, size=8 << 20, dtype=np.uint8)
    stream = Stream()
    stream.append(body)  # handed to the worker, perhaps still deflating at the fork
    pid = os.fork()
    if pid == 0:  # the child: its own worker, the parent's chunks all deflated
        code = 1
        try:
            with open(tmp_path / "child.zip", "wb") as file:
                write_zip(file, {"body.npy": stream.finish(npy_head(body.shape, body.dtype))})
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    with zipfile.ZipFile(tmp_path / "child.zip") as zipped:
        np.testing.assert_array_equal(np.load(io.BytesIO(zipped.read("body.npy"))), body)


def test_a_save_at_interpreter_exit_deflates_in_place(tmp_path):
    path = tmp_path / "exit.npz"
    code = (
        "import atexit\n"
        "import numpy as np\n"
        "from numbakv import CacheConfig, Recorder\n"
        "from numbakv.reference import CellCache\n"
        "cache = CellCache(CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, capacity=16,\n"
        "                              max_width=4, max_seqs=2, max_seq_len=16))\n"
        "recorder = Recorder(cache)\n"
        "seq = cache.seq_new()\n"
        "cache.declare_step([seq] * 3)\n"
        "cache.prepare_step()\n"
        f"atexit.register(recorder.save, {str(path)!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert load_trace(path).n_frames == 2
