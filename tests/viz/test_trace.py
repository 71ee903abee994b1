"""Recording: the observer hook, frames that replay exactly, and the .npz trace file."""

import re
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv import Recorder, Trace, load_trace
from numbakv.core.errors import SequenceError, TraceError
from numbakv.reference import CellCache
from numbakv.trace import scan

from helpers import Snapshots, churn, npy, small_config, step_with


@pytest.mark.parametrize("every_verb", [False, True])
def test_frames_replay_every_snapshot(every_verb):
    cache = CellCache(small_config(max_seqs=70, capacity=32))
    recorder = Recorder(cache, every_verb=every_verb)
    expect = Snapshots(cache, every_verb)
    churn(cache, list(range(0, 600, 7)))
    trace = recorder.trace()
    assert trace.n_frames == len(expect.frames) and trace.events == expect.events
    for frame, (got, want) in enumerate(zip(trace.snapshots(), expect.frames, strict=True)):
        assert got == want, frame
    assert trace.snapshot(-1) == expect.frames[-1]


def test_recorded_steps_give_the_live_masks():
    cache = CellCache(small_config(n_layers=3, windows=(0, 1, 3), capacity=32))
    recorder = Recorder(cache)
    a, b = cache.seq_new(), cache.seq_new()
    live = []
    for seq_ids, width in (([a, a, b], 5), ([b, a], None), ([a] * 4, 8)):
        step = step_with(cache, seq_ids, width)
        live.append(
            (step.cells, step.positions, step.seq_ids, {w: step.mask(w) for w in (0, 1, 3)})
        )
    trace = recorder.trace()
    assert trace.step_frames.tolist() == [1, 2, 3]
    for frame, (cells, positions, seq_ids, masks) in zip(trace.step_frames, live, strict=True):
        got = trace.step(frame)
        np.testing.assert_array_equal(got.cells, cells)
        np.testing.assert_array_equal(got.positions, positions)
        np.testing.assert_array_equal(got.seq_ids, seq_ids)
        for window, mask in masks.items():
            np.testing.assert_array_equal(got.mask(window), mask)
    with pytest.raises(TraceError, match="not a prepare_step"):
        trace.step(0)


def test_observers_hear_successful_verbs_only():
    cache = CellCache(small_config())
    heard = []
    cache.add_observer(lambda c, event, step: heard.append((event, step is not None)))
    a = cache.seq_new()
    step_with(cache, [a, a])
    with pytest.raises(SequenceError):
        cache.seq_rm(3)
    cache.seq_clone(a)
    cache.rewind(a, 1)
    cache.seq_rm(a)
    cache.clear()
    assert heard == [
        ("seq_new", False), ("declare_step", False), ("prepare_step", True),
        ("seq_clone", False), ("rewind", False), ("seq_rm", False), ("clear", False),
    ]  # fmt: skip


def test_close_stops_recording():
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    a = cache.seq_new()
    step_with(cache, [a])
    recorder.close()
    step_with(cache, [a])
    assert recorder.trace().n_frames == 2


def test_metrics_are_computed_once_and_given_as_copies(monkeypatch):
    """A trace computes its metrics once; each call gets its own arrays, so changing one
    changes neither the next call's nor another caller's."""
    cache = CellCache(small_config(capacity=32, initial_cells=2))
    recorder = Recorder(cache)
    churn(cache, list(range(1, 200, 7)))
    trace = recorder.trace()
    first = trace.metrics()
    monkeypatch.setattr(scan, "largest_free_run", lambda *args: pytest.fail("computed twice"))
    first["used"][:] = -1
    second = trace.metrics()
    assert second.keys() == first.keys() and (second["used"] >= 0).all()
    assert all(second[k] is not trace.metrics()[k] for k in second)


