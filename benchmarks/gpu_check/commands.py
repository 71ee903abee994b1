"""The parts of `python -m benchmarks.gpu_check` that run as commands of their own: the launch
budget (on the simulator) and the device tests (pytest, in the time left), each killed whole
at its time limit with its output kept."""

import contextlib
import gc
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading

from benchmarks.gpu_check.run import ROOT, Run

RESERVE_S = 15  # kept from the device tests for the table and the teardown
TEST_MODULES = ("pytest", "hypothesis", "ml_dtypes")  # what tests/cache and tests/contract import
TEST_PATHS = ("tests/cache", "tests/contract")


def run_command(args: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """(exit code or None when it ran past `timeout` s and was killed, its output), echoed
    line by line as it comes; `env` added to the environment. Runs at the checkout's root,
    where `python -m` finds this checkout's numbakv first."""
    env = {**os.environ, **env}
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, killed whole at the timeout
    )  # fmt: skip
    expired = threading.Event()

    def kill():
        expired.set()
        with contextlib.suppress(ProcessLookupError):  # it ended just now
            os.killpg(process.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.start()
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            print(f"    {line}", end="", flush=True)
        process.wait()
    finally:
        timer.cancel()
    return (None if expired.is_set() else process.returncode), "".join(lines)


def part_launch_budget(run: Run) -> None:
    """`python -m benchmarks.launch_budget --check` on the simulator."""
    case = "benchmarks.launch_budget --check (sim)"
    code, _ = run_command(
        [sys.executable, "-m", "benchmarks.launch_budget", "--check"], {"NUMBAKV_DEVICE": "sim"},
        timeout=max(30.0, min(180.0, run.time_left() - 120)),
    )  # fmt: skip
    result = "ok" if code == 0 else "FAIL: timed out" if code is None else f"FAIL: exit {code}"
    run.add("launch budget", case, result=result)


def part_device_tests(run: Run) -> None:
    """pytest of TEST_PATHS on the GPU, in the time left; skipped on the simulator."""
    case = " ".join(TEST_PATHS)
    missing = [name for name in TEST_MODULES if importlib.util.find_spec(name) is None]
    timeout = run.time_left() - RESERVE_S
    reason = (
        "sim" if run.is_sim
        else f"{', '.join(missing)} not installed" if missing
        else f"only {timeout:.0f} s left" if timeout < 30
        else None
    )  # fmt: skip
    if reason:
        print(f"  skipped: {reason}" + (" (the test suite runs them there)" if run.is_sim else ""))
        run.add("device tests", case, result=f"skipped: {reason}")
        return
    release_memory(run)
    print(f"  pytest with a limit of {timeout:.0f} s")
    args = [sys.executable, "-m", "pytest", *TEST_PATHS, "-q", "-p", "no:cacheprovider"]
    code, output = run_command([*args, "--maxfail=20"], {"NUMBAKV_DEVICE": "gpu"}, timeout)
    counts = pytest_counts(output)
    if code is None:
        result = f"FAIL: timed out after {timeout:.0f} s ({counts} so far)"
    else:
        result = f"{'ok' if code == 0 else f'FAIL: exit {code}'}: {counts}"
    run.add("device tests", case, result=result)


def release_memory(run: Run) -> None:
    """Gives back what this process's parts held on the GPU, for the tests' process."""
    gc.collect()
    if not isinstance(run.torch, str):
        run.torch.cuda.empty_cache()
    with contextlib.suppress(AttributeError):  # numba's pending frees, where it has them
        run.device.cuda.current_context().deallocations.clear()


def pytest_counts(output: str) -> str:
    """'N passed, M failed, ...' from pytest's summary line, or counted from its progress
    characters when it was cut off before one."""
    for line in reversed(output.splitlines()):
        if re.search(r"\d+ (passed|failed|errors?|skipped)", line) and " in " in line:
            return ", ".join(re.findall(r"\d+ [a-z]+", line.split(" in ")[0]))
    progress = "".join(
        m.group(1) for m in re.finditer(r"^([.FEsxX]+)(\s+\[\s*\d+%\])?$", output, re.M)
    )
    names = {".": "passed", "F": "failed", "E": "errors", "s": "skipped", "x": "xfailed"}
    return ", ".join(f"{progress.count(c)} {n}" for c, n in names.items() if c in progress)
