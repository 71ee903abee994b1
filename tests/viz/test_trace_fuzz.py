"""Damaged trace files, a few hundred deterministic variants of each kind made by
`trace_variants` (`python -m benchmarks.trace_fuzz` runs many more): each is refused with a
TraceError, or loads as a trace whose every accessor works — equal to the original when the
damage was to the file's bytes (bit flips, truncation, splices)."""

import copy

import numpy as np
import pytest

from numbakv import Trace, load_trace
from numbakv.core.errors import TraceError

import trace_variants as fuzz

N_VARIANTS = {
    "bits": 1200,
    "truncate": 150,
    "splice": 150,
    "member": 400,
    "graft": 100,
    "value": 400,
    "config": 200,
}


@pytest.fixture(scope="module")
def originals():
    return fuzz.Originals.recorded(seed=0)


@pytest.mark.parametrize("kind", N_VARIANTS)
def test_damage_is_refused_or_loads_a_working_trace(originals, kind):
    rng = np.random.default_rng(list(N_VARIANTS).index(kind))
    variants = fuzz.variants(kind, originals, rng, N_VARIANTS[kind])
    counts = fuzz.run({kind: variants}, originals)[kind]
    escapes = {name: n for name, n in counts.items() if name.startswith("ESCAPE")}
    assert escapes == {}
    assert sum(counts.values()) == N_VARIANTS[kind]
    refused = sum(n for name, n in counts.items() if name.startswith("refused: "))
    assert refused >= N_VARIANTS[kind] // 2, counts  # damage is seen, not shrugged off
    if kind not in fuzz.REBUILT:
        assert "other trace" not in counts


def test_the_oracle_knows_a_good_file_and_a_different_one(originals, tmp_path):
    path = tmp_path / "variant.npz"
    expect, other = originals.trace, originals.other
    path.write_bytes(originals.data)
    assert fuzz.outcome(str(path), expect, others=()) == "equal"
    path.write_bytes(originals.other_data)
    assert fuzz.outcome(str(path), expect, others=()) == "ESCAPE loaded a different trace"
    assert fuzz.outcome(str(path), expect, others=(other,)) == "equal to the other trace"
    assert fuzz.outcome(str(path), expect, others=None) == "other trace"
    path.write_bytes(originals.data[:100])
    assert fuzz.outcome(str(path), expect, others=()).startswith("refused: ")


def test_the_recorded_traces_use_every_feature(originals):
    trace = originals.trace
    events = set(trace.events)
    assert {"seq_new", "seq_clone", "seq_rm", "rewind", "clear", "prepare_step"} <= events
    assert (trace.arrays["step_seq_ids"] == -1).any()  # padded steps
    assert trace.metrics()["saved"].max() > 0  # shared cells


def annotated(trace):
    """`trace` with an annotation after every third frame (ints, lists, floats, text)."""
    records = [
        {"frame": f, "kind": "tick", "data": {"request": f % 3, "seqs": [f % 5], "x": f / 7}}
        for f in range(0, trace.n_frames, 3)
    ]
    return Trace(trace.config, trace.arrays, records)


@pytest.fixture(scope="module")
def annotated_originals(originals):
    """`fuzz.Originals` of the same two traces, annotated."""
    return fuzz.Originals(annotated(originals.trace), annotated(originals.other))


@pytest.mark.parametrize(("kind", "n"), [("bits", 400), ("splice", 100), ("member", 300)])
def test_damaged_annotated_traces_are_refused_or_work(annotated_originals, tmp_path, kind, n):
    o, path = annotated_originals, tmp_path / "variant.npz"
    rng = np.random.default_rng(len(kind))
    if kind == "member":  # aim at the annotations member: the others are fuzzed above
        o = copy.copy(annotated_originals)
        o.members = {"annotations.npy": annotated_originals.members["annotations.npy"]}
    outcomes = {"refused": 0, "loaded": 0}
    for data in fuzz.variants(kind, o, rng, n):
        if kind == "member":  # the variant holds only the flipped member: put the rest back
            flipped = fuzz.members_of(data)
            data = fuzz.zipped(annotated_originals.members | flipped)
        path.write_bytes(data)
        try:
            trace = load_trace(str(path))
        except TraceError:
            outcomes["refused"] += 1
            continue
        outcomes["loaded"] += 1
        fuzz.exercise(trace)
        assert sum(trace.annotation_counts().values()) == len(trace.annotations)
        assert all(0 <= a.step <= trace.n_steps for a in trace.annotations)
        trace.seq_requests(-1)
        if kind != "member":  # the zip's checksums hold: what loads is an original
            assert trace.annotations in (o.trace.annotations, o.other.annotations)
    assert outcomes["refused"] >= n // 2, outcomes
