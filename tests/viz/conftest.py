"""Fixtures the trace and command-line tests share."""

import pytest

from numbakv import Recorder
from numbakv.reference import CellCache

from helpers import churn, small_config


@pytest.fixture
def trace_file(tmp_path):
    """A trace of a 40-operation workload on a small reference cache, saved as good.npz."""
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    churn(cache, list(range(40)))
    path = tmp_path / "good.npz"
    recorder.save(path)
    return path
