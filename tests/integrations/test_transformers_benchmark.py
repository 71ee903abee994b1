"""`python -m benchmarks.transformers_overhead --quick` runs and prints its six figures."""

import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks import transformers_overhead


def test_the_overhead_benchmark_prints_every_figure(capsys):
    transformers_overhead.main(["--quick"])
    out = capsys.readouterr().out
    for label in ("adapter overhead", "numbakv executor step", "write + attend"):
        assert re.search(rf"{re.escape(label)}.*\s-?\d+", out), label
