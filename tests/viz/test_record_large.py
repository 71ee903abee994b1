"""`python -m benchmarks.record_large --quick` runs every phase in its own process and prints
each one's seconds and peak memory."""

import re

from benchmarks import record_large
from benchmarks.plots import KINDS


def test_the_large_recording_benchmark_prints_every_phase(capsys):
    assert record_large.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for phase in ["record", "load", *(f"viz --kind {kind}" for kind in KINDS)]:
        assert re.search(rf"^  {re.escape(phase)}\s+\d+\.\d\d\s+\d+$", out, re.M), phase
    assert re.search(r"\d+ requests, \d+ preemptions, 202 frames", out)
