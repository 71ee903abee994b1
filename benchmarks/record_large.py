"""What recording, saving, loading and drawing a trace of a GPU-sized pool costs, as
multiples of running the workload unrecorded, each phase in its own process (so each peak
is its own). Prints figures; asserts nothing.

    python -m benchmarks.record_large                # --scale mid: 64 Ki cells x 4 000 steps
    python -m benchmarks.record_large --scale gpu    # 1 Mi cells x 10 000 steps x width 1 024
    python -m benchmarks.record_large --quick        # 8 Ki cells x 200 steps: seconds
    python -m benchmarks.record_large --scale gpu --steps 2000   # the first 2 000 steps

The workload is tests/viz/scheduler_workload.py's (a shared system prompt cloned into most
requests, n = 2 forks, recompute preemption, decode-first steps with chunked prefill) on the
reference cache at the scale's cells, steps, width and sequences (SCALES). Phases: the
workload unrecorded; recorded (a `Recorder` frame per step, annotated by request), then
`save`; unrecorded again; `load_trace` (the library call, the allocator as Python leaves
it); then `numbakv viz --kind K` for each kind of benchmarks.plots (`all` included), in a
process set up as the command sets up its own (`numbakv.cli.process`: its allocator keeping
freed memory, numpy's arrays on small pages). The mean of the two unrecorded runs is the
unit: the recording overhead is (recorded run + save - unrecorded) / unrecorded, "in the
recorder" its own calls (constructed, its observer, annotate, save), "the rest" what the
workload's own work took longer beside them (the cache's verbs, run among the recorder's).
Every other phase's seconds are printed as multiples of it too, beside its process's peak
resident memory (getrusage: the interpreter, numpy and, for the pictures, matplotlib
included). Of a picture's seconds, the imports it makes (matplotlib and numbakv.viz, the
same for any trace) are timed apart too: "imports x". "floor x" is the same picture of
`--quick`'s nearly empty trace (recorded after the others; at --quick's cells, the picture
itself), in the same unit: about what a picture costs whatever the trace (the imports,
loading, matplotlib's layout, text and file), which no picture of a larger trace is
expected to go under.
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
from numbakv.cli.process import set_up

SCALES = {  # cells, steps, width, sequences
    "quick": dict(cells=8192, steps=200, width=256, seqs=16),  # the workload prefills 256 a step
    "mid": dict(cells=65536, steps=4000, width=256, seqs=128),
    "gpu": dict(cells=1 << 20, steps=10_000, width=1024, seqs=1024),
}


def peak_mib() -> float:
    """This process's peak resident memory, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Stopwatch:
    """The seconds spent in calls of the functions it wraps (`wrap`), nested calls once."""

    def __init__(self):
        self.seconds, self._depth = 0.0, 0

    def wrap(self, function):
        def timed(*args, **kwargs):
            self._depth += 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self._depth -= 1
                if not self._depth:
                    self.seconds += time.perf_counter() - start

        return timed


def run(scale: dict, path: str | None = None) -> dict:
    """Runs the workload, recorded and saved to `path` unless it is None; its figures."""
    from numbakv import CacheConfig, Recorder
    from numbakv.reference import CellCache
    from tests.viz.scheduler_workload import Workload

    config = CacheConfig(
        n_layers=1, n_kv_heads=1, head_dim=8, windows=(0,), capacity=scale["cells"],
        max_width=scale["width"], max_seqs=scale["seqs"], max_seq_len=4096,
        initial_cells=min(4096, scale["cells"]),
    )  # fmt: skip
    cache = CellCache(config)
    inside = Stopwatch()  # the recorder's own calls: constructed, its observer, annotate

    class Timed(Recorder):
        _on_event = inside.wrap(Recorder._on_event)  # the observer a Recorder adds

    start = time.perf_counter()
    recorder = None if path is None else inside.wrap(Timed)(cache)
    hooks = () if recorder is None else (inside.wrap(recorder.annotate),)
    workload = Workload(cache, np.random.default_rng(0), (128, 1024), *hooks)
    for _ in range(scale["steps"]):
        workload.step()
    figures = {"run_s": time.perf_counter() - start, "requests": workload.n_requests,
               "preemptions": workload.preemptions, "recorder_s": inside.seconds}  # fmt: skip
    if recorder is not None:
        start = time.perf_counter()
        recorder.save(path)
        figures |= {"save_s": time.perf_counter() - start,
                    "file_mib": Path(path).stat().st_size / 2**20}  # fmt: skip
    return figures | {"peak_mib": peak_mib()}


def load(path: str) -> dict:
    from numbakv import load_trace

    start = time.perf_counter()
    trace = load_trace(path)
    return {"load_s": time.perf_counter() - start, "peak_mib": peak_mib(),
            "frames": trace.n_frames}  # fmt: skip


