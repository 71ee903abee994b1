"""The reference's step: decode throughput, capacity scaling, a long run (`--parts 1,2,3`).

1. decode throughput: `--seqs` sequences of `--tokens` tokens each (built by prefills of
   at most max_width tokens, random K/V), then decode steps of one token per sequence:
   declare_step + prepare_step (the host "table" part: placement and masks) and, per
   layer, write + attend. float16 and float32 storage, all-global windows and one run with
   a window of 128 on every second layer. Medians over `--repeat` repeats of `--steps`
   steps each; after every repeat the sequences are rewound to `--tokens` (untimed), so
   every repeat decodes from the same state.
2. capacity scaling: the same decode step with capacity 16 Ki ... 1 Mi cells. The pool
   only grows with read_len, so capacity costs just the cell table: [capacity] int32
   positions and [capacity, ceil(max_seqs/64)] uint64 owners.
3. a long run: `--long-steps` small steps of random decode/prefill with rewind and
   remove/new churn (`benchmarks.reference.long_run`).

Timings use time.perf_counter after warm-up steps (the first decode step grows the pool).
"""

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.common import KI, MI, cells_label, mib, print_machine, print_table
from benchmarks.reference import HEAD_DIM, N_HEADS, N_KV_HEADS, windows_for
from benchmarks.reference.long_run import part_long_run
from numbakv import CacheConfig
from numbakv.reference import CellCache

MAX_WIDTH = 64
WINDOW = 128

FULL = {
    "steps": 16,
    "repeat": 7,
    "warmup": 3,
    "capacities": [16 * KI, 64 * KI, 256 * KI, MI],
    "long_steps": 2000,
}
QUICK = {
    "steps": 4,
    "repeat": 3,
    "warmup": 1,
    "capacities": [16 * KI, 256 * KI],
    "long_steps": 300,
}


def header(args: argparse.Namespace) -> None:
    print("numbakv.reference step benchmark" + (" (--quick)" if args.quick else ""))
    print_machine()
    print(
        f"  model    layers={args.layers} n_kv_heads={N_KV_HEADS} n_heads={N_HEADS} "
        f"head_dim={HEAD_DIM} max_width={MAX_WIDTH} max_seqs={args.seqs}"
    )
    print(
        f"  timing   {args.repeat} repeats x {args.steps} decode steps, "
        f"{args.warmup} warm-up steps, medians; seed {args.seed}"
    )


@dataclass
class DecodeResult:
    table_ms: float  # median over repeats of the mean declare+prepare time per step
    kv_ms: float  # the same for write+attend over all layers
    total_ms: float  # median of the per-repeat total per step
    best_ms: float  # fastest repeat's total per step
    construct_s: float
    build_s: float
    read_len: int
    rows: int
    pool_bytes: int
    table_bytes: int
    growths_timed: int


def decode_bench(
    args: argparse.Namespace, dtype: str, windows: tuple[int, ...], capacity: int
) -> DecodeResult:
    """Builds `seqs` x `tokens` of history, then times decode steps (see the module doc)."""
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    config = CacheConfig(
        n_layers=args.layers, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, capacity=capacity,
        max_width=MAX_WIDTH, max_seqs=args.seqs, windows=windows, dtype=dtype,
    )  # fmt: skip
    cache = CellCache(config)
    construct_s = time.perf_counter() - t0

    kv_shape = (MAX_WIDTH, N_KV_HEADS, HEAD_DIM)
    prefill_kv = rng.standard_normal((args.layers, 2, *kv_shape), dtype=np.float32)
    t0 = time.perf_counter()
    seqs = [cache.seq_new() for _ in range(args.seqs)]
    for seq in seqs:
        done = 0
        while done < args.tokens:
            n = min(MAX_WIDTH, args.tokens - done)
            cache.declare_step([seq] * n)
            cache.prepare_step()
            for layer in range(args.layers):
                cache.write(layer, prefill_kv[layer, 0, :n], prefill_kv[layer, 1, :n])
            done += n
    build_s = time.perf_counter() - t0

    n = len(seqs)
    k = rng.standard_normal((args.layers, n, N_KV_HEADS, HEAD_DIM), dtype=np.float32)
    v = rng.standard_normal((args.layers, n, N_KV_HEADS, HEAD_DIM), dtype=np.float32)
    q = rng.standard_normal((args.layers, n, N_HEADS, HEAD_DIM), dtype=np.float32)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        cache.declare_step(seqs)
        cache.prepare_step()
        t1 = time.perf_counter()
        for layer in range(args.layers):
            cache.write(layer, k[layer], v[layer])
            cache.attend(layer, q[layer])
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    def rewind_all() -> None:
        for seq in seqs:
            cache.rewind(seq, args.tokens)

    for _ in range(args.warmup):
        step()
    rewind_all()
    growths = cache.growth_count
    tables, kvs, totals = [], [], []
    for _ in range(args.repeat):
        times = np.array([step() for _ in range(args.steps)])  # [steps, 2] seconds
        rewind_all()
        table_s, kv_s = times.mean(axis=0)
        tables.append(table_s)
        kvs.append(kv_s)
        totals.append(table_s + kv_s)
    return DecodeResult(
        table_ms=1e3 * statistics.median(tables),
        kv_ms=1e3 * statistics.median(kvs),
        total_ms=1e3 * statistics.median(totals),
        best_ms=1e3 * min(totals),
        construct_s=construct_s,
        build_s=build_s,
        read_len=cache.read_len,
        rows=cache.rows,
        pool_bytes=cache.allocated_bytes,
        table_bytes=capacity * 4 + capacity * config.n_owner_words * 8,
        growths_timed=cache.growth_count - growths,
    )