def test_metrics_follow_the_snapshots():
    cache = CellCache(small_config(capacity=32, initial_cells=2))
    recorder = Recorder(cache, every_verb=True)
    expect = Snapshots(cache, every_verb=True)
    churn(cache, list(range(1, 400, 5)))
    m = recorder.trace().metrics()
    for f, snap in enumerate(expect.frames):
        owners = [snap.owners_of(c) for c in range(snap.read_len)]
        used = sum(1 for o in owners if o)
        assert m["used"][f] == used and m["read_len"][f] == snap.read_len
        assert m["saved"][f] == sum(len(o) for o in owners) - used
        assert m["fragmentation"][f] == pytest.approx(
            1 - used / snap.read_len if snap.read_len else 0
        )
        assert m["rows"][f] == snap.rows
        assert m["growth"][f] == (snap.rows > (expect.frames[f - 1].rows if f else 0))
        assert m["width"][f] == expect.steps.get(f, 0)
    assert m["saved"].max() > 0 and m["growth"].sum() >= 2 and m["fragmentation"].max() > 0


@given(st.lists(st.integers(0, 200), max_size=60), st.booleans())
def test_trace_round_trips_through_npz(tmp_path_factory, ops, every_verb):
    cache = CellCache(small_config(max_seqs=5, capacity=24, initial_cells=1))
    recorder = Recorder(cache, every_verb=every_verb)
    for i, op in enumerate(ops):
        churn(cache, [op])
        if op % 3 == 0:  # an annotation between some of the frames
            recorder.annotate("op", i=i, live=cache.live_seqs, share=op / 7, text=str(op))
    path = tmp_path_factory.mktemp("trace") / "run.npz"
    recorder.save(path)
    expect, got = recorder.trace(), load_trace(path)
    assert got.config == expect.config
    assert expect.arrays.keys() == got.arrays.keys()
    for name, array in expect.arrays.items():
        assert got.arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(got.arrays[name], array)
    assert list(got.snapshots()) == list(expect.snapshots())
    assert got.annotations == expect.annotations
    assert len(got.annotations) == sum(op % 3 == 0 for op in ops)
    steps = np.arange(got.n_steps)
    np.testing.assert_array_equal(got.frame_steps[got.step_frames], steps)  # step k is k
    assert got.frame_steps.tolist() == sorted(got.frame_steps.tolist())


def test_a_long_decode_trace_stores_only_changes(tmp_path):
    cache = CellCache(small_config(capacity=1024, max_seqs=8, max_width=8))
    recorder = Recorder(cache)
    seq_ids = [cache.seq_new() for _ in range(8)]
    for _ in range(100):
        step_with(cache, seq_ids)
    arrays = recorder.trace().arrays
    assert len(arrays["delta_cells"]) == 800  # one changed cell per token, nothing else


# -- damaged files -----------------------------------------------------------------


def rewrite(path, tmp_path, **changes):
    """A copy of the trace at `path` with some arrays replaced (None drops one)."""
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    for name, value in changes.items():
        if value is None:
            del arrays[name]
        else:
            arrays[name] = value
    out = tmp_path / "changed.npz"
    np.savez(out, **arrays)
    return out


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no trace file"):
        load_trace(tmp_path / "nope.npz")


@pytest.mark.parametrize("keep", [0, 10, 200, 0.5, 0.9])
def test_truncated_file(trace_file, tmp_path, keep):
    data = trace_file.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: int(keep * len(data)) if isinstance(keep, float) else keep])
    with pytest.raises(TraceError, match="not a readable numbakv trace"):
        load_trace(cut)


def test_not_a_trace(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, x=np.arange(3))
    with pytest.raises(TraceError, match="not a readable numbakv trace"):
        load_trace(path)
    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(TraceError):
        load_trace(text)