def plot(path: str, kind: str, folder: str) -> dict:
    """`numbakv viz --kind KIND`'s seconds, the imports it makes (matplotlib and
    numbakv.viz, the same for every trace) timed apart first, in this process set up
    before them, as the command sets up its own before it imports them."""
    set_up()
    start = time.perf_counter()
    import matplotlib.backend_bases  # noqa: F401  (what `numbakv viz` imports)

    import numbakv.viz  # noqa: F401

    imports = time.perf_counter() - start
    return {"plot_s": imports + draw(path, kind, folder), "imports_s": imports,
            "peak_mib": peak_mib()}  # fmt: skip


def phase(*args: str) -> dict:
    """One phase in a new process (`--phase ...`): its printed figures."""
    command = [sys.executable, "-m", "benchmarks.record_large", "--phase", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def child(name: str, rest: list[str]) -> int:
    """Runs one phase (`--phase NAME ...`) in this process and prints its figures as JSON."""
    if name == "run":
        result = run(json.loads(rest[0]), *rest[1:])
    else:
        result = load(*rest) if name == "load" else plot(*rest)
    print(json.dumps(result))
    return 0


def measure(scale: dict, folder: str) -> tuple[dict, list[list[str]]]:
    """Every phase, each in its own process: (the recorded run's figures and the trace's
    frames, the table's rows: phase, seconds, multiple of the unrecorded run, of a
    picture's seconds the imports', the same picture of --quick's trace, peak MiB)."""
    path = str(Path(folder) / "trace.npz")
    runs = [phase("run", json.dumps(scale)), phase("run", json.dumps(scale), path)]
    runs.append(phase("run", json.dumps(scale)))
    loaded = phase("load", path)
    drawn = [(kind, phase("plot", path, kind, folder)) for kind in KINDS]
    floor = dict(drawn)  # a nearly empty trace's pictures: what drawing costs at any size
    if scale["cells"] > SCALES["quick"]["cells"]:  # else the trace is as small: its own
        tiny = str(Path(folder) / "tiny.npz")
        phase("run", json.dumps(SCALES["quick"]), tiny)
        floor = {kind: phase("plot", tiny, kind, folder) for kind in KINDS}
    before, recorded, after = runs
    unit = (before["run_s"] + after["run_s"]) / 2
    both = recorded["run_s"] + recorded["save_s"]
    rows = [
        ("unrecorded, before", before["run_s"], None, None, before["peak_mib"]),
        ("recorded", recorded["run_s"], None, None, recorded["peak_mib"]),
        ("save", recorded["save_s"], None, None, None),  # in the recorded run's process
        ("unrecorded, after", after["run_s"], None, None, after["peak_mib"]),
        ("recording overhead", both - unit, None, None, None),
        ("  in the recorder", recorded["recorder_s"] + recorded["save_s"], None, None, None),
        ("  the rest", both - unit - recorded["recorder_s"] - recorded["save_s"], None, None,
         None),
        ("load", loaded["load_s"], None, None, loaded["peak_mib"]),
        *((f"viz --kind {kind}", d["plot_s"], d["imports_s"], floor[kind]["plot_s"],
           d["peak_mib"]) for kind, d in drawn),
    ]  # fmt: skip
    table = [
        [name, f"{s:.2f}", *("-" if x is None else f"{x / unit:.2f}" for x in (s, imports, least)),
         "-" if peak is None else f"{peak:.0f}"]
        for name, s, imports, least, peak in rows
    ]  # fmt: skip
    return recorded | {"frames": loaded["frames"], "unit_s": unit}, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="mid")
    parser.add_argument("--quick", action="store_true", help="the same as --scale quick")
    parser.add_argument("--steps", type=int, help="steps instead of the scale's")
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)  # a child's own phase
    args = parser.parse_args(argv)
    if args.phase:
        return child(args.phase[0], args.phase[1:])
    scale_name = "quick" if args.quick else args.scale
    scale = SCALES[scale_name] | ({} if args.steps is None else {"steps": args.steps})
    cells, steps, width, seqs = (scale[k] for k in ("cells", "steps", "width", "seqs"))
    print(f"record_large --scale {scale_name}: {cells_label(cells)} cells x {steps} steps x "
          f"width {width}, {seqs} sequences")  # fmt: skip
    print_machine()
    with tempfile.TemporaryDirectory() as folder:
        figures, table = measure(scale, folder)
    print(f"  {figures['requests']} requests, {figures['preemptions']} preemptions, "
          f"{figures['frames']} frames, trace file {figures['file_mib']:.1f} MiB")  # fmt: skip
    print(f"  x unrecorded: seconds / {figures['unit_s']:.2f} s (the unrecorded runs' mean); "
          "recording overhead: recorded + save - unrecorded")  # fmt: skip
    print("  imports x: of a picture's multiple, importing matplotlib and numbakv.viz")
    print("  floor x: the same picture of --quick's trace (8 Ki cells x 200 steps), the same unit")
    print_table(["phase", "s", "x unrecorded", "imports x", "floor x", "peak MiB"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
