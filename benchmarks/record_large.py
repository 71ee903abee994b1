"""Recording a large scheduler-like workload through the reference cache (issue 15): a shared
system prompt cloned into most requests, n = 2 forks, recompute preemption when the pool is
nearly full, decode-first steps with chunked prefill; 65 536 cells, 128 sequences, width
256, a `Recorder` frame per step.

    python benchmarks/record_large.py                  # masks computed when read (now)
    python benchmarks/record_large.py --eager-masks    # every mask at every step (before)
    python benchmarks/record_large.py --steps 500      # a shorter run
    python benchmarks/record_large.py --long           # decodes of 128-1024 tokens: the
                                                       # pool fills and requests are preempted
    python benchmarks/record_large.py --save big.npz   # keep the trace for plot_large.py

The workload annotates the trace (admit, fork, preempt, finish, each naming its request),
so its pictures colour cells by request and mark the preemptions. Prints the seconds of
the whole run (one updating progress line on stderr while it runs).
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's numbakv

from numbakv.reference import CacheConfig, CellCache
from numbakv.trace import Recorder
from numbakv.viz.progress import Progress

SYSTEM = 512  # tokens of the shared system prompt


class Workload:
    """Requests arriving, prefilled in chunks after the decodes, decoding, finishing, forked
    and preempted; `step()` declares and prepares one step."""

    def __init__(self, cache: CellCache, rng: np.random.Generator, decodes=(16, 256),
                 annotate=lambda kind, **data: None):  # fmt: skip
        self.cache, self.rng, self.decodes, self.annotate = cache, rng, decodes, annotate
        self.requests: dict[int, int] = {}  # seq -> its request
        self.n_requests = 0
        self.system = cache.seq_new()
        for start in range(0, SYSTEM, 256):
            cache.declare_step([self.system] * min(256, SYSTEM - start))
            cache.prepare_step()
        self.prefill: dict[int, int] = {}  # seq -> prompt tokens left
        self.decode: dict[int, int] = {}  # seq -> tokens left to generate
        self.preemptions = 0

    def step(self) -> None:
        cache, cfg = self.cache, self.cache.config
        while len(cache.live_seqs) < cfg.max_seqs - 2 and self.rng.random() < 0.3:
            self.admit()
        ids = list(self.decode)[: cfg.max_width]
        for seq in list(self.prefill):
            take = min(self.prefill[seq], cfg.max_width - len(ids))
            if take <= 0:
                break
            ids += [seq] * take
            self.prefill[seq] -= take
        while len(ids) > cache.free_cells:  # recompute preemption: drop the newest decode
            victim = max(self.decode)
            del self.decode[victim]
            cache.seq_rm(victim)
            self.annotate("preempt", request=self.requests.pop(victim), seq=victim)
            ids = [s for s in ids if s != victim]
            self.preemptions += 1
        if ids:
            cache.declare_step(ids)
            cache.prepare_step()
        self.finish()

    def admit(self) -> None:
        seq = self.cache.seq_clone(self.system)
        self.prefill[seq] = int(self.rng.integers(16, 384))
        self.requests[seq], self.n_requests = self.n_requests, self.n_requests + 1
        self.annotate("admit", request=self.requests[seq], seqs=[seq])

    def finish(self) -> None:
        for seq, left in list(self.prefill.items()):
            if left == 0:
                del self.prefill[seq]
                self.decode[seq] = int(self.rng.integers(*self.decodes))
                if self.rng.random() < 0.25 and len(self.cache.live_seqs) < 126:
                    fork = self.cache.seq_clone(seq)
                    self.decode[fork] = int(self.rng.integers(*self.decodes))
                    self.requests[fork] = self.requests[seq]
                    self.annotate("fork", request=self.requests[seq], seqs=[fork])
        for seq in list(self.decode):
            self.decode[seq] -= 1
            if self.decode[seq] <= 0:
                del self.decode[seq]
                self.cache.seq_rm(seq)
                self.annotate("finish", request=self.requests.pop(seq), seq=seq)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--eager-masks", action="store_true", help="the old rule, for contrast")
    parser.add_argument("--long", action="store_true", help="decodes of 128-1024 tokens")
    parser.add_argument("--save", metavar="PATH", help="save the trace (.npz) for plot_large.py")
    args = parser.parse_args(argv)
    config = CacheConfig(n_layers=2, n_kv_heads=1, head_dim=8, windows=(0, 512),
                         capacity=65536, max_width=256, max_seqs=128, max_seq_len=4096,
                         initial_cells=4096)  # fmt: skip
    cache = CellCache(config)
    started = time.perf_counter()
    recorder = Recorder(cache)
    if args.eager_masks:  # what prepare_step did before masks were computed when read
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


if __name__ == "__main__":
    sys.exit(main())
