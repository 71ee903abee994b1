"""What recording costs: a continuous-batching workload through the reference cache, timed
with and without a `Recorder`, and the size of the trace it leaves.

    python benchmarks/recording.py            # 10 000 steps, 32 sequences
    python benchmarks/recording.py --steps 2000

Each step decodes one token for every running sequence; a finished sequence is removed
and a new one arrives with a prompt prefilled in chunks, so holes open and refill. The
timed work is the host table: declare_step + prepare_step (the reference writes the masks
there), which is the cheapest a step gets, so the overhead printed is the worst case.
"""

import argparse
import os
import platform
import tempfile
import time

import numpy as np

from numbakv.reference import CacheConfig, CellCache
from numbakv.trace import Recorder


def workload(n_steps: int, n_seqs: int, seed: int, record: bool) -> tuple[float, Recorder | None]:
    """Runs the workload; returns (seconds, recorder or None)."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, best kept")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"numpy {np.__version__}, {platform.machine()}, {os.cpu_count()} cpus")
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


if __name__ == "__main__":
    main()
