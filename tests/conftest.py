"""Hypothesis profiles (`HYPOTHESIS_PROFILE=ci` under CI) and the fixtures the tests share.
Helpers live in `helpers.py`. The checkout's root goes at the end of sys.path, after
site-packages: the tests import `benchmarks` as a package while `numbakv` stays the
installed one."""

import fcntl
import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
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
    """`numbakv demo --trace FILE --columns 32 --kv-events tcp://127.0.0.1:PORT` run once
    through the installed console script, once for all of xdist's workers too (~15 s of
    simulator; the files using it may run on both): (the finished process, the trace's
    path, the KV event messages a SUB socket bound at PORT received: [topic, seq, payload]
    each). The first to ask runs it under a lock; the others read what it saved."""
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
            with subscribed() as (endpoint, messages):
                args += ["--kv-events", endpoint]
                done = subprocess.run(args, cwd=folder, capture_output=True, text=True)
            saved.write_text(json.dumps(vars(done) | {"kv_events": messages}))
        run = json.loads(saved.read_text())
        messages = [[bytes.fromhex(frame) for frame in m] for m in run.pop("kv_events")]
    return subprocess.CompletedProcess(**run), folder / "demo.npz", messages


@contextmanager
def subscribed():
    """(a tcp endpoint a SUB socket is bound at, the list its messages go to, each a list
    of frames in hex) while the block runs, and a second after."""
    import zmq

    sub = zmq.Context.instance().socket(zmq.SUB)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt_string(zmq.SUBSCRIBE, "")
    messages, running = [], threading.Event()

    def receive():
        while running.is_set() or sub.poll(1000):
            if sub.poll(50):
                messages.append([frame.hex() for frame in sub.recv_multipart()])

    running.set()
    thread = threading.Thread(target=receive)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}", messages
    finally:
        running.clear()
        thread.join()
        sub.close()
