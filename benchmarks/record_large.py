"""What recording, saving, loading and drawing a trace of a GPU-sized pool costs, each phase
in its own process (so each peak is its own). Prints figures; asserts nothing.

    python -m benchmarks.record_large                # --scale mid: 64 Ki cells x 4 000 steps
    python -m benchmarks.record_large --scale gpu    # 1 Mi cells x 10 000 steps x width 1 024
    python -m benchmarks.record_large --quick        # 8 Ki cells x 200 steps: seconds
    python -m benchmarks.record_large --scale gpu --steps 1000   # the first 1 000 steps

The workload is tests/viz/scheduler_workload.py's (a shared system prompt cloned into most
requests, n = 2 forks, recompute preemption, decode-first steps with chunked prefill) on the
reference cache, a `Recorder` frame per step, annotated by request, at the scale's cells,
steps, width and sequences (SCALES). Phases: record (the run, then `save`), load
(`load_trace`), then `numbakv viz --kind K` for each kind of benchmarks.plots. Each prints
its seconds and its process's peak resident memory (getrusage: the interpreter, numpy and,
for the pictures, matplotlib included).
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import cells_label, print_machine, print_table
from benchmarks.plots import KINDS, draw

SCALES = {  # cells, steps, width, sequences
    "quick": dict(cells=8192, steps=200, width=256, seqs=16),  # the workload prefills 256 a step
    "mid": dict(cells=65536, steps=4000, width=256, seqs=128),
    "gpu": dict(cells=1 << 20, steps=10_000, width=1024, seqs=1024),
}


def peak_mib() -> float:
    """This process's peak resident memory, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def record(scale: dict, path: str) -> dict:
    """Runs the workload recorded and saves it; its figures."""
    from numbakv import CacheConfig, Recorder
    from numbakv.reference import CellCache
    from tests.viz.scheduler_workload import Workload

    config = CacheConfig(
        n_layers=1, n_kv_heads=1, head_dim=8, windows=(0,), capacity=scale["cells"],
        max_width=scale["width"], max_seqs=scale["seqs"], max_seq_len=4096,
        initial_cells=min(4096, scale["cells"]),
    )  # fmt: skip
    cache = CellCache(config)
    start = time.perf_counter()
    recorder = Recorder(cache)
    workload = Workload(cache, np.random.default_rng(0), (128, 1024), recorder.annotate)
    for _ in range(scale["steps"]):
        workload.step()
    recorded = time.perf_counter() - start
    start = time.perf_counter()
    recorder.save(path)
    return {
        "record_s": recorded, "save_s": time.perf_counter() - start, "peak_mib": peak_mib(),
        "requests": workload.n_requests, "preemptions": workload.preemptions,
        "file_mib": Path(path).stat().st_size / 2**20,
    }  # fmt: skip


def load(path: str) -> dict:
    from numbakv import load_trace

    start = time.perf_counter()
    trace = load_trace(path)
    return {"load_s": time.perf_counter() - start, "peak_mib": peak_mib(),
            "frames": trace.n_frames}  # fmt: skip


def plot(path: str, kind: str, folder: str) -> dict:
    seconds = draw(path, kind, folder)
    return {"plot_s": seconds, "peak_mib": peak_mib()}


def phase(*args: str) -> dict:
    """One phase in a new process (`--phase ...`): its printed figures."""
    command = [sys.executable, "-m", "benchmarks.record_large", "--phase", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="mid")
    parser.add_argument("--quick", action="store_true", help="the same as --scale quick")
    parser.add_argument("--steps", type=int, help="steps instead of the scale's")
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)  # a child's own phase
    args = parser.parse_args(argv)
    if args.phase:
        name, *rest = args.phase
        if name == "record":
            result = record(json.loads(rest[0]), rest[1])
        else:
            result = load(*rest) if name == "load" else plot(*rest)
        print(json.dumps(result))
        return 0
    scale_name = "quick" if args.quick else args.scale
    scale = SCALES[scale_name] | ({} if args.steps is None else {"steps": args.steps})
    cells, steps, width, seqs = (scale[k] for k in ("cells", "steps", "width", "seqs"))
    print(f"record_large --scale {scale_name}: {cells_label(cells)} cells x {steps} steps x "
          f"width {width}, {seqs} sequences")  # fmt: skip
    print_machine()
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "trace.npz")
        recorded = phase("record", json.dumps(scale), path)
        loaded = phase("load", path)
        rows = [
            ["record", f"{recorded['record_s']:.2f}", f"{recorded['peak_mib']:.0f}"],
            ["save", f"{recorded['save_s']:.2f}", "(with record)"],
            ["load", f"{loaded['load_s']:.2f}", f"{loaded['peak_mib']:.0f}"],
        ]
        for kind in KINDS:
            drawn = phase("plot", path, kind, folder)
            rows.append(
                [f"viz --kind {kind}", f"{drawn['plot_s']:.2f}", f"{drawn['peak_mib']:.0f}"]
            )
        print(f"  {recorded['requests']} requests, {recorded['preemptions']} preemptions, "
              f"{loaded['frames']} frames, trace file {recorded['file_mib']:.1f} MiB")  # fmt: skip
        print_table(["phase", "s", "peak MiB"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
