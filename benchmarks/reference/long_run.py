"""Part 3 of `python -m benchmarks.reference steps`: a long run of small random steps through
the reference (4 sequences, capacity 512), to show it stays usable for tests of thousands of
steps: each step maybe rewinds a sequence or removes and renews one, then decodes or
prefills 1..4 of them; the longest sequence is halved when cells run short."""

import argparse
import time

import numpy as np

from benchmarks.common import print_table
from benchmarks.reference import HEAD_DIM, N_HEADS, N_KV_HEADS, windows_for
from numbakv import CacheConfig
from numbakv.reference import CellCache


def part_long_run(args: argparse.Namespace) -> None:
    """`args.long_steps` steps of `args.layers` layers from seed `args.seed`: their time,
    split into verbs, table and K/V, and the churn they went through."""
    n_seqs, capacity, max_width = 4, 512, 16
    config = CacheConfig(
        n_layers=args.layers, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, capacity=capacity,
        max_width=max_width, max_seqs=n_seqs, windows=windows_for(args.layers, 32),
        dtype="float16",
    )  # fmt: skip
    print(
        f"\n3. long run: {args.long_steps} steps, {n_seqs} sequences, capacity {capacity}, "
        f"max_width {max_width}, float16, windows {config.windows}"
    )
    print(
        "   each step: maybe rewind one sequence (p=0.1) or remove and renew one (p=0.02), "
        "then 1..4 sequences\n"
        "   decode 1 token or (p=0.1) prefill 2..8; the longest sequence is halved when "
        "cells run short"
    )
    rng = np.random.default_rng(args.seed)
    cache = CellCache(config)
    seqs = [cache.seq_new() for _ in range(n_seqs)]
    kv = rng.standard_normal((2, max_width, N_KV_HEADS, HEAD_DIM), dtype=np.float32)
    q = rng.standard_normal((max_width, N_HEADS, HEAD_DIM), dtype=np.float32)
    counts = {"tokens": 0, "rewinds": 0, "renews": 0, "halvings": 0}
    max_read_len = 0
    verb_s = table_s = kv_s = 0.0
    start = time.perf_counter()
    for _ in range(args.long_steps):
        t0 = time.perf_counter()
        churn = rng.random()
        if churn < 0.1:
            seq = seqs[rng.integers(n_seqs)]
            cache.rewind(seq, int(rng.integers(cache.pos(seq) + 1)))
            counts["rewinds"] += 1
        elif churn < 0.12:
            i = int(rng.integers(n_seqs))
            cache.seq_rm(seqs[i])
            seqs[i] = cache.seq_new()
            counts["renews"] += 1
        chosen = rng.choice(n_seqs, size=int(rng.integers(1, 5)), replace=False)
        declared = []
        for i in chosen.tolist():
            n = int(rng.integers(2, 9)) if rng.random() < 0.1 else 1
            declared += [seqs[i]] * n
        declared = declared[:max_width]
        while cache.free_cells < len(declared):
            longest = max(seqs, key=cache.pos)
            cache.rewind(longest, cache.pos(longest) // 2)
            counts["halvings"] += 1
        t1 = time.perf_counter()
        cache.declare_step(declared)
        step = cache.prepare_step()
        t2 = time.perf_counter()
        width = step.width
        for layer in range(config.n_layers):
            cache.write(layer, kv[0, :width], kv[1, :width])
            cache.attend(layer, q[:width])
        t3 = time.perf_counter()
        verb_s += t1 - t0
        table_s += t2 - t1
        kv_s += t3 - t2
        counts["tokens"] += width
        max_read_len = max(max_read_len, cache.read_len)
    elapsed = time.perf_counter() - start
    steps = args.long_steps
    print_table(
        ["steps", "tokens", "seconds", "steps/s", "ms/step", "verbs ms", "table ms", "kv ms",
         "rewinds", "renews", "halvings", "max read_len", "growths"],
        [[
            str(steps), str(counts["tokens"]), f"{elapsed:.2f}", f"{steps / elapsed:.0f}",
            f"{1e3 * elapsed / steps:.2f}", f"{1e3 * verb_s / steps:.3f}",
            f"{1e3 * table_s / steps:.3f}", f"{1e3 * kv_s / steps:.3f}", str(counts["rewinds"]),
            str(counts["renews"]), str(counts["halvings"]), str(max_read_len),
            str(cache.growth_count),
        ]],
    )  # fmt: skip
    print(
        "   verbs: rewind/seq_rm/seq_new churn; table: declare+prepare; kv: write+attend "
        "over all layers (means per step)"
    )
