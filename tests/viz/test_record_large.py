"""`python -m benchmarks.record_large --quick` runs every phase in its own process and prints
each one's seconds, their multiple of the unrecorded run, a picture's imports' multiple,
its floor (at --quick, the picture itself) and its peak memory."""

import re

import pytest

from benchmarks import record_large
from benchmarks.plots import KINDS


def test_the_large_recording_benchmark_prints_every_phase(capsys):
    assert record_large.main(["--quick"]) == 0
    out = capsys.readouterr().out
    seconds = r"\s+-?\d+\.\d\d\s+-?\d+\.\d\d"  # and their multiple of the unrecorded run
    for phase in ["unrecorded, before", "recorded", "unrecorded, after", "load"]:
        assert re.search(rf"^  {re.escape(phase)}{seconds}\s+-\s+-\s+\d+$", out, re.M), phase
    for kind in KINDS:
        line = re.search(rf"^  viz --kind {kind}{seconds}\s+(\d+\.\d\d)\s+(\d+\.\d\d)\s+\d+$",
                         out, re.M)  # fmt: skip
        multiple = line and line[0].split()[4]
        assert line and 0 < float(line[1]) <= float(multiple), kind
        assert line[2] == multiple, kind  # --quick's floor is its own trace's picture
    for phase in ["save", "recording overhead", "  in the recorder", "  the rest"]:
        assert re.search(rf"^  {phase}{seconds}\s+-\s+-\s+-$", out, re.M), phase
    assert re.search(r"\d+ requests, \d+ preemptions, 202 frames", out)


def test_the_stopwatch_counts_nested_calls_once_and_calls_that_raise():
    watch = record_large.Stopwatch()
    clock = iter([0.0, 1.0, 3.0, 10.0, 14.0])  # outer's start, inner's, outer's end; a raise

    def outer():
        return inner() + 1

    inner, outer = watch.wrap(lambda: 1), watch.wrap(outer)
    record_large.time.perf_counter, real = lambda: next(clock), record_large.time.perf_counter
    try:
        assert outer() == 2 and watch.seconds == 3.0  # 0 -> 3, the inner call's time in it
        with pytest.raises(ZeroDivisionError):
            watch.wrap(lambda: 1 / 0)()
        assert watch.seconds == 7.0
    finally:
        record_large.time.perf_counter = real


def test_only_a_recorded_run_spends_time_in_the_recorder(tmp_path):
    scale = record_large.SCALES["quick"] | {"steps": 20}
    assert record_large.run(scale)["recorder_s"] == 0
    assert record_large.run(scale, str(tmp_path / "t.npz"))["recorder_s"] > 0
