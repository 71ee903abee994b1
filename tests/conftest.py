"""Hypothesis profiles (`HYPOTHESIS_PROFILE=ci` under CI) and the fixtures the tests share.
Helpers live in `helpers.py`. The checkout's root goes at the end of sys.path, after
site-packages: the tests import `benchmarks` as a package while `numbakv` stays the
installed one."""

import fcntl
import json
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
    script, once for all of xdist's workers too (~15 s of simulator; the files using it
    may run on both): (the finished process, the trace's path). The first to ask runs it
    under a lock; the others read what it saved."""
    folder = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = folder.parent  # this run's, above each worker's own
    folder /= "demo"
    folder.mkdir(exist_ok=True)
    saved = folder / "run.json"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not saved.exists():
            script = Path(sys.executable).with_name("numbakv")  # installed beside python
            args = [str(script), "demo", "--trace", str(folder / "demo.npz"), "--columns", "32"]
            done = subprocess.run(args, cwd=folder, capture_output=True, text=True)
            saved.write_text(json.dumps(vars(done)))
        done = subprocess.CompletedProcess(**json.loads(saved.read_text()))
    return done, folder / "demo.npz"
