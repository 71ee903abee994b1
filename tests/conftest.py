"""Hypothesis profiles (`HYPOTHESIS_PROFILE=ci` under CI) and the fixtures the tests share.
Helpers live in `helpers.py`. The checkout's root goes at the end of sys.path, after
site-packages: the tests import `benchmarks` as a package while `numbakv` stays the
installed one."""

import os
import subprocess
import sys
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
