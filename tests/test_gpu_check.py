"""`python -m benchmarks.gpu_check --sim`: the one command for a GPU, run with tiny shapes on
the simulator so that it cannot rot. It must exit 0 and print its table: every part's row,
every attention case timed and equal to the solo oracle within TOLERANCE["float32"] (the
kernels compute in float32), the decode step timed. The launch budget is left out there
(`--skip`: tests/cache/test_launch_budget.py holds the same rules); the parts that run only
on a GPU are checked here through their helpers: the subprocess runner and the reading of
pytest's output."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from numbakv.config import TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["part", "case", "us", "GB/s", "of copy", "sdpa us", "sdpa err", "err", "result"]


@pytest.fixture(scope="module")
def sim_run() -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBAKV_DEVICE": "sim"}
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--sim", "--skip", "launch budget"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def table(sim_run) -> list[dict[str, str]]:
    """The summary table's rows, as {column: cell}."""
    lines = sim_run.stdout.split("== summary\n", 1)[1].splitlines()
    header, rule = lines[0], lines[1]
    assert re.split(r"\s{2,}", header.strip()) == COLUMNS
    assert set(rule.strip()) <= {"-", " "}
    rows = []
    for line in lines[2:]:
        if line.strip().startswith(("seconds:", "us:", "result:")):
            break
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(COLUMNS), line
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return rows


def rows_of(table, part: str) -> list[dict[str, str]]:
    return [row for row in table if row["part"] == part]


def test_it_exits_0_and_says_ok(sim_run):
    assert sim_run.returncode == 0, sim_run.stdout[-4000:] + sim_run.stderr[-4000:]
    assert sim_run.stdout.rstrip().endswith("result: ok")


def test_it_prints_the_versions_first(sim_run):
    versions = sim_run.stdout.split("== copy", 1)[0]
    for name in ("python", "numbakv", "numpy", "numba", "numba-cuda", "torch", "cupy"):
        assert re.search(rf"^  {re.escape(name)} +\S", versions, re.M), name
    assert "numba CUDA simulator" in versions


def test_every_part_has_a_row(table):
    parts = {row["part"] for row in table}
    expected = ("copy", "attention", "decode step", "inputs", "saved", "model graphs",
                "launch budget")  # fmt: skip
    assert parts == {*expected, "device tests"}
    assert all(not row["result"].startswith("FAIL") for row in table)


def test_every_attention_case_is_timed_and_equals_the_solo_oracle(table):
    # the simulator's shapes: one case of 2 sequences x 64 cells, GQA 4 and 2, two modes
    rows = rows_of(table, "attention")
    expect = {f"{mode} 2x64 gqa{group}" for mode in ("gathered", "masked") for group in (4, 2)}
    assert {row["case"] for row in rows} == expect
    for row in rows:
        assert float(row["us"]) > 0, row
        assert float(row["GB/s"]) > 0, row
        assert float(row["of copy"]) > 0, row  # the copy ran first and was measured
        assert 0 <= float(row["err"]) <= TOLERANCE["float32"], row
        assert row["result"] == "ok", row
        assert row["sdpa us"] == "skipped (sim)", row


def test_the_copy_and_the_decode_step_are_timed(table):
    (copy,) = rows_of(table, "copy")
    assert float(copy["us"]) > 0 and float(copy["GB/s"]) > 0
    decode = rows_of(table, "decode step")
    assert len(decode) == 4
    assert all(float(row["us"]) > 0 and row["result"] == "ok" for row in decode)
    host, per_layer = (float(row["us"]) for row in decode[:2])
    assert per_layer == pytest.approx(host / 2, rel=1e-3)  # 2 layers in the simulator


def test_the_device_model_is_timed_eager_and_replayed(table):
    # the simulator's shapes: batches 1 and 2 of a 2-layer model; replayed == eager checked
    rows = rows_of(table, "model graphs")
    cases = [row["case"] for row in rows]
    assert cases == [f"batch {b}, 2 layers, {what}" for b in (1, 2) for what in
                     ("eager", "replayed (recorded launches)", "eager / replayed")]  # fmt: skip
    assert all(float(row["us"]) > 0 for row in rows[0::3] + rows[1::3])
    assert all(re.fullmatch(r"ok: \d+\.\d\dx", row["result"]) for row in rows[2::3])


def test_the_device_tests_are_left_to_the_suite_in_the_simulator(table):
    (tests,) = rows_of(table, "device tests")
    assert tests["result"] == "skipped: sim"
    (budget,) = rows_of(table, "launch budget")
    assert budget["result"] == "skipped: --skip"


@pytest.fixture(scope="module")
def commands():
    """benchmarks.gpu_check.commands, of this checkout (tests/conftest.py puts its root at
    the end of sys.path)."""
    from benchmarks.gpu_check import commands

    assert Path(commands.__file__).parent == ROOT / "benchmarks" / "gpu_check", commands.__file__
    return commands


def test_a_command_past_its_time_is_killed_with_its_output_kept(commands, capsys):
    sleeper = "import time; print('started', flush=True); time.sleep(60)"
    code, output = commands.run_command([sys.executable, "-c", sleeper], {}, timeout=1)
    assert (code, output) == (None, "started\n")
    code, output = commands.run_command([sys.executable, "-c", "exit(3)"], {}, timeout=30)
    assert (code, output) == (3, "")
    assert "    started" in capsys.readouterr().out  # echoed as it came


def test_pytest_counts_from_the_summary_or_from_the_progress(commands):
    finished = "..F.s\n=== short test summary info ===\n1 failed, 3 passed, 1 skipped in 2.01s\n"
    assert commands.pytest_counts(finished) == "1 failed, 3 passed, 1 skipped"
    cut_off = "........F.  [ 40%]\n...s"
    assert commands.pytest_counts(cut_off) == "12 passed, 1 failed, 1 skipped"
