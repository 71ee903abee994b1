"""`python -m benchmarks.record_large --quick` runs every phase in its own process and prints
each one's seconds, their multiple of the unrecorded run, a picture's imports' multiple,
its floor (at --quick, the picture itself) and its peak memory."""

import re

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
