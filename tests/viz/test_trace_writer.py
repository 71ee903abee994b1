"""`Recorder.save` writes the members `np.savez_compressed` writes, in its order and byte for
byte once inflated, though its columns were deflated chunk by chunk as they grew; only the
deflate level differs (`zip_stream.LEVEL`). A path without .npz gets it, as numpy's does,
and a file numpy wrote at its own level still loads."""

import io
import zipfile

import numpy as np
import pytest

from numbakv import Recorder, load_trace
from numbakv.reference import CellCache
from numbakv.trace import recorder as recorder_module
from numbakv.trace import zip_stream
from numbakv.trace.file import ARRAYS

from helpers import churn, small_config


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array, allow_pickle=False)
    return out.getvalue()


def test_saved_members_are_numpys_chunk_by_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_module, "BATCH_FRAMES", 7)  # many chunks a column
    cache = CellCache(small_config(max_seqs=70, capacity=24, max_width=6))
    recorder = Recorder(cache, every_verb=True)
    churn(cache, list(range(0, 400, 3)))
    recorder.annotate("admit", request=1, seqs=[0, 2])
    recorder.save(tmp_path / "run")
    arrays = recorder.trace().arrays
    with zipfile.ZipFile(tmp_path / "run.npz") as archive:
        infos = archive.infolist()
        members = {info.filename: archive.read(info) for info in infos}
    assert [info.filename for info in infos] == [
        f"{name}.npy" for name in ("header", "annotations", *ARRAYS)
    ]
    assert {info.compress_type for info in infos} == {zipfile.ZIP_DEFLATED}
    for name, array in arrays.items():
        assert members[f"{name}.npy"] == npy_bytes(array), name
    numpys = tmp_path / "numpys.npz"
    np.savez_compressed(numpys, **{n[:-4]: np.load(io.BytesIO(b)) for n, b in members.items()})
    for path in (tmp_path / "run.npz", numpys):
        loaded = load_trace(path)
        assert loaded.annotations == recorder.trace().annotations
        for name, array in arrays.items():
            np.testing.assert_array_equal(loaded.arrays[name], array, err_msg=name)


def test_a_chunk_that_fails_to_deflate_fails_save_but_no_frame_of_trace(tmp_path, monkeypatch):
    """The recorder keeps its columns deflated only; a column whose deflating fails (zlib
    out of memory, here its third hand-off) keeps that chunk and those after it as they
    came, so `trace()` still gives every frame, while each `save` raises the error."""
    monkeypatch.setattr(recorder_module, "BATCH_FRAMES", 7)  # many chunks a column
    monkeypatch.setattr(zip_stream, "HANDOFF_BYTES", 1)  # each handed off at once

    def record() -> Recorder:
        cache = CellCache(small_config(max_seqs=70, capacity=24, max_width=6))
        recorder = Recorder(cache, every_verb=True)
        churn(cache, list(range(0, 400, 3)))
        return recorder

    expected = record().trace().arrays
    deflate, calls = zip_stream._raw_deflate, []

    def failing_third():
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError("zlib: out of memory")
        return deflate()

    monkeypatch.setattr(zip_stream, "_raw_deflate", failing_third)
    recorder = record()
    for _ in range(2):
        with pytest.raises(MemoryError, match="out of memory"):
            recorder.save(tmp_path / "run.npz")
    kept = [name for name, column in recorder._columns.items() if column._stream._kept]
    assert len(kept) == 1  # the column whose deflating failed, raw from there on
    arrays = recorder.trace().arrays
    assert arrays.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(arrays[name], array, err_msg=name)