def part_throughput(args: argparse.Namespace) -> None:
    capacity = args.throughput_capacity
    print(
        f"\n1. decode throughput: {args.seqs} sequences x {args.tokens} tokens, "
        f"layers={args.layers}, capacity {cells_label(capacity)} cells"
    )
    print(
        "   one decode step = declare_step(all sequences) + prepare_step() "
        "[table] + per layer write + attend [kv]"
    )
    runs = [("float16", 0), ("float32", 0), ("float16", WINDOW), ("float32", WINDOW)]
    rows, growths = [], 0
    for dtype, window in runs:
        windows = windows_for(args.layers, window)
        r = decode_bench(args, dtype, windows, capacity)
        growths += r.growths_timed
        rows.append([
            dtype, str(windows).replace(" ", ""), f"{r.build_s:.2f}", str(r.read_len),
            f"{r.table_ms:.2f}", f"{r.kv_ms:.2f}", f"{r.total_ms:.2f}", f"{r.best_ms:.2f}",
            f"{1e3 / r.total_ms:.1f}", f"{args.seqs * 1e3 / r.total_ms:.0f}",
        ])  # fmt: skip
    print_table(
        ["dtype", "windows", "build s", "read_len", "table ms", "kv ms", "step ms", "best ms",
         "steps/s", "tokens/s"],
        rows,
    )  # fmt: skip
    print(
        "   build s: prefill of the history (chunks of max_width); table/kv/step ms: "
        "median per decode step;\n"
        "   best ms: fastest repeat; tokens/s = sequences x steps/s; "
        f"pool growths while timing: {growths}"
    )


def part_capacity(args: argparse.Namespace) -> None:
    print(
        f"\n2. capacity scaling: the same decode step ({args.seqs} x {args.tokens}, "
        f"float16, windows {windows_for(args.layers, 0)})"
    )
    results = [
        (capacity, decode_bench(args, "float16", windows_for(args.layers, 0), capacity))
        for capacity in args.capacities
    ]
    base = results[0][1]
    rows = [
        [
            cells_label(capacity), mib(r.table_bytes), str(r.rows), mib(r.pool_bytes),
            f"{1e3 * r.construct_s:.1f}", f"{r.build_s:.2f}", f"{r.table_ms:.2f}",
            f"{r.total_ms:.2f}", f"{r.table_ms / base.table_ms:.2f}",
            f"{r.total_ms / base.total_ms:.2f}",
        ]
        for capacity, r in results
    ]  # fmt: skip
    print_table(
        ["capacity", "table MiB", "pool rows", "pool MiB", "init ms", "build s", "table ms",
         "step ms", "table x", "step x"],
        rows,
    )  # fmt: skip
    print(
        "   table MiB: cell table ([capacity] int32 + [capacity, words] uint64); pool rows/MiB: "
        "K+V of all layers,\n"
        "   grown with read_len only; init ms: CellCache(config); x: ratio to the smallest "
        "capacity (1.00 = flat)"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer steps, repeats, capacities")
    parser.add_argument("--seqs", type=int, default=16, help="sequences decoded together (16)")
    parser.add_argument("--tokens", type=int, default=512, help="history per sequence (512)")
    parser.add_argument("--layers", type=int, default=2, help="layers (2)")
    parser.add_argument("--steps", type=int, help="timed decode steps per repeat (16; quick 4)")
    parser.add_argument("--repeat", type=int, help="repeats, the median is reported (7; quick 3)")
    parser.add_argument("--warmup", type=int, help="untimed decode steps first (3; quick 1)")
    parser.add_argument(
        "--capacities",
        type=lambda s: [int(x) for x in s.split(",")],
        help="comma-separated capacities for part 2 "
        "(16384,65536,262144,1048576; quick 16384,262144)",
    )
    parser.add_argument(
        "--throughput-capacity", type=int, default=16 * KI, help="capacity for part 1 (16384)"
    )
    parser.add_argument("--long-steps", type=int, help="steps of part 3 (2000; quick 300)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (0)")
    parser.add_argument(
        "--parts", default="1,2,3", help="comma-separated parts to run (default 1,2,3)"
    )


def check_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fills the defaults of --quick or not, and refuses a workload that cannot run."""
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("seqs", "tokens", "layers", "steps", "repeat", "long_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first decode step grows the pool)")
    needed = args.seqs * (args.tokens + args.steps + args.warmup)
    for capacity in [args.throughput_capacity, *args.capacities]:
        if capacity < needed:
            parser.error(f"capacity {capacity} < {needed} cells the decode workload needs")
    if args.seqs > MAX_WIDTH:
        parser.error(f"--seqs must be at most max_width={MAX_WIDTH} (one decode step)")
    args.parts = {int(p) for p in args.parts.split(",")}


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    check_arguments(args, parser)
    start = time.perf_counter()
    header(args)
    if 1 in args.parts:
        part_throughput(args)
    if 2 in args.parts:
        part_capacity(args)
    if 3 in args.parts:
        part_long_run(args)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")
    return 0
