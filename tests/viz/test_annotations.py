"""Annotations in traces: `Recorder.annotate`, one step clock for frames and annotations,
refusals that change nothing, the `numbakv-trace/3` member and hostile versions of it, and
format 1 files still loading."""

import io
import json
import math
import re
import zipfile

import numpy as np
import pytest
from trace_members import bitsets, header_of, members_of, with_members, write_zip

from numbakv import Recorder, Trace, load_trace
from numbakv.core.errors import ConfigError, TraceError
from numbakv.reference import CellCache
from numbakv.trace import Annotation
from numbakv.trace.file import STEP_EVENT

from helpers import churn, npy, small_config, stable_id, step_with


def assert_same_trace(got: Trace, expect: Trace) -> None:
    """Same config, arrays (names, dtypes, values) and annotations."""
    assert got.config == expect.config and got.arrays.keys() == expect.arrays.keys()
    for name, array in expect.arrays.items():
        assert got.arrays[name].dtype == array.dtype, name
        np.testing.assert_array_equal(got.arrays[name], array, err_msg=name)
    assert got.annotations == expect.annotations


def annotated_trace() -> tuple[Recorder, CellCache]:
    """A recorder over a small workload, every verb, with annotations between its frames."""
    cache = CellCache(small_config())
    recorder = Recorder(cache, every_verb=True)
    a = cache.seq_new()
    recorder.annotate("admit", request=0, seqs=[a])
    step_with(cache, [a, a])
    b = cache.seq_clone(a)
    recorder.annotate("fork", request=0, seqs=(b,), source=a)
    step_with(cache, [a, b])
    recorder.annotate("finish", request=0, sample=1, seq=b, reason="length")
    cache.seq_rm(b)
    recorder.annotate("my_event", share=0.25, flag=True, note=None, mixed=[1, 2.5, "x", None])
    return recorder, cache


def test_annotations_round_trip_through_the_file(tmp_path):
    recorder, _ = annotated_trace()
    expect = recorder.trace()
    assert [a.kind for a in expect.annotations] == ["admit", "fork", "finish", "my_event"]
    assert expect.annotations[1] == Annotation(
        4, 1, "fork", {"request": 0, "seqs": [1], "source": 0}
    )
    assert expect.annotations[3].data == {
        "share": 0.25,
        "flag": True,
        "note": None,
        "mixed": [1, 2.5, "x", None],
    }
    assert expect.annotation_counts() == {"admit": 1, "fork": 1, "finish": 1, "my_event": 1}
    path = tmp_path / "annotated.npz"
    recorder.save(path)
    got = load_trace(path)
    assert_same_trace(got, expect)
    with zipfile.ZipFile(path) as archive:
        assert "annotations.npy" in archive.namelist()
        header = json.loads(str(np.load(io.BytesIO(archive.read("header.npy")))))
    assert header["format"] == "numbakv-trace/3"


def test_annotation_data_is_copied_in_and_out():
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    seqs = [1, 2]
    recorder.annotate("admit", request=0, seqs=seqs)
    seqs.append(3)  # the caller's list changes after: the trace does not
    trace = recorder.trace()
    trace.annotations[0].data["seqs"].append(4)  # neither does a copy handed out
    assert trace.annotations[0].data == {"request": 0, "seqs": [1, 2]}
    recorder.annotate("later")
    assert len(trace.annotations) == 1  # a trace made earlier keeps what it had
    values = np.float64(0.5), np.int64(3).item(), np.bool_(True).item()
    recorder.annotate("types", values=values)
    assert recorder.trace().annotations[-1].data == {"values": [0.5, 3, True]}
    assert type(recorder.trace().annotations[-1].data["values"][0]) is float


