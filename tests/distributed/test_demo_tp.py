"""`torchrun --nproc_per_node=2 -m numbakv demo --tp 2` (two gloo ranks on the CPU, the
simulator): rank 0 prints the single-process demo's map and table (all but the timings)
and its `--trace` holds the single-process trace's table at every frame."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from numbakv import load_trace

TIMES = re.compile(r"\s+\d+\.\d+\s+\d+\.\d+(\s+\d+\s+\S+)")  # ttft s, tok/s: dropped


def report(stdout: str) -> list[str]:
    """The map and the table, timings dropped."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("the pool at"))
    end = next(i for i, line in enumerate(lines) if " steps (" in line)
    return [TIMES.sub(r"\1", line) for line in lines[start:end]]


def test_the_tp2_demo_is_the_demo(demo_run, tmp_path):
    done, trace_path, _ = demo_run
    torchrun = Path(sys.executable).with_name("torchrun")
    args = [str(torchrun), "--nproc_per_node=2", "-m", "numbakv", "demo", "--tp", "2",
            "--columns", "32", "--trace", str(tmp_path / "tp.npz")]  # fmt: skip
    tp = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert tp.returncode == 0, tp.stderr[-3000:]
    assert "tensor parallel over 2 ranks (gloo)" in tp.stdout
    assert tp.stdout.count("the pool at") == 1  # rank 1 prints nothing
    assert report(tp.stdout) == report(done.stdout) and len(report(done.stdout)) > 15
    one, two = load_trace(trace_path), load_trace(tmp_path / "tp.npz")
    assert (one.config.n_kv_heads, two.config.n_kv_heads) == (2, 1)  # each rank its head
    assert one.n_frames == two.n_frames > 10
    assert all(one.snapshot(i) == two.snapshot(i) for i in range(one.n_frames))
