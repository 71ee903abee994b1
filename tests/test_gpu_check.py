"""`python -m benchmarks.gpu_check --sim`: the one command for a GPU, run with tiny shapes on
the simulator so that it cannot rot. It must exit 0 and print its table: every part's row,
a decode attention row per storage format and GQA group (float16 in both modes) and the
prefill row, each timed and equal to the solo oracle over the K/V as stored within
TOLERANCE["float32"] (the kernels compute in float32), the kernel each plan picked named,
the decode step timed. The launch budget is left out there
(`--skip`: tests/cache/test_launch_budget.py holds the same rules); the parts that run only
on a GPU are checked here through their helpers: the subprocess runner, the reading of
pytest's output, and the "model" cell kernel_cost's estimate gives (or why not)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from numbakv.core.config import TOLERANCE

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["part", "case", "us", "GB/s", "of copy", "TFLOP/s", "model", "sdpa us", "sdpa rate",
           "sdpa err", "err", "result"]  # fmt: skip
FORMATS = ("float16", "bfloat16", "float32", "q8_0", "q4_0", "fp8_e4m3")
# what the attention part must launch on the simulator (head_dim 32): a decode kernel per
# storage format, gathered (and masked for float16), and the prefill kernel
DECODE_KERNELS = {"float16": "decode_d32", "bfloat16": "decode_bf16_d32",
                  "float32": "decode_d32", "q8_0": "decode_q8_0_d32",
                  "q4_0": "decode_q4_0_d32", "fp8_e4m3": "decode_fp8_e4m3_d32"}  # fmt: skip


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


def test_every_decode_format_is_timed_and_equals_the_solo_oracle(table):
    # the simulator's shapes: 2 sequences x 32 cells, GQA 4 and 2, every storage format
    # gathered, float16 masked too; then the prefill row
    rows = [row for row in rows_of(table, "attention") if not row["case"].startswith("prefill")]
    expect = [
        f"{mode} {fmt} 2x32 gqa{group}"
        for fmt in FORMATS
        for group in (4, 2)
        for mode in (("gathered", "masked") if fmt == "float16" else ("gathered",))
    ]
    assert [row["case"] for row in rows] == expect
    for row in rows:
        assert float(row["us"]) > 0, row
        assert float(row["GB/s"]) > 0, row
        assert float(row["of copy"]) > 0, row  # the copy ran first and was measured
        assert 0 <= float(row["err"]) <= TOLERANCE["float32"], row
        assert row["result"] == "ok", row
        assert row["model"] == "sim", row  # kernel_cost is left out of --sim
        assert row["TFLOP/s"] == "-", row
        sdpa = "skipped (sim)" if row["case"].split()[1] in ("float16", "bfloat16") else "-"
        assert row["sdpa us"] == sdpa, row


def test_the_bytes_are_the_formats_own(table):
    # one launch each: the time differs, so compare GB/s x us, the bytes the tokens see:
    # 2 tokens x 32 cells x 2 KV heads x (K and V) x head_bytes(fmt, 32)
    head_bytes = {"float16": 64, "bfloat16": 64, "float32": 128, "q8_0": 34, "q4_0": 18,
                  "fp8_e4m3": 32}  # fmt: skip
    for row in rows_of(table, "attention"):
        if not row["case"].startswith("prefill"):
            fmt = row["case"].split()[1]
            n_bytes = float(row["GB/s"]) * 1e9 * float(row["us"]) / 1e6
            assert n_bytes == pytest.approx(2 * 32 * 2 * 2 * head_bytes[fmt], rel=1e-3), row


def test_the_prefill_step_is_timed_in_flop_and_equals_the_solo_oracle(table):
    # 2 sequences x 16 new tokens in one step, GQA 4 over 2 KV heads, head_dim 32
    (row,) = [row for row in rows_of(table, "attention") if row["case"].startswith("prefill")]
    assert row["case"] == "prefill gathered float16 2x16 gqa4"
    assert row["result"] == "ok", row
    assert 0 <= float(row["err"]) <= TOLERANCE["float32"], row
    assert (row["GB/s"], row["model"], row["sdpa us"]) == ("-", "sim", "skipped (sim)"), row
    flop = 4 * 32 * 8 * 2 * (16 * 17 // 2)  # 4 x head_dim x n_heads x visible cells
    assert float(row["TFLOP/s"]) * 1e12 * float(row["us"]) / 1e6 == pytest.approx(flop, rel=1e-3)


def test_the_kernel_each_plan_picked_is_named(sim_run):
    attention = sim_run.stdout.split("== attention", 1)[1].split("== decode step", 1)[0]
    for fmt, kernel in DECODE_KERNELS.items():
        line = next(ln for ln in attention.splitlines() if ln.startswith(f"  {fmt}: 2 x 31"))
        for group in (4, 2):
            assert f"gqa{group} gathered attend_gathered_{kernel}" in line, line
            if fmt == "float16":
                assert f"gqa{group} masked attend_masked_{kernel}" in line, line
    assert re.search(r"^  prefill: .* kernel attend_gathered_prefill\w*$", attention, re.M)


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


@pytest.fixture(scope="module")
def estimate():
    """benchmarks.gpu_check.estimate, of this checkout."""
    from benchmarks.gpu_check import estimate

    assert Path(estimate.__file__).parent == ROOT / "benchmarks" / "gpu_check", estimate.__file__
    return estimate


def test_the_model_cell_is_in_the_rows_unit(estimate):
    decode = {"name": "m.attend_gathered_decode_d128", "bandwidth_ceiling": 2.5e12,
              "flop_ceiling": None}  # fmt: skip
    prefill = {"name": "m.attend_gathered_prefill", "bandwidth_ceiling": None, "flop_ceiling": 7e12}
    assert estimate.model_cell(decode, "TB/s", 8.0) == ("2.50 TB/s", None)
    assert estimate.model_cell(decode, "TF/s", 8.0) == ("20.00 TF/s (kernel: 2.50 TB/s)", None)
    assert estimate.model_cell(prefill, "TF/s", 4.0) == ("7.00 TF/s", None)
    assert estimate.model_cell(prefill, "TB/s", 4.0) == ("1.75 TB/s (kernel: 7.00 TF/s)", None)
    cell, why = estimate.model_cell({**prefill, "flop_ceiling": None}, "TF/s", 4.0)
    assert cell == "n/a" and "attend_gathered_prefill" in why
    labels = [estimate.pools_label(fmt) for fmt in FORMATS]  # as kernel_cost labels signatures
    assert labels == ["f16/f16", "u16/u16", "f32/f32", "u8/u8", "u8/u8", "u8/u8"]


def test_without_ptxas_the_model_says_n_a_and_why(estimate, monkeypatch):
    from benchmarks.gpu_check.run import GPU_SHAPES, Run
    from benchmarks.kernel_cost import tools

    def missing(name):
        raise tools.ToolMissing(f"no {name} found")

    monkeypatch.setattr(tools, "find_tool", missing)
    run = Run(is_sim=False, shapes=GPU_SHAPES)
    estimates = estimate.Estimates(run)
    estimates.want(["attend_gathered_prefill"])  # starts nothing: no tools
    row = run.add("attention", "prefill")
    estimates.attach(row, "attend_gathered_prefill", "float16", "TF/s", 100.0)
    assert row[COLUMNS.index("model")] == "pending"
    estimates.fill(run)
    assert row[COLUMNS.index("model")] == "n/a"
    assert run.notes == ["model n/a: no ptxas found"]
