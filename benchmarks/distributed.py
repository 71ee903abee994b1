"""What serving beyond one device costs, on two gloo ranks of this machine's CPU: the
collectives and bytes of a tensor-parallel step, its time at tp=1 and tp=2, and moving a
prompt's saved state from a prefill rank to a decode rank (docs/contract.md §15).

    python -m benchmarks.distributed [--quick]

Every figure is CPU gloo on one machine (both ranks share its cores, each with one BLAS
thread, as torchrun starts them; tp=1 is one such process): the counts are what a GPU run
sends too; the times are not a GPU's.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import print_machine, print_table

MODEL = dict(d_model=256, n_heads=8, n_kv_heads=4, head_dim=32, d_ff=512, windows=(0,) * 8)
BATCH, PROMPT = 16, 32  # sequences a decode step serves, each after a prompt of PROMPT


def executor_for(model, group):
    from numbakv.distributed.tensor_parallel import shard_model
    from numbakv.reference import CellCache
    from numbakv.serve.executor import Executor

    if group is not None:
        model = shard_model(model, group)
    config = model.config.cache_config(capacity=4096, max_width=64, max_seqs=BATCH)
    return Executor(model, CellCache(config), BATCH, 256)


def decode_steps(group, n_steps: int) -> dict:
    """Rank 0: per decode step, seconds and each kind of collective's (calls, bytes); a
    group of one rank serves the whole model alone (tp=1)."""
    from numbakv.distributed.tensor_parallel import TensorParallel, serve
    from numbakv.serve.batch import Input
    from numbakv.serve.model import Model, ModelConfig

    alone = group.world == 1
    executor = executor_for(Model.from_seed(ModelConfig(**MODEL), 0), None if alone else group)
    if group.rank:
        serve(executor, group)
        return {}
    front = executor if alone else TensorParallel(executor, group)
    sessions = [front.open_session() for _ in range(BATCH)]
    rng = np.random.default_rng(0)
    for s in sessions:
        front.execute([Input(s, 0, rng.integers(0, 256, PROMPT).tolist())])
    counts = {k: list(v) for k, v in group.counts.items()}
    start = time.perf_counter()
    for i in range(n_steps):
        front.execute([Input(s, PROMPT + i, [int(rng.integers(0, 256))]) for s in sessions])
    seconds = (time.perf_counter() - start) / n_steps
    per_step = {
        k: ((n - counts.get(k, [0, 0])[0]) / n_steps, (b - counts.get(k, [0, 0])[1]) / n_steps)
        for k, (n, b) in group.counts.items()
    }  # fmt: skip
    if not alone:
        front.close()
    return {"seconds": seconds, "counts": per_step}


def transfers(group, sizes: list[int]) -> list:
    """Rank 0 sends a saved state of each size to rank 1: (tokens, bytes, send s, load s)."""
    from numbakv.core.seq_state import SeqState
    from numbakv.serve.model import ModelConfig

    config = ModelConfig(**MODEL).cache_config(capacity=max(sizes), max_width=64, max_seqs=1,
                                               max_seq_len=max(sizes), dtype="float16")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "state.npz"
        for n in sizes:
            if group.rank == 0:
                state = _state(config, n)
                state.save(path)
                data = path.read_bytes()
                start = time.perf_counter()
                group.send(data, 1)
                group.receive(1)  # the receiver has it
                rows.append((n, len(data), time.perf_counter() - start))
            else:
                data = group.receive(0)
                start = time.perf_counter()
                path.write_bytes(data)
                SeqState.load(path)
                rows.append((n, time.perf_counter() - start))
                group.send("ok", 0)
    return rows


def _state(config, n: int):
    """A state of `n` positions of `config`'s geometry, random K/V, with tokens."""
    from numbakv.core.seq_state import Geometry, SeqState

    geometry, rng = Geometry.of(config), np.random.default_rng(n)
    shape = (n, config.n_kv_heads, config.head_dim)
    kv = [rng.standard_normal(shape).astype(np.float16) for _ in range(2 * config.n_layers)]
    return SeqState(
        geometry=geometry, positions=np.arange(n, dtype=np.int32), k=tuple(kv[::2]),
        v=tuple(kv[1::2]), tokens=rng.integers(0, 256, n).astype(np.int64),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, prompts to 8k")
    args = parser.parse_args(argv)
    from tests.ranks import on_ranks

    print_machine("torch")
    n_steps = 5 if args.quick else 20
    config = ", ".join(f"{k}={v}" for k, v in MODEL.items() if k != "windows")
    print(f"\nA decode step of {BATCH} sequences, {len(MODEL['windows'])} layers, {config}; "
          "CPU gloo, both ranks on this machine's cores")  # fmt: skip
    [alone] = on_ranks(decode_steps, n_steps, world=1, timeout=120, limit=900)
    rank0, _ = on_ranks(decode_steps, n_steps, timeout=120, limit=900)
    rows = [
        [kind, f"{calls:g}", f"{nbytes:,.0f}"] for kind, (calls, nbytes) in rank0["counts"].items()
    ]
    print_table(["collective (rank 0)", "per step", "bytes per step"], rows)
    print(f"  time per step: tp=1 {alone['seconds'] * 1e3:.1f} ms, tp=2 "
          f"{rank0['seconds'] * 1e3:.1f} ms (CPU gloo)")  # fmt: skip
    sizes = [1024, 8192] if args.quick else [1024, 8192, 32768]
    sent, loaded = on_ranks(transfers, sizes, timeout=300, limit=900)
    print("\nA prompt's saved state (float16), prefill rank to decode rank over CPU gloo:")
    rows = [
        [f"{n:,}", f"{nbytes / 2**20:.1f}", f"{s * 1e3:.0f}", f"{nbytes / s / 1e9:.2f}",
         f"{load * 1e3:.0f}"]
        for (n, nbytes, s), (_, load) in zip(sent, loaded, strict=True)
    ]  # fmt: skip
    print_table(["tokens", "MiB", "send ms", "GB/s", "load ms"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
