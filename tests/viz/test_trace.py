"""Recording: the observer hook, frames that replay exactly, and the .npz trace file."""

import zipfile

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv.errors import SequenceError, TraceError
from numbakv.reference import CellCache
from numbakv.trace import Recorder, load_trace

from helpers import Snapshots, churn, small_config, step_with


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
    churn(cache, ops)
    path = tmp_path_factory.mktemp("trace") / "run.npz"
    recorder.save(path)
    expect, got = recorder.trace(), load_trace(path)
    assert got.config == expect.config
    assert expect.arrays.keys() == got.arrays.keys()
    for name, array in expect.arrays.items():
        assert got.arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(got.arrays[name], array)
    assert list(got.snapshots()) == list(expect.snapshots())


def test_a_long_decode_trace_stores_only_changes(tmp_path):
    cache = CellCache(small_config(capacity=1024, max_seqs=8, max_width=8))
    recorder = Recorder(cache)
    seq_ids = [cache.seq_new() for _ in range(8)]
    for _ in range(100):
        step_with(cache, seq_ids)
    arrays = recorder.trace().arrays
    assert len(arrays["delta_cells"]) == 800  # one changed cell per token, nothing else


# -- damaged files -----------------------------------------------------------------


@pytest.fixture
def trace_file(tmp_path):
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    churn(cache, list(range(40)))
    path = tmp_path / "good.npz"
    recorder.save(path)
    return path


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
        (dict(header=np.array('{"format": "other/9"}')), "not a numbakv-trace/1"),
        (dict(header=np.array("not json")), "not a readable"),
        (dict(delta_pos=None), "not a readable"),
        (dict(events=np.array([99], np.uint8)), "unknown event"),
        (dict(read_len=np.zeros(1, np.int32)), "frames"),
        (dict(rows=np.zeros((2, 2), np.int32)), "dims"),
        (dict(delta_offsets=np.zeros(3, np.int64)), "offsets"),
        (dict(step_cells=np.zeros(0, np.float32)), "dtype"),
    ],
)
def test_inconsistent_arrays(trace_file, tmp_path, changes, match):
    with pytest.raises(TraceError, match=match):
        load_trace(rewrite(trace_file, tmp_path, **changes))


def test_bad_config_in_header(trace_file, tmp_path):
    header = '{"format": "numbakv-trace/1", "config": {"n_layers": 0}}'
    with pytest.raises(TraceError, match="bad cache config"):
        load_trace(rewrite(trace_file, tmp_path, header=np.array(header)))
