"""A scheduler-like workload on a cell cache: a shared system prompt cloned into most
requests, n = 2 forks, recompute preemption when the pool is nearly full, decode-first
steps with chunked prefill. Given `annotate` (a Recorder's), it names each request's admit,
fork, preempt and finish, so that pictures colour cells by request and mark the
preemptions. tests/viz/test_viz_scale.py draws its trace; `python -m benchmarks.recording
large` records 4 000 steps of it on 65 536 cells.
"""

from collections.abc import Callable

import numpy as np

from numbakv.reference import CellCache

SYSTEM = 512  # tokens of the shared system prompt


class Workload:
    """Requests arriving, prefilled in chunks after the decodes, decoding, finishing, forked
    and preempted; `step()` declares and prepares one step. A request generates a number of
    tokens drawn from [decodes[0], decodes[1]); `annotate(kind, **data)` hears each event."""

    def __init__(
        self, cache: CellCache, rng: np.random.Generator, decodes: tuple[int, int] = (16, 256),
        annotate: Callable[..., object] = lambda kind, **data: None,
    ) -> None:  # fmt: skip
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
