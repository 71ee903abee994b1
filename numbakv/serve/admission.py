"""`Admission`: which of the `Engine`'s requests hold sessions, scheduled by memory
(docs/contract.md §9.2).

- **Admit.** Waiting requests are placed in order — preempted ones first (they went back
  to the front), then first come, first served — while sessions for all their samples
  and cells for their uncached tokens (plus the watermark) are free or can be made so by
  evicting what the prefix cache alone holds; a request that does not fit holds back the
  ones behind it. With nothing running, the head is placed anyway (it fits the pool:
  `submit` checked). A request whose prompt a running request is still prefilling waits
  for that prefill, so it hits it instead of computing it again.
- **Fit.** Before a batch runs, the cells its tokens take must be free: cached prefixes
  are evicted first (least recently used, tail first), then the youngest running request
  is preempted by recompute (its sessions end into the prefix cache, its tokens are
  kept, and it resumes before new admissions), until the batch fits; the oldest request
  always runs.
"""

from collections import deque

import numpy as np

from numbakv.serve.events import Notes
from numbakv.serve.memory import Sessions
from numbakv.serve.radix import common_length
from numbakv.serve.requests import Request, Sample
from numbakv.serve.scheduler import DecodeFirstScheduler, Task, Work


class Admission:
    """Places the engine's waiting requests and fits its batches; `running` (session ->
    (request, sample)) and `waiting` are the engine's own."""

    def __init__(
        self,
        sessions: Sessions,
        scheduler: DecodeFirstScheduler,
        running: dict[int, tuple[Request, Sample]],
        waiting: deque[Request],
        notes: Notes,
        watermark: int,
    ):
        self.sessions = sessions
        self.scheduler = scheduler
        self.running = running
        self.waiting = waiting
        self.notes = notes
        self.watermark = watermark

    def admit(self) -> None:
        """Places waiting requests while they fit (the module docstring)."""
        while self.waiting and self.place(self.waiting[0]):
            self.waiting.popleft()

    def place(self, r: Request) -> bool:
        """Opens sessions for `r`'s samples and queues their prefills; True once all are
        placed, False (nothing changed) when there is no room. A new request places sample
        0 (its forks come at the prompt's end). A resumed one with several samples comes
        back in two parts, so it never needs more cells than `submit` allowed: one sample
        first, the others once that one has computed the prompt again, sharing its cells."""
        if not r.samples:
            if self._prefilling(r.prompt_ids, r.cache_salt):
                return False
            return self._open(r, [Sample(0)], r.n)
        unplaced = [s for s in r.samples if s.finish_reason is None and s.session is None]
        placed = [s for s in r.samples if s.finish_reason is None and s.session is not None]
        n_sessions = len(unplaced) + r.n - len(r.samples)  # and its forks still to come
        if not placed:
            return self._open(r, unplaced[:1], n_sessions) and len(unplaced) == 1
        if placed[0].n_fed < len(r.prompt):
            return False
        return self._open(r, unplaced, n_sessions, beside=placed[0])

    def _open(
        self, r: Request, samples: list[Sample], n_sessions: int, beside: Sample | None = None
    ) -> bool:
        """Opens a session for each of `samples` (sharing `beside`'s prompt, when given)
        once `n_sessions` sessions and their cells are free or can be made so."""
        resumed = bool(r.samples)
        if not self.sessions.room_for_sessions(n_sessions, self.reserved()):
            return False
        if self.running and self.sessions.host is not None:  # a reload is work: room first,
            pool = sum(len(r.context(s)) - self.sessions.pool_hit(r, s) for s in samples)
            if not self.sessions.room_for_cells(pool + self.watermark):  # by the pool's hit
                return False
        opened = [(sample, *self.sessions.open(r, sample, beside)) for sample in samples]
        needed = sum(len(r.context(s)) - m for s, _, m, _ in opened) + self.watermark
        if self.running and not self.sessions.room_for_cells(needed):
            for _, session, _, _ in opened:
                self.sessions.close(session)
            return False
        for sample, session, m, reloaded in opened:
            sample.session, sample.n_fed = session, m
            if resumed:  # prompt positions it never computed, now hit: cached, not computed
                n_prompt = len(r.prompt)
                r.n_cached_tokens += max(0, min(m, n_prompt) - min(sample.n_done, n_prompt))
            else:
                r.samples.append(sample)
                r.n_cached_tokens, r.n_host_cached_tokens = m, reloaded
            self.running[session] = (r, sample)
            self.scheduler.submit([Task(session, "prefill", len(r.context(sample)) - m)])
        seqs = [session for _, session, _, _ in opened]
        self.notes("resume" if resumed else "admit", request=r.id, seqs=seqs)
        return True

    def recomputing(self, batch: list[Work]) -> list[tuple[Request, int]]:
        """Per prefill work of `batch`, before it runs: (its request, the positions it
        computes again), those below what its sample held before a preemption (`n_done`).
        Counted once they ran, so a request preempted again before recomputing them does
        not count them twice."""
        again, fed = [], {}  # fed: where each session's next work starts (one may have two)
        for w in batch:
            r, sample = self.running[w.session]
            start = fed.get(w.session, sample.n_fed)
            fed[w.session] = start + w.n_tokens
            if w.kind == "prefill":
                again.append((r, max(0, min(start + w.n_tokens, sample.n_done) - start)))
        return again

    def reserved(self) -> int:
        """Sessions the running requests' forks will still take."""
        running = {r.id: r for r, _ in self.running.values()}
        return sum(r.n - len(r.samples) for r in running.values())

    def fit(self, batch: list[Work]) -> list[Work]:
        """`batch`, once the cells its tokens take are free (the module docstring); the
        work of preempted requests leaves it."""
        while True:
            needed, free = sum(w.n_tokens for w in batch), self.sessions.free_cells
            if free is None or needed <= free:
                return batch
            if self.sessions.cached_cells:
                self.sessions.evict(needed - free)
                continue
            requests = {r.id: r for r, _ in self.running.values()}
            if len(requests) < 2:
                return batch  # the oldest always runs: submit made sure it fits the pool
            self.preempt(requests[max(requests)])
            batch = [w for w in batch if w.session in self.running]

    def preempt(self, r: Request) -> None:
        """Ends `r`'s running sessions into the prefix cache (closed without one) and puts
        it first in the queue; its tokens are kept, what it computed again is counted."""
        seqs = []
        for sample in r.samples:
            if sample.session is not None and sample.finish_reason is None:
                self.scheduler.cancel(sample.session)
                del self.running[sample.session]
                self.sessions.end(r, sample)
                seqs.append(sample.session)
                sample.n_done = max(sample.n_done, sample.n_fed)
                sample.session, sample.n_fed = None, 0
        r.n_preemptions += 1
        if r not in self.waiting:  # a resume in two parts waits there already
            self.waiting.appendleft(r)
        self.notes("preempt", request=r.id, seqs=seqs)

    def _prefilling(self, prompt: np.ndarray, salt: str | None) -> bool:
        """True when a running request of `salt` is still computing at least half of what
        the prefix cache lacks of `prompt`: waiting for it turns that into a hit."""
        if self.sessions.prefix is None:
            return False
        cached = self.sessions.prefix.match(prompt, salt)
        for other, sample in self.running.values():
            if sample.index or other.cache_salt != salt or sample.n_fed >= len(other.prompt):
                continue
            shared = common_length(other.prompt_ids, prompt, 0, len(prompt) - 1)
            if 2 * (shared - cached) >= len(prompt) - cached:
                return True
        return False