def test_corrupt_member(trace_file, tmp_path):
    with zipfile.ZipFile(trace_file) as source:
        members = {name: source.read(name) for name in source.namelist()}
    members["read_len.npy"] = members["read_len.npy"][:-5]  # a short array
    broken = tmp_path / "broken.npz"
    with zipfile.ZipFile(broken, "w") as target:
        for name, data in members.items():
            target.writestr(name, data)
    with pytest.raises(TraceError):
        load_trace(broken)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(header=np.array('{"format": "other/9"}')), "names format 'other/9', not numbakv-"),
        (dict(header=np.array("not json")), "not a readable"),
        (dict(delta_pos=None), "not a readable"),
        (dict(events=np.array([99], np.uint8)), "unknown event"),
        (dict(read_len=np.zeros(1, np.int32)), "frames"),
        (dict(rows=np.zeros((2, 2), np.int32)), "dims"),
        (dict(delta_offsets=np.zeros(3, np.int64)), "offsets"),
        (dict(step_cells=np.zeros(0, np.float32)), "float32"),
    ],
)
def test_inconsistent_arrays(trace_file, tmp_path, changes, match):
    with pytest.raises(TraceError, match=match):
        load_trace(rewrite(trace_file, tmp_path, **changes))


def test_bad_config_in_header(trace_file, tmp_path):
    header = '{"format": "numbakv-trace/3", "config": {"n_layers": 0}}'
    with pytest.raises(TraceError, match="bad cache config"):
        load_trace(rewrite(trace_file, tmp_path, header=np.array(header)))


# -- hostile and inconsistent files ----------------------------------------------------