def test_frame_and_annotation_steps_follow_the_rule():
    # what happens between steps belongs to the step it leads into: the count of steps
    # prepared before it, kept here by hand as the workload runs
    cache = CellCache(small_config(max_seqs=4, capacity=16))
    recorder = Recorder(cache, every_verb=True)
    n_prepared, expect_frames, expect_annotations = 0, [0], []

    def verb(call, *args):
        call(*args)
        expect_frames.append(n_prepared)

    def step(seq_ids):
        nonlocal n_prepared
        verb(cache.declare_step, seq_ids)
        cache.prepare_step()
        expect_frames.append(n_prepared)  # a step frame is its own step
        n_prepared += 1

    def annotate(kind):
        recorder.annotate(kind)
        expect_annotations.append(n_prepared)

    annotate("before_anything")
    verb(cache.seq_new)
    verb(cache.seq_new)
    annotate("admit")
    step([0, 0, 1])
    annotate("after_step_0")
    annotate("again")
    step([0, 1])
    step([1])
    annotate("finish")
    verb(cache.seq_rm, 0)
    verb(cache.seq_clone, 1)
    annotate("fork")
    step([1, 0])
    verb(cache.seq_rm, 1)
    annotate("at_the_end")
    trace = recorder.trace()
    assert trace.frame_steps.dtype == np.int64
    assert trace.frame_steps.tolist() == expect_frames
    assert [a.step for a in trace.annotations] == expect_annotations
    assert [a.frame for a in trace.annotations] == [0, 2, 4, 4, 8, 10, 13]
    assert trace.frame_steps[trace.step_frames].tolist() == list(range(n_prepared))


def test_steps_only_traces_put_annotations_at_the_next_step():
    cache = CellCache(small_config())
    recorder = Recorder(cache)  # frames: start and steps
    a = cache.seq_new()
    recorder.annotate("admit", request=0, seqs=[a])  # before step 0
    for _ in range(3):
        step_with(cache, [a])
    recorder.annotate("finish", request=0, seq=a, reason="length")  # after step 2
    trace = recorder.trace()
    assert trace.frame_steps.tolist() == [0, 0, 1, 2]
    assert [(a.frame, a.step) for a in trace.annotations] == [(0, 0), (3, 3)]


BAD_KINDS = [3, None, b"admit", "", "x" * 65, "9lives", "has space", "dash-ed", "ünï", "a\n"]
BAD_DATA = [
    dict(seqs=[[1]]),
    dict(seqs=[{"a": 1}]),
    dict(x={"a": 1}),
    dict(x=float("nan")),
    dict(x=[1, math.inf]),
    dict(x=2**63),
    dict(x=-(2**63) - 1),
    dict(x=np.arange(3)),
    dict(x=object()),
    dict(x=b"bytes"),
    dict(x={1, 2}),
    {"bad key": 1},
    {"": 1},
    {"x" * 65: 1},
]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_a_bad_kind_is_refused_changing_nothing(kind):
    recorder, cache = annotated_trace()
    before, table = recorder.trace(), cache.snapshot()
    with pytest.raises(ConfigError, match=r"kind must be .* got ") as info:
        recorder.annotate(kind, request=1)
    assert repr(kind)[:20] in str(info.value) and "nothing was recorded" in str(info.value)
    assert_same_trace(recorder.trace(), before)
    assert cache.snapshot() == table


@pytest.mark.parametrize("data", BAD_DATA, ids=lambda d: stable_id(d)[:30])
def test_bad_data_is_refused_naming_the_key_changing_nothing(data):
    recorder, cache = annotated_trace()
    before, table = recorder.trace(), cache.snapshot()
    with pytest.raises(ConfigError) as info:
        recorder.annotate("admit", **data)
    key = next(iter(data))
    assert f"{key}=" in str(info.value) or "data key" in str(info.value)
    assert_same_trace(recorder.trace(), before)
    assert cache.snapshot() == table


def test_good_edge_values_are_kept():
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    recorder.annotate("x" * 64, **{"_" + "k" * 63: -(2**63), "big": 2**63 - 1, "empty": []})
    [got] = recorder.trace().annotations
    assert got.kind == "x" * 64 and got.data["big"] == 2**63 - 1 and got.data["empty"] == []


