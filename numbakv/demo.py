"""`numbakv demo`: a small mixed workload through the reference cell cache.

Prefills, decodes, a clone sharing a prefix, a removal whose holes refill and a
rewind, with every token's attention checked against the solo oracle. Prints the
pool after each phase as a text map.
"""

from collections.abc import Callable

import numpy as np

from numbakv.config import CacheConfig
from numbakv.reference import CellCache, solo_attention
from numbakv.trace import Recorder
from numbakv.viz import render_text
from numbakv.viz.text import cell_char

CONFIG = CacheConfig(
    n_layers=2,
    n_kv_heads=2,
    head_dim=16,
    windows=(0, 8),
    capacity=256,
    max_width=32,
    max_seqs=8,
    initial_cells=16,
)
N_HEADS = 4


class Workload:
    """Drives a cache and keeps each sequence's K/V history for the solo check."""

    def __init__(self, cache: CellCache, seed: int):
        self.cache = cache
        self.rng = np.random.default_rng(seed)
        self.history: dict[int, list[np.ndarray]] = {}  # seq -> per layer [pos, 2, kv, d]
        self.n_steps = self.n_tokens = 0
        self.max_error = 0.0

    def new(self) -> int:
        seq = self.cache.seq_new()
        cfg = self.cache.config
        self.history[seq] = [
            np.zeros((0, 2, cfg.n_kv_heads, cfg.head_dim), np.float32)
        ] * cfg.n_layers
        return seq

    def clone(self, src: int, upto: int) -> int:
        seq = self.cache.seq_clone(src, upto)
        self.history[seq] = [h[:upto] for h in self.history[src]]
        return seq

    def rm(self, seq: int) -> None:
        self.cache.seq_rm(seq)
        del self.history[seq]

    def rewind(self, seq: int, position: int) -> None:
        self.cache.rewind(seq, position)
        self.history[seq] = [h[:position] for h in self.history[seq]]

    def step(self, seq_ids: list[int]) -> None:
        """One forward: random K/V and q for every layer, attention checked against solo."""
        cfg = self.cache.config
        self.cache.declare_step(seq_ids)
        step = self.cache.prepare_step()
        for layer in range(cfg.n_layers):
            shape = (step.width, cfg.n_kv_heads, cfg.head_dim)
            k, v = self.rng.standard_normal((2, *shape), dtype=np.float32)
            q = self.rng.standard_normal((step.width, N_HEADS, cfg.head_dim), dtype=np.float32)
            self.cache.write(layer, k, v)
            got = self.cache.attend(layer, q)
            for t, seq in enumerate(seq_ids):
                kv = np.stack([k[t], v[t]])[None].astype(cfg.dtype).astype(np.float32)
                self.history[seq][layer] = np.concatenate([self.history[seq][layer], kv])
            for t, (seq, p) in enumerate(zip(seq_ids, step.positions.tolist(), strict=True)):
                hist = self.history[seq][layer]
                expect = solo_attention(
                    q[t : t + 1], hist[:, 0], hist[:, 1], [p], cfg.windows[layer]
                )
                self.max_error = max(self.max_error, float(np.abs(got[t] - expect[0]).max()))
        self.n_steps += 1
        self.n_tokens += len(seq_ids)


def run(
    seed: int = 0,
    columns: int = 64,
    trace_path: str | None = None,
    print_fn: Callable[[str], None] = print,
) -> Workload:
    """Runs the demo workload and prints each phase; returns the finished workload.

    trace_path : where to save the table after every step (a `numbakv.trace` .npz)
    """
    work = Workload(CellCache(CONFIG), seed)
    cache = work.cache
    recorder = Recorder(cache)

    def show(title: str) -> None:
        snap = cache.snapshot()
        print_fn(
            f"\n{title}\n  read_len {cache.read_len}  used {cache.used_cells}  "
            f"free {cache.free_cells}  rows {cache.rows}  growths {cache.growth_count}  "
            f"live {' '.join(cell_char(s) for s in cache.live_seqs)}"
        )
        print_fn(render_text(snap, columns))

    a, b, c = work.new(), work.new(), work.new()
    work.step([a] * 12 + [b] * 7 + [c] * 5)
    show("prefill a (12 tokens), b (7), c (5) in one step")
    for _ in range(6):
        work.step([a, b, c])
    show("6 decode steps of [a, b, c]")
    d = work.clone(a, upto=8)
    for _ in range(4):
        work.step([a, b, c, d])
    show("d = clone(a, upto=8) shares a's first 8 cells (*); 4 decode steps of [a, b, c, d]")
    work.rm(b)
    show("seq_rm(b): b's cells are holes below read_len")
    e = work.new()
    work.step([e] * 10)
    show(
        "a new sequence takes the lowest free id (b again); its 10-token prefill refills the holes"
    )
    work.rewind(c, 2)
    for _ in range(3):
        work.step([c, e])
    show("rewind(c, 2), then 3 decode steps of [c, b]")
    print_fn(
        f"\n{work.n_steps} steps, {work.n_tokens} tokens; attention through cells vs solo "
        f"oracle: max |difference| = {work.max_error:.2e}"
    )
    if trace_path:
        recorder.save(trace_path)
        print_fn(f"trace of {work.n_steps} steps saved to {trace_path}")
    return work
