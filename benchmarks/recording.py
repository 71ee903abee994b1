"""What recording a trace costs, through the reference cache.

    python -m benchmarks.recording overhead             # 10 000 steps, 32 sequences
    python -m benchmarks.recording overhead --steps 2000
    python -m benchmarks.recording large                # masks computed when read
    python -m benchmarks.recording large --eager-masks  # every mask at every step
    python -m benchmarks.recording large --steps 500    # a shorter run
    python -m benchmarks.recording large --long         # decodes of 128-1024 tokens: the
                                                        # pool fills, requests are preempted
    python -m benchmarks.recording large --save big.npz # keep the trace for benchmarks.plots

overhead: a continuous-batching workload timed with and without a `Recorder`, and the size
of the trace it leaves. Each step decodes one token for every running sequence; a finished
sequence is removed and a new one arrives with a prompt prefilled in chunks, so holes open
and refill. The timed work is the host table: declare_step + prepare_step (the reference
writes the masks there), which is the cheapest a step gets, so the overhead printed is the
worst case.

large: the scheduler-like workload of tests/viz/scheduler_workload.py (a shared system
prompt cloned into most requests, n = 2 forks, recompute preemption, decode-first steps
with chunked prefill) on 65 536 cells, 128 sequences, width 256, a `Recorder` frame per
step, annotated by request. Prints the seconds of the whole run (one updating progress
line on stderr while it runs).
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import print_machine, run_command
from numbakv import CacheConfig, Recorder
from numbakv.reference import CellCache
from numbakv.viz.progress import Progress
from tests.viz.scheduler_workload import Workload


def workload(n_steps: int, n_seqs: int, seed: int, record: bool) -> tuple[float, Recorder | None]:
    """Runs the overhead workload; returns (seconds, recorder or None)."""
    rng = np.random.default_rng(seed)
    cfg = CacheConfig(
        n_layers=1, n_kv_heads=1, head_dim=8, capacity=n_seqs * 640, max_width=64,
        max_seqs=n_seqs, windows=(0,), initial_cells=256,
    )  # fmt: skip
    cache = CellCache(cfg)
    recorder = Recorder(cache) if record else None
    todo = {}  # seq -> (prompt tokens left, tokens to generate)
    start = time.perf_counter()
    for _ in range(n_steps):
        while len(cache.live_seqs) < n_seqs:
            todo[cache.seq_new()] = [int(rng.integers(16, 128)), int(rng.integers(32, 512))]
        seq_ids = []
        for seq, left in todo.items():
            chunk = min(left[0], 8) if left[0] else 1
            seq_ids += [seq] * chunk
            left[0] -= min(left[0], 8)
            left[1] -= 0 if left[0] else 1
        cache.declare_step(seq_ids[: cfg.max_width])
        cache.prepare_step()
        for seq in [s for s, left in todo.items() if left[1] <= 0]:
            cache.seq_rm(seq)
            del todo[seq]
    return time.perf_counter() - start, recorder


def overhead_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, best kept")
    parser.add_argument("--seed", type=int, default=0)


def run_overhead(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    print("numbakv recording overhead")
    print_machine()
    print(f"workload: {args.steps} steps, {args.seqs} sequences, best of {args.repeat} runs each")
    plain, recorded, recorder = [], [], None
    for _ in range(args.repeat):  # alternate, so drift on a shared machine hits both
        plain.append(workload(args.steps, args.seqs, args.seed, record=False)[0])
        seconds, recorder = workload(args.steps, args.seqs, args.seed, record=True)
        recorded.append(seconds)
    trace = recorder.trace()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.npz")
        start = time.perf_counter()
        trace.save(path)
        save_s = time.perf_counter() - start
        size = os.path.getsize(path)
    raw = sum(a.nbytes for a in trace.arrays.values())
    m = trace.metrics()
    print(f"  max read_len {m['read_len'].max()}, max used {m['used'].max()}, "
          f"mean fragmentation {m['fragmentation'].mean():.3f}")  # fmt: skip
    print(f"  unrecorded  {min(plain):7.2f} s  ({1e6 * min(plain) / args.steps:6.1f} µs/step)")
    print(
        f"  recorded    {min(recorded):7.2f} s  ({1e6 * min(recorded) / args.steps:6.1f} µs/step)"
    )
    print(f"  overhead    {100 * (min(recorded) / min(plain) - 1):+7.1f} %")
    print(f"  trace       {trace.n_frames} frames, {len(trace.arrays['delta_cells'])} cell changes")
    print(f"  in memory   {raw / 2**20:7.2f} MiB")
    print(f"  .npz file   {size / 2**20:7.2f} MiB (saved in {save_s:.2f} s)")


def large_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument(
        "--eager-masks", action="store_true", help="every mask at every step, for contrast"
    )
    parser.add_argument("--long", action="store_true", help="decodes of 128-1024 tokens")
    parser.add_argument("--save", metavar="PATH", help="save the trace (.npz) for benchmarks.plots")


def run_large(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    config = CacheConfig(n_layers=2, n_kv_heads=1, head_dim=8, windows=(0, 512),
                         capacity=65536, max_width=256, max_seqs=128, max_seq_len=4096,
                         initial_cells=4096)  # fmt: skip
    cache = CellCache(config)
    started = time.perf_counter()
    recorder = Recorder(cache)
    if args.eager_masks:  # every step's masks computed at once, read or not
        cache.add_observer(lambda c, e, step: step and [step.mask(w) for w in step.windows])
    decodes = (128, 1024) if args.long else (16, 256)
    workload = Workload(cache, np.random.default_rng(0), decodes, recorder.annotate)
    progress = Progress("recording")
    for step in range(args.steps):
        workload.step()
        progress(step + 1, args.steps)
    progress.close()
    seconds = time.perf_counter() - started
    trace = recorder.trace()
    print(f"{args.steps} steps, {trace.n_frames} frames, peak {trace.metrics()['used'].max()} "
          f"cells used, {workload.preemptions} preemptions: {seconds:.1f} s "
          f"({'every mask at every step' if args.eager_masks else 'masks when read'})")  # fmt: skip
    if args.save:
        trace.save(args.save)
        print(f"trace saved to {args.save}")
    return 0


COMMANDS = {
    "overhead": ("a workload with and without a Recorder", overhead_arguments, run_overhead),
    "large": ("a large scheduler-like workload, recorded", large_arguments, run_large),
}

if __name__ == "__main__":
    sys.exit(run_command("python -m benchmarks.recording", __doc__.splitlines()[0], COMMANDS))
