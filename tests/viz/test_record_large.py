"""`python -m benchmarks.record_large --quick` runs every phase in its own process and prints
each one's seconds, their multiple of the unrecorded run and its peak memory."""

import re

from benchmarks import record_large
from benchmarks.plots import KINDS


def test_the_large_recording_benchmark_prints_every_phase(capsys):
    assert record_large.main(["--quick"]) == 0
    out = capsys.readouterr().out
    runs = ["unrecorded, before", "recorded", "unrecorded, after", "load"]
    for phase in [*runs, *(f"viz --kind {kind}" for kind in KINDS)]:
        assert re.search(rf"^  {re.escape(phase)}\s+\d+\.\d\d\s+\d+\.\d\d\s+\d+$", out, re.M), phase
    for phase in ["save", "recording overhead"]:
        assert re.search(rf"^  {phase}\s+-?\d+\.\d\d\s+-?\d+\.\d\d\s+-$", out, re.M), phase
    assert re.search(r"\d+ requests, \d+ preemptions, 202 frames", out)