def test_seq_requests_binds_from_the_next_frame_and_rebinds():
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    a, b = cache.seq_new(), cache.seq_new()
    recorder.annotate("admit", request=0, seqs=[a])
    recorder.annotate("admit", request=1, seqs=[b])
    step_with(cache, [a, b])  # frame 1
    recorder.annotate("finish", request=0, seq=a, reason="stop")
    cache.seq_rm(a)
    a2 = cache.seq_new()  # the same id, another request
    recorder.annotate("admit", request=2, seqs=[a2])
    recorder.annotate("noise", request=True, seq=1)  # a bool is no request id
    recorder.annotate("noise", request=3, seqs="not a list")
    step_with(cache, [a2, b])  # frame 2
    trace = recorder.trace()
    assert a2 == a
    assert trace.seq_requests(0) == {}
    assert trace.seq_requests(1) == {a: 0, b: 1}
    assert trace.seq_requests(2) == {a: 2, b: 1}
    assert trace.seq_requests(-1) == trace.seq_requests(2)


# -- files: format 1, hostile annotation members ----------------------------------------


@pytest.fixture
def annotated_file(tmp_path):
    recorder, _ = annotated_trace()
    path = tmp_path / "annotated.npz"
    recorder.save(path)
    return path


def test_a_format_1_file_loads_with_no_annotations(annotated_file, tmp_path):
    expect = load_trace(annotated_file)
    old = with_members(
        annotated_file,
        tmp_path,
        header=header_of("numbakv-trace/1", annotated_file),
        annotations=None,
        **bitsets(annotated_file),
    )
    got = load_trace(old)
    assert got.annotations == () and got.annotation_counts() == {}
    assert got.arrays.keys() == expect.arrays.keys()
    assert list(got.snapshots()) == list(expect.snapshots())
    np.testing.assert_array_equal(got.frame_steps, expect.frame_steps)


def test_format_and_members_must_agree(annotated_file, tmp_path):
    with pytest.raises(TraceError, match=r"numbakv-trace/3 file has an annotations\.npy member"):
        load_trace(with_members(annotated_file, tmp_path, annotations=None))
    old_with = with_members(
        annotated_file,
        tmp_path,
        header=header_of("numbakv-trace/1", annotated_file),
        **bitsets(annotated_file),
    )
    with pytest.raises(TraceError, match=r"numbakv-trace/1 file has no annotations\.npy member"):
        load_trace(old_with)
    old_codes = with_members(
        annotated_file, tmp_path, header=header_of("numbakv-trace/2", annotated_file)
    )
    with pytest.raises(TraceError, match=r"no delta_owners\.npy member, which a numbakv-trace/2"):
        load_trace(old_codes)
    future = with_members(
        annotated_file, tmp_path, header=header_of("numbakv-trace/4", annotated_file)
    )
    with pytest.raises(TraceError, match="names format 'numbakv-trace/4', not numbakv-trace/1"):
        load_trace(future)


def text(value) -> bytes:
    """An annotations member holding `value` as JSON text (or `value` itself if a str)."""
    return npy(np.array(value if isinstance(value, str) else json.dumps(value)))


def record(frame=0, kind="admit", **data):
    return {"frame": frame, "kind": kind, "data": data}


@pytest.mark.parametrize(
    ("member", "match"),
    [
        (text("not json"), "its annotations is not JSON"),
        (text('[{"frame": 0, "kind": "x", "data": {"v": NaN}}]'), "NaN is not strict JSON"),
        (text("[" * 100_000 + "]" * 100_000), "annotations is not JSON"),
        (text("9" * 5000), "annotations is not JSON"),
        (text({"frame": 0}), "annotations are a list"),
        (text([[0, "admit", {}]]), r"annotation 0 is not \{frame, kind, data\}"),
        (text([record() | {"extra": 1}]), r"annotation 0 is not \{frame, kind, data\}"),
        (text([record(frame=99)]), r"annotation 0 follows frame 99, outside \[0, n_frames=8\)"),
        (text([record(frame=-1)]), "annotation 0 follows frame -1, outside"),
        (text([record(frame=1.0)]), "annotation 0 follows frame 1.0"),
        (text([record(frame=True)]), "annotation 0 follows frame True"),
        (text([record(frame=3), record(frame=2)]), "annotation 1 follows frame 2, before"),
        (text([record(kind=7)]), "annotation 0: an annotation's kind must be .* got 7"),
        (text([record(kind="no spaces")]), "kind must be .* got 'no spaces'"),
        (text([record(seqs=[[1]])]), r"admit annotation: seqs=\[\[1\]\] is not JSON-safe"),
        (text([record(x={"y": 1})]), "admit annotation: x=.* is not JSON-safe"),
        (text([record(x=2**70)]), "is not JSON-safe"),
        (text([{"frame": 0, "kind": "a", "data": []}]), "data must be a dict; got \\[\\]"),
        (text([{"frame": 0, "kind": "a", "data": {"bad key": 1}}]), "a data key must be"),
        (npy(np.array(["[]", "[]"])), r"annotations\.npy is <U2 with shape \(2,\), not a str"),
        (npy(np.array(0)), r"annotations\.npy is int64 with shape \(\), not a str"),
        (npy(np.array("[]"), descr="<U1099511627776"), "not a valid dtype descriptor"),
        (npy(np.array("[]"), descr="<U100000000"), r"declares shape \(\) of <U100000000"),
        (npy(np.frombuffer(b"\x00\x00\x11\x00]\x00\x00\x00", "<U2").reshape(())), "not JSON"),
    ],
)
def test_hostile_annotations_are_refused(annotated_file, tmp_path, member, match):
    with pytest.raises(TraceError) as info:
        load_trace(with_members(annotated_file, tmp_path, annotations=member))
    assert re.search(match, str(info.value)), str(info.value)


