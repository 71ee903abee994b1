"""The text map's labels (`render_text(..., labels=)`) and the demo, whose map draws each
request's sequences with the letter its summary table gives the request."""

import re

import numpy as np
import pytest

from numbakv import load_trace
from numbakv.cli import demo
from numbakv.reference import CellCache
from numbakv.serve.tokenizer import BYTE_TOKENIZER
from numbakv.viz import render_text

from helpers import small_config, step_with


def test_labels_draw_each_sequence_with_its_label():
    cache = CellCache(small_config(capacity=16, initial_cells=8))
    a, b, c = cache.seq_new(), cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a, b, b, a, c])
    cache.seq_clone(a, upto=2)  # cells 0, 1 shared by a and its clone 3
    cache.rewind(b, 1)  # cell 3 free
    snapshot = cache.snapshot()
    assert render_text(snapshot) == "0 **b.ac|.."  # a letter per sequence id by default
    assert render_text(snapshot, labels=None) == render_text(snapshot)
    assert render_text(snapshot, labels={a: "x", b: "y", c: "x"}) == "0 **y.xx|.."
    assert render_text(snapshot, columns=4, labels={a: "x"}) == "0 **?.\n4 x?|.."


@pytest.mark.parametrize(
    ("labels", "error", "match"),
    [
        ([(0, "a")], TypeError, "labels must be a mapping"),
        ({True: "a"}, TypeError, "maps sequence ids"),
        ({"0": "a"}, TypeError, "maps sequence ids"),
        ({0: 1}, TypeError, "maps sequence ids"),
        ({0: "ab"}, ValueError, "label 'ab' of sequence 0 must be one printable character"),
        ({0: ""}, ValueError, "must be one printable character"),
        ({0: "*"}, ValueError, r"one of \. \* # \| \?"),
        ({0: "|"}, ValueError, "not a space nor one of"),
        ({0: " "}, ValueError, "not a space"),
        ({0: "\n"}, ValueError, "printable"),
    ],
)
def test_bad_labels_are_refused(labels, error, match):
    with pytest.raises(error, match=match):
        render_text(CellCache(small_config()).snapshot(), labels=labels)


def test_demo_letters_requests_in_submission_order():
    assert [demo.letter(i) for i in range(len(demo.WORKLOAD))] == list("abcdef")
    arrivals = [a.step for a in demo.WORKLOAD]
    assert arrivals == sorted(arrivals)  # the workload is listed in submission order


def test_the_demo_map_and_table_share_letters(demo_run):
    done, trace_path, _ = demo_run
    assert done.returncode == 0, done.stderr
    out = done.stdout
    table = dict(re.findall(r"^([a-zA-Z]) +(\S+) +\d+ +\d+ +\d+ +\d+ ", out, re.M))
    assert table == {demo.letter(i): a.name for i, a in enumerate(demo.WORKLOAD)}
    # the map as printed, and the trace it was drawn from
    forward = int(re.search(r"the pool at forward (\d+), the busiest", out).group(1))
    printed = "".join(re.findall(r"^ *\d+ ([a-zA-Z.*#|?]+)$", out, re.M)).replace("|", "")
    trace = load_trace(trace_path)
    frame = int(trace.step_frames[forward])
    snapshot = trace.snapshot(frame)
    bound = trace.seq_requests(frame)
    assert set(snapshot.live_seqs.tolist()) <= bound.keys()  # every live sequence has a request
    codes = snapshot.codes.tolist()
    for cell, code in enumerate(codes):
        if code >= 0:
            assert printed[cell] == demo.letter(bound[code]), cell
        else:
            assert printed[cell] in ".*", cell
    # each request's letter covers at most its prompt and its tokens (its samples' own
    # cells), and every request with cells of its own at that forward is drawn
    drawn = {letter: printed.count(letter) for letter in table}
    for i, arrival in enumerate(demo.WORKLOAD):
        most = len(BYTE_TOKENIZER.encode(arrival.prompt)) + arrival.n * arrival.max_new_tokens
        assert drawn[demo.letter(i)] <= most, arrival.name
    owners = {bound[code] for code in codes if code >= 0}
    assert {letter for letter, n in drawn.items() if n} == {demo.letter(r) for r in owners}
    assert len(owners) >= 3 and "*" in printed  # a busy map, with the n=3 prompt shared
    assert np.count_nonzero(snapshot.n_owners) == sum(c != "." for c in printed[: len(codes)])


def test_the_demo_trace_holds_the_engine_annotations(demo_run):
    done, trace_path, _ = demo_run
    trace = load_trace(trace_path)
    counts = trace.annotation_counts()
    n_samples = sum(a.n for a in demo.WORKLOAD)
    assert counts["admit"] == len(demo.WORKLOAD) and counts["fork"] == 1
    assert counts["finish"] == n_samples and counts["cancel"] == 1
    printed = re.search(r"^annotations: (.+)$", done.stdout, re.M).group(1)
    assert printed == ", ".join(f"{n} {kind}" for kind, n in counts.items())
