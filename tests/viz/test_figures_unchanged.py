"""Pictures and frames held to those of numbakv 0.11.0 (commit 91b10a1, trace format 2).

tests/viz/data/trace_v2.npz is `record` below, saved by 0.11.0's Recorder: the scheduler
workload on 4 096 cells x 600 steps x width 256 x 32 sequences (247 requests, 299
preemptions). The PNGs beside it are 0.11.0's `numbakv viz` of that file with the
arguments of PICTURES. A trace recorded today must replay to the same tables, and both
that file and today's recording must draw the same pixels.
"""

from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from numbakv import CacheConfig, Recorder, Trace, load_trace
from numbakv.cli import main as cli_main
from numbakv.reference import CellCache

from scheduler_workload import Workload

DATA = Path(__file__).parent / "data"
PICTURES = {  # PNG name -> `numbakv viz` arguments after the trace
    "v2_cells": ["--kind", "cells"],
    "v2_mask": ["--kind", "mask"],
    "v2_mask_300": ["--kind", "mask", "--step", "300", "--cells", "0:1024", "--bin", "1"],
    "v2_timeline": ["--kind", "timeline"],
    "v2_timeline_seq": ["--kind", "timeline", "--by", "seq", "--steps", "100:400"],
    "v2_metrics": ["--kind", "metrics"],
    "v2_locality": ["--kind", "locality"],
}


def record() -> Trace:
    """The workload of trace_v2.npz, recorded now."""
    config = CacheConfig(
        n_layers=1, n_kv_heads=1, head_dim=8, windows=(0,), capacity=4096, max_width=256,
        max_seqs=32, max_seq_len=4096, initial_cells=4096,
    )  # fmt: skip
    cache = CellCache(config)
    recorder = Recorder(cache)
    workload = Workload(cache, np.random.default_rng(0), (128, 1024), recorder.annotate)
    for _ in range(600):
        workload.step()
    return recorder.trace()


@pytest.fixture(scope="module")
def today(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("today") / "trace.npz"
    record().save(path)
    return path


def test_a_recording_today_replays_to_the_format_2_file(today):
    old, new = load_trace(DATA / "trace_v2.npz"), load_trace(today)
    assert (old.n_frames, old.events) == (new.n_frames, new.events)
    assert old.annotations == new.annotations
    for a, b in zip(old.snapshots(), new.snapshots(), strict=True):
        assert a == b
    for key, value in old.metrics().items():
        np.testing.assert_array_equal(new.metrics()[key], value, err_msg=key)
    np.testing.assert_array_equal(new.timeline(), old.timeline())


@pytest.mark.parametrize("name", sorted(PICTURES))
@pytest.mark.parametrize("source", ["format 2 file", "recorded today"])
def test_pictures_are_pixel_for_pixel_those_of_0_11(name, source, today, tmp_path):
    trace = DATA / "trace_v2.npz" if source == "format 2 file" else today
    out = tmp_path / f"{name}.png"
    assert cli_main(["viz", str(trace), *PICTURES[name], "--dpi", "50", "-o", str(out)]) == 0
    want = imread(DATA / f"{name}.png")
    np.testing.assert_array_equal(imread(out), want)