def test_a_header_that_is_not_utf32_is_refused(annotated_file, tmp_path):
    bad = np.frombuffer(b"\x00\x00\x11\x00}\x00\x00\x00", "<U2").reshape(())
    with pytest.raises(TraceError, match="its header is not JSON"):
        load_trace(with_members(annotated_file, tmp_path, header=npy(bad)))


def test_a_trace_built_in_memory_checks_its_annotations(annotated_file):
    good = load_trace(annotated_file)
    with pytest.raises(TraceError, match="annotation 0 follows frame 8, outside"):
        Trace(good.config, good.arrays, [record(frame=8)])
    with pytest.raises(TraceError, match="annotations are a list"):
        Trace(good.config, good.arrays, "[]")
    assert Trace(good.config, good.arrays).annotations == ()


def test_every_bit_of_the_annotations_member_is_refused_or_loads_working(annotated_file, tmp_path):
    members = members_of(annotated_file)
    original = members["annotations.npy"]
    outcomes = {"refused": 0, "loaded": 0}
    for bit in range(0, 8 * len(original), 7):  # a seventh of the bits, all over the member
        flipped = bytearray(original)
        flipped[bit // 8] ^= 1 << (bit % 8)
        path = write_zip(tmp_path / "flipped.npz", members | {"annotations.npy": bytes(flipped)})
        try:
            trace = load_trace(path)
        except TraceError:
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1
        for a in trace.annotations:  # every accessor works on what loaded
            steps_so_far = np.cumsum(trace.arrays["events"] == STEP_EVENT)[a.frame]
            assert 0 <= a.frame < trace.n_frames and a.step == steps_so_far
        assert sum(trace.annotation_counts().values()) == len(trace.annotations)
        trace.seq_requests(-1)
    assert outcomes["refused"] > outcomes["loaded"] > 0, outcomes


def test_churned_traces_round_trip_with_annotations(tmp_path):
    cache = CellCache(small_config(max_seqs=5, capacity=24, initial_cells=1))
    recorder = Recorder(cache, every_verb=True)
    for i in range(20):
        churn(cache, [i * 7, i * 11 + 1])
        recorder.annotate("tick", i=i, live=cache.live_seqs)
    path = tmp_path / "churn.npz"
    recorder.save(path)
    got, expect = load_trace(path), recorder.trace()
    assert_same_trace(got, expect)
    assert [a.data["i"] for a in got.annotations] == list(range(20))


def test_numpy_scalars_are_the_python_values_they_hold():
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    recorder.annotate(
        "admit", request=np.int64(3), seqs=[np.int32(0)], hit=np.True_, share=np.float32(0.5)
    )
    [note] = recorder.trace().annotations
    assert note.data == {"request": 3, "seqs": [0], "hit": True, "share": 0.5}
    assert type(note.data["request"]) is int and type(note.data["hit"]) is bool
    with pytest.raises(ConfigError, match="share=nan is not JSON-safe"):
        recorder.annotate("admit", share=np.float32("nan"))
    assert len(recorder.trace().annotations) == 1
