"""Hypothesis profiles (`HYPOTHESIS_PROFILE=ci` under CI) and the fixtures the tests share.
Helpers live in `helpers.py`. The checkout's root goes at the end of sys.path, after
site-packages: the tests import `benchmarks` as a package while `numbakv` stays the
installed one."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from numbakv.reference import CellCache

from helpers import small_config

CHECKOUT = str(Path(__file__).resolve().parents[1])
if CHECKOUT not in sys.path:
    sys.path.append(CHECKOUT)

settings.register_profile("dev", deadline=None)
settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# the files that take longest (compiles to machine code, long simulator workloads, one
# subprocess run), longest first: xdist hands out whole files in the order of
# `pytest_collection_modifyitems` (--no-loadscope-reorder), so that none of them starts
# last while the other worker has nothing left to do
LONG_FIRST = (
    "cache/test_ptx.py",
    "cache/test_kernel_cost.py",
    "cache/test_attention_kernels.py",
    "cache/test_quant_storage.py",
    "cache/test_device_cache.py",
    "cache/test_capture.py",
    "cache/test_strided_inputs.py",
    "device_model/test_device_model.py",
    "cache/test_nan_parity.py",
    "cache/test_device_attention.py",
    "cache/test_host_table.py",
    "viz/test_trace_fuzz.py",
    "testing/test_bug_corpus.py",
    "testing/test_check_cache.py",
    "test_gpu_check.py",
    "viz/test_cli.py",
    "serve/test_executor_graphs.py",
    "viz/test_record_large.py",
)


def pytest_collection_modifyitems(items):
    """LONG_FIRST's files first, the rest by their number of tests, most first (xdist's own
    order); each file's tests keep their order."""
    tests = Path(__file__).parent
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    counts = Counter(item.path for item in items)
    items.sort(key=lambda item: (rank.get(item.path.relative_to(tests).as_posix(), len(rank)),
                                 -counts[item.path], str(item.path)))  # fmt: skip


@pytest.fixture
def cache() -> CellCache:
    return CellCache(small_config())


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """`numbakv demo --trace FILE --columns 32` run once through the installed console
    script: (the finished process, the trace's path)."""
    folder = tmp_path_factory.mktemp("demo")
    script = Path(sys.executable).with_name("numbakv")  # installed beside the interpreter
    args = [str(script), "demo", "--trace", str(folder / "demo.npz"), "--columns", "32"]
    done = subprocess.run(args, cwd=folder, capture_output=True, text=True)
    return done, folder / "demo.npz"