def members_of(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def write_zip(path, members: dict[str, bytes], compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def mark_encrypted(path, name: str):
    """Sets the 'encrypted' flag of member `name` in its local and central headers."""
    data = bytearray(path.read_bytes())
    for signature, flag_at, name_at in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        at = data.find(signature)
        while at >= 0:
            if data[at + name_at : at + name_at + len(name)] == name.encode():
                data[at + flag_at] |= 1
            at = data.find(signature, at + 1)
    path.write_bytes(bytes(data))
    return path


def test_a_npy_file_is_not_a_trace(tmp_path):
    path = tmp_path / "one.npy"
    np.save(path, np.arange(4))
    with pytest.raises(TraceError, match=r"one.npy .*single .npy array"):
        load_trace(path)


def test_a_folder_is_not_a_trace(tmp_path):
    with pytest.raises(TraceError, match="is a folder"):
        load_trace(tmp_path)


def test_a_member_claiming_2_40_elements_is_refused_before_allocating(trace_file, tmp_path):
    members = members_of(trace_file)
    members["delta_cells.npy"] = npy(np.zeros(4, np.int32), shape=(2**40,))
    path = write_zip(tmp_path / "huge.npz", members, zipfile.ZIP_STORED)
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(TraceError, match=r"declares shape \(1099511627776,\) of int32"):
        load_trace(path)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 1 and peak < 2**20  # no 4 TiB allocation attempted, not even 1 MiB


def test_a_pickled_object_member_is_refused_unread(trace_file, tmp_path):
    members = members_of(trace_file)
    members["live.npy"] = npy(np.array([{"x": 1}, None], dtype=object))
    with pytest.raises(TraceError, match=r"live\.npy holds Python objects"):
        load_trace(write_zip(tmp_path / "pickle.npz", members))


def test_zip_features_numbakv_never_writes_are_refused(trace_file, tmp_path):
    bzip2 = write_zip(tmp_path / "bzip2.npz", members_of(trace_file), zipfile.ZIP_BZIP2)
    with pytest.raises(TraceError, match="uses compression method 12, not stored"):
        load_trace(bzip2)
    encrypted = mark_encrypted(write_zip(tmp_path / "e.npz", members_of(trace_file)), "live.npy")
    with pytest.raises(TraceError, match=r"member live\.npy is encrypted"):
        load_trace(encrypted)


def test_a_duplicated_member_is_refused(trace_file, tmp_path):
    members = members_of(trace_file)
    path = write_zip(tmp_path / "twice.npz", members)
    with zipfile.ZipFile(path, "a") as archive, pytest.warns(UserWarning, match="Duplicate"):
        archive.writestr("events.npy", members["events.npy"])
    with pytest.raises(TraceError, match=r"two events\.npy members"):
        load_trace(path)


def test_a_fortran_ordered_member_loads_equal(trace_file, tmp_path):
    expect = load_trace(trace_file)
    got = load_trace(rewrite(trace_file, tmp_path, live=np.asfortranarray(expect.arrays["live"])))
    np.testing.assert_array_equal(got.arrays["live"], expect.arrays["live"])
    assert list(got.snapshots()) == list(expect.snapshots())


def edited(trace_file, name, index, value):
    """{name: a copy of that array of the trace with [index] = value}."""
    with np.load(trace_file) as data:
        array = data[name].copy()
    array[index] = value
    return {name: array}


@pytest.mark.parametrize(
    ("name", "index", "value", "match"),
    [
        ("step_seq_ids", 0, 99, "frame 1's step names sequence 99, past max_seqs=4"),
        ("step_seq_ids", 2, 3, "frame 3's step names sequence 3, which is not live"),
        ("delta_cells", 0, 16, r"frame 1 changes cell 16, outside \[0, capacity=16\)"),
        ("step_cells", 0, 16, r"frame 1's step places a token in cell 16, outside \[0, read_len=1"),
        ("step_positions", 3, 5, "frame 3's step puts sequence 0 position 5 in cell 1"),
        ("step_cells", 3, 0, "frame 3's step places two tokens in cell 0"),
        ("rows", 5, 5, r"frame 5's pool has 5 rows, outside \[read_len=6, capacity=16\]"),
        ("rows", 7, 12, "the pool shrinks at frame 7, from 16 to 12 rows"),
        ("read_len", 2, 3, "frame 2's read_len 3 is not trimmed: cell 2 is free"),
        ("read_len", 7, 10, r"frame 7's step places a token in cell 10, outside \[0, read_len=10"),
        ("read_len", 9, 13, "cell 13 is occupied from frame 9 while read_len drops to 13"),
        ("read_len", 1, 17, r"frame 1's read_len 17 is outside \[0, capacity=16\]"),
        ("delta_pos", 0, -1, "frame 1 gives cell 0 position -1 and some owners"),
        ("delta_codes", 0, 9, "an owner id past max_seqs=4"),
        ("delta_codes", 1, 3, "cell 1 is owned by sequence 3 at frame 2 while that sequence is"),
        ("events", 3, 0, "only that one, is the 'start' frame"),
        ("step_offsets", 1, 1, "frame 0 is no step but has 1 step rows"),
    ],
)
def test_frames_that_contradict_each_other(trace_file, tmp_path, name, index, value, match):
    with pytest.raises(TraceError, match="not a consistent numbakv trace") as info:
        load_trace(rewrite(trace_file, tmp_path, **edited(trace_file, name, index, value)))
    assert re.search(match, str(info.value)), str(info.value)


def test_padding_rows_are_all_minus_one(tmp_path):
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    step_with(cache, [cache.seq_new()], width=3)
    path = tmp_path / "padded.npz"
    recorder.save(path)
    assert load_trace(path).step(1).seq_ids.tolist() == [0, -1, -1]
    for name, index, value, match in [
        ("step_cells", 1, 2, "row 1 is padding"),
    ]:
        with pytest.raises(TraceError, match=match):
            load_trace(rewrite(path, tmp_path, **edited(path, name, index, value)))
    first_is_padding = {n: np.full(3, -1, np.int32) for n in ("cells", "positions", "seq_ids")}
    with pytest.raises(TraceError, match="step starts with padding"):
        load_trace(rewrite(path, tmp_path, **{f"step_{n}": a for n, a in first_is_padding.items()}))
    ids = {"step_seq_ids": np.array([0, -1, 0], np.int32)}
    cells = {"step_cells": np.array([0, -1, 0], np.int32)}
    positions = {"step_positions": np.array([0, -1, 0], np.int32)}
    with pytest.raises(TraceError, match="real row after padding"):
        load_trace(rewrite(path, tmp_path, **ids, **cells, **positions))


def test_a_trace_built_in_memory_is_checked_too(trace_file):
    good = load_trace(trace_file)
    arrays = dict(good.arrays, step_seq_ids=good.arrays["step_seq_ids"] + 60)
    with pytest.raises(TraceError, match="past max_seqs"):
        Trace(good.config, arrays)
    with pytest.raises(TraceError, match="a trace has the arrays"):
        Trace(good.config, {"events": good.arrays["events"]})
