"""Saved sequences in `python -m benchmarks.gpu_check` (docs/contract.md §13): one
sequence's K/V through every layer saved to the host (`seq_save`: a gather launch per
layer, one copy) and loaded back into the holes another sequence left (`seq_load`: one
copy, a mirror launch, a scatter per layer), timed on the wall clock to a synchronize; the
state loaded must save back equal, byte for byte."""

import time

import numpy as np

from benchmarks.gpu_check.fill import prefilled_cache
from benchmarks.gpu_check.run import Run


def part_saved(run: Run) -> None:
    """Medians over `repeat` saves and loads of one float16 sequence of `history` positions
    (the first attention case's cells) in a cache of `decode_layers` layers."""
    s = run.shapes
    n_kv_heads, _, head_dim = s.decode_heads
    history = s.cases[0][1]
    cache, seqs, _, _ = prefilled_cache(
        run, n_layers=s.decode_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, batch=2,
        max_seq_len=history, history=history, seed=3,
    )  # fmt: skip
    print(f"  {s.decode_layers} layers, {n_kv_heads} KV heads x {head_dim}, float16, one "
          f"sequence of {history} positions; {s.repeat} saves and loads")  # fmt: skip
    cache.seq_rm(seqs[1])  # its cells interleave with seqs[0]'s: the load refills the holes
    stream = cache.stream
    state = cache.seq_save(seqs[0])  # warm-up: the kernels compile
    saves, loads = [], []
    for _ in range(s.repeat):
        began = time.perf_counter()
        state = cache.seq_save(seqs[0])
        saves.append(time.perf_counter() - began)
        began = time.perf_counter()
        copy = cache.seq_load(state)
        stream.synchronize()
        loads.append(time.perf_counter() - began)
        same = cache.seq_save(copy) == state
        cache.seq_rm(copy)
        if not same:
            run.add("saved", "load", result="FAIL: the loaded sequence saves back different")
            return
    for what, times in (("seq_save", saves), ("seq_load", loads)):
        seconds = float(np.median(times))
        rate = state.nbytes / seconds
        cells = {"us": f"{seconds * 1e6:.1f}", "GB/s": f"{rate / 1e9:.3g}"}
        if run.copy_bandwidth:
            cells["of copy"] = f"{rate / run.copy_bandwidth:.3g}"
        run.add("saved", f"{what}, {history} positions x {s.decode_layers} layers", **cells)
