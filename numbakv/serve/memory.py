"""Where the `Engine`'s sessions and cells come from and where they go (docs/contract.md
§9.2): with a `PrefixCache`, a sample's session starts as a hit's clone, its prompt is
shared once computed, and an ended session is kept as a holder; room for sessions and
cells is made by evicting what the prefix cache alone holds, least recently used first.
With its host tier, what eviction gives back is kept in host memory and a longer prefix
held there is reloaded instead of computed. Without a prefix cache, a session opens
empty and closes at its end, and nothing can be evicted.

The engine reaches the executor and the prefix cache through its `Observed` log, so an
observer that raises never stops one of these calls half-done (`faults`).
"""

from numbakv.serve.events import Notes
from numbakv.serve.requests import Request, Sample


class Sessions:
    """The engine's sessions over `executor`, through `prefix` (a `PrefixCache` over the
    same executor, or None); `notes` hears `hit`, `reload`, `insert`, `offload` and
    `evict`."""

    def __init__(self, executor, prefix, notes: Notes):
        self.executor = executor
        self.prefix = prefix
        self.notes = notes
        self._evicted = 0 if prefix is None else prefix.n_evicted_cells
        host = None if prefix is None else prefix.host
        self._offloaded = (
            (0, 0) if host is None else (host.n_offloaded_tokens, host.n_offloaded_bytes)
        )

    @property
    def free_cells(self) -> int | None:
        """Cells the executor can still place tokens in; None when it does not say."""
        free = getattr(self.executor, "free_cells", None)
        return free if isinstance(free, int) else None

    @property
    def cached_cells(self) -> int:
        """Cells the prefix cache holds alone: what eviction can give back."""
        return 0 if self.prefix is None else self.prefix.cached_cells

    @property
    def n_evicted_cells(self) -> int:
        return self._evicted

    @property
    def host(self):
        """The prefix cache's host tier, or None."""
        return None if self.prefix is None else self.prefix.host

    def pool_hit(self, r: Request, sample: Sample) -> int:
        """Positions of `sample`'s context the pool holds now (the prefix cache's match);
        what a reload from the host tier adds needs cells as computing it would."""
        return 0 if self.prefix is None else self.prefix.match(r.context_ids(sample), r.cache_salt)

    def open(
        self, r: Request, sample: Sample, beside: Sample | None = None
    ) -> tuple[int, int, int]:
        """(a session for `sample`, the positions it already holds, how many of those came
        from the host tier): a clone of its longest cached prefix, or a reload of a longer
        one from host memory (the prefix cache evicts to make room for it), else an empty
        session; its generator as after its sampled tokens. `beside`: a running sample of
        `r` that has computed the prompt, whose prompt cells it shares (through the prefix
        cache's hit, which then holds them)."""
        sampling, drawn = r.sampling_of(sample), len(sample.tokens)
        if beside is not None and self.prefix is None:
            upto = len(r.prompt)
            return self.executor.clone(beside.session, upto, sampling, drawn), upto, 0
        if beside is not None:
            self.shared(r, beside.session)
        if self.prefix is not None:
            tokens, salt = r.context_ids(sample), r.cache_salt
            host = self.prefix.host
            reloaded = 0 if host is None else host.n_reloaded_tokens
            session, m = self.prefix.acquire(tokens, salt, sampling=sampling, drawn=drawn)
            self._note_evictions()  # a reload may evict to make room
            if session is not None:
                reloaded = 0 if host is None else host.n_reloaded_tokens - reloaded
                if reloaded:
                    self.notes("reload", request=r.id, seq=session, tokens=reloaded)
                self.notes("hit", request=r.id, seq=session, tokens=m)
                return session, m, reloaded
        return self.executor.open_session(sampling, drawn), 0, 0

    def shared(self, r: Request, session: int) -> None:
        """`session` (of `r`) has computed the whole prompt: later prompts may hit it."""
        if self.prefix is not None:
            self.prefix.share(session, r.prompt_ids, r.cache_salt)
            self.notes("insert", request=r.id, seq=session, tokens=len(r.prompt), held=False)

    def forked(self, src: int, clone: int) -> None:
        if self.prefix is not None:
            self.prefix.fork(src, clone)

    def end(self, r: Request, sample: Sample) -> None:
        """`sample`'s session ends: the prefix cache keeps it with the positions it holds;
        without one it closes."""
        if self.prefix is None:
            self.executor.close_session(sample.session)
            return
        tokens = r.context_ids(sample, sample.n_fed)
        self.prefix.insert(sample.session, tokens, r.cache_salt)
        self.notes("insert", request=r.id, seq=sample.session, tokens=len(tokens), held=True)
        self._note_evictions()

    def close(self, session: int) -> None:
        """Closes `session` (one `open` gave and nothing ran in), keeping nothing."""
        if self.prefix is None:
            self.executor.close_session(session)
        else:
            self.prefix.close(session)

    def room_for_sessions(self, n: int, reserved: int) -> bool:
        """True when `n` sessions are free besides `reserved`, after giving back the least
        recently used holders as needed; False (and none given back) when they cannot be."""
        free = self.executor.free_sessions - reserved
        holders = 0 if self.prefix is None else self.prefix.n_holders
        if free + holders < n:
            return False
        while self.executor.free_sessions - reserved < n:
            self.prefix.evict_holder()
        self._note_evictions()
        return True

    def room_for_cells(self, n: int) -> bool:
        """True when `n` cells are free, after evicting cached prefixes as needed; False
        (nothing evicted) when the free and evictable cells are fewer."""
        free = self.free_cells
        if free is None or free >= n:
            return True
        if free + self.cached_cells < n:
            return False
        self.evict(n - free)
        return True

    def evict(self, n: int) -> int:
        """Evicts at least `n` cells the prefix cache alone holds, or all it can."""
        if self.prefix is None or n <= 0:
            return 0
        self.prefix.evict(n)
        return self._note_evictions()

    def drop(self) -> int:
        """Releases everything the prefix cache holds alone; returns the cells freed."""
        if self.prefix is None:
            return 0
        self.prefix.drop()
        return self._note_evictions()

    def _note_evictions(self) -> int:
        """An `offload` annotation of what the host tier kept and an `evict` annotation of
        the cells the prefix cache gave back, since the last ones."""
        if self.prefix is None:
            return 0
        host = self.prefix.host
        if host is not None and host.n_offloaded_tokens > self._offloaded[0]:
            tokens, nbytes = host.n_offloaded_tokens, host.n_offloaded_bytes
            saved = tokens - self._offloaded[0], nbytes - self._offloaded[1]
            self.notes("offload", tokens=saved[0], bytes=saved[1], host_bytes=host.nbytes)
            self._offloaded = tokens, nbytes
        freed = self.prefix.n_evicted_cells - self._evicted
        self._evicted += freed
        if freed:
            self.notes("evict", cells=freed, cached_cells=self.prefix.cached_cells)
        return freed
