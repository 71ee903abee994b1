"""`Engine`: continuous batching of generation requests over a `SessionExecutor` (an
`Executor`, a `Lockstep`).

Each `step()` admits waiting requests in arrival order while sessions and cells are free
(`admission`: preempted requests first; with a prefix cache a prompt starts from its
longest cached prefix, `memory`), fits the scheduler's next batch into the free cells
(evicting cached prefixes, then preempting the youngest request), runs it (decodes first,
prompt chunks in the rest) and returns the tokens it sampled; each token also goes to its
request's `on_token` and through `stream()`, and `generate()` steps until its requests are
done. A request's `n` samples share its prompt's cells (forks: sample i draws with seed
`seed + i`); a sample ends at a stop token (kept) or at `max_new_tokens`, and its session
closes at once (the prefix cache keeps it, if any). A fault never leaves a step half-done:
its bookkeeping ends, then the error propagates. A batch the executor failed ends its
requests with "error", a callback that raises ends only its own request, an observer that
raises costs no request a token. One re-entrant lock makes each call thread-safe;
callbacks may `submit` and `cancel`. `save` and `load` carry a finished conversation to
another engine (`saved`). docs/contract.md §9 says how requests run, §9.1 every fault,
refusal and thread rule, §9.2 prefix reuse and scheduling by memory, §13 saved sequences.
"""

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence

from numbakv.core.errors import ConfigError
from numbakv.core.observe import locked
from numbakv.core.seq_state import SeqState
from numbakv.core.values import int_at_least
from numbakv.serve.admission import Admission
from numbakv.serve.batch import Output
from numbakv.serve.conversations import SavedConversations
from numbakv.serve.events import Annotate, Notes, call_back, check_annotate, check_not_in_callbacks
from numbakv.serve.faults import Observed, StepFaults, completes
from numbakv.serve.kv_events import KVEventsConfig, publisher
from numbakv.serve.ledger import Requests, next_input
from numbakv.serve.memory import Sessions
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.protocol import SessionExecutor
from numbakv.serve.requests import (
    Completion,
    EngineMetrics,
    FinishReason,
    Request,
    Sample,
    TokenEvent,
    check_parts,
    check_prefix_cache,
    check_submission,
)
from numbakv.serve.sampling import GREEDY, Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler, Task, Work
from numbakv.serve.tokenizer import BYTE_TOKENIZER, Tokenizer


class Engine:
    """Serves generation requests with continuous batching.

    executor  : a `SessionExecutor` (an `Executor`, a `Lockstep`) to run batches on
    scheduler : an empty `DecodeFirstScheduler`; default: a budget of the executor's
                max_width tokens, up to half of it decodes, prefill chunks of the rest
    clock     : seconds, for the metrics (default `time.perf_counter`)
    tokenizer : turns text prompts into tokens (default bytes); its vocab_size must not
                pass the executor's
    annotate  : None, or a callable `annotate(kind, **data)` told of each admit, fork,
                finish, cancel, error, pool growth, hit, reload, insert, offload,
                evict, preempt and resume (`numbakv.serve.events`)
    prefix_cache : None (default: every prompt computed whole, sessions closed at their
                end), or a `PrefixCache` over this executor: prompts start from their
                longest cached prefix, ended sessions are kept (docs/contract.md §9.2)
    watermark : cells kept free beyond a new request's uncached prompt when admitting it
    kv_events : None, or a `KVEventsConfig`: the prefix cache's blocks published (§15.1)

        engine = Engine(executor)
        [done] = engine.generate(["Hello"], max_new_tokens=8)
        engine.tokenizer.decode(done.tokens[0])
    """

    def __init__(
        self,
        executor: SessionExecutor,
        scheduler: DecodeFirstScheduler | None = None,
        clock: Callable[[], float] = time.perf_counter,
        tokenizer: Tokenizer = BYTE_TOKENIZER,
        annotate: Annotate | None = None,
        prefix_cache: PrefixCache | None = None,
        watermark: int = 0,
        kv_events: KVEventsConfig | None = None,
    ):
        check_parts(executor, tokenizer, clock)
        check_prefix_cache(prefix_cache, executor)
        self.watermark = int_at_least("watermark", watermark, 0)
        self._observed = Observed()  # the ObserverErrors of the public call in progress
        self._notes = Notes(self._observed.annotate_hook(check_annotate(annotate)))
        if scheduler is None:
            width, n_decodes = executor.max_width, max(1, executor.max_width // 2)
            scheduler = DecodeFirstScheduler(width, n_decodes, max(1, width - n_decodes))
        if not isinstance(scheduler, DecodeFirstScheduler):
            raise ConfigError(f"expected a DecodeFirstScheduler or None, got {scheduler!r}")
        if scheduler.pending():
            raise ConfigError("the scheduler has queued tasks; give the engine an empty one")
        self.executor = executor
        self._executor = self._observed.around(executor)  # calls give results, faults recorded
        self.prefix_cache = prefix_cache
        prefix = None if prefix_cache is None else self._observed.around(prefix_cache)
        self._sessions = Sessions(self._executor, prefix, self._notes)
        self.scheduler = scheduler
        self.clock = clock
        self.tokenizer = tokenizer
        self.n_steps = 0
        self._lock = threading.RLock()
        self._in_callbacks = False  # True while a step calls on_token callbacks
        self._requests = Requests()  # every request by id
        self._waiting: deque[Request] = deque()
        self._running: dict[int, tuple[Request, Sample]] = {}  # session -> its sample
        args = (self._running, self._waiting, self._notes, self.watermark)
        self._admission = Admission(self._sessions, scheduler, *args)
        parts = (self._sessions, self._admission, self._requests)
        self._saved = SavedConversations(executor, self._executor, *parts)
        self.kv_events = publisher(prefix_cache, kv_events)

    # -- requests --------------------------------------------------------------

    @locked
    def submit(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 16,
        sampling: Sampling = GREEDY,
        stop_tokens: Sequence[int] | None = None,
        n: int = 1,
        on_token: Callable[[TokenEvent], None] | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Queues a request and returns its id; it joins the batch at the next `step()` that
        has sessions for it. `prompt` is text (the tokenizer makes it tokens) or token ids
        (ints, not bools) in [0, executor.vocab_size), a 1-d integer array or torch
        tensor of them, or a mapping with "input_ids" (a transformers `BatchEncoding`);
        `stop_tokens` any collection of such ids, default None: the model's end-of-turn
        ids (a transformers model's eos, as its own `generate` stops) and the tokenizer's
        `eos_token_id`, where they have them (`()` stops at none); `on_token` a callable
        or None; `cache_salt` None or a str (prefixes are
        shared only between requests of one salt). Refused (ConfigError, CapacityError)
        with nothing changed (no id used, nothing queued) when an argument is wrong or the
        request could never run."""
        args = (prompt, max_new_tokens, sampling, stop_tokens, n, on_token, cache_salt)
        return self._queue(check_submission(self.executor, self.tokenizer, *args))

    def _queue(self, fields: dict) -> int:
        self._waiting.append(self._requests.add(fields, self.clock()))
        return self._waiting[-1].id

    @locked
    @completes
    def cancel(self, request: int) -> bool:
        """Stops a request, waiting or running: its queued work is dropped and its sessions
        close at once. False when it had already finished. An observer that raised while
        its sessions closed raises once the request is cancelled (ObserverError)."""
        r = self._requests.find(request)
        if r.is_finished:
            return False
        self._stop(r, "cancelled")
        return True

    @locked
    def result(self, request: int) -> Completion:
        """The request's tokens so far, its finish reasons and metrics."""
        return self._requests.find(request).completion()

    @property
    @locked
    def is_busy(self) -> bool:
        """True while any request waits or runs."""
        return bool(self._waiting or self._running)

    @property
    @locked
    def metrics(self) -> EngineMetrics:
        """Steps so far, how the executor's forwards ran (`ForwardCounts`, or None), the
        requests' token counts summed, what the prefix cache evicted and holds, and what
        its host tier holds, kept and reloaded."""
        return self._requests.metrics(
            self.n_steps, self.executor, self._sessions, self.prefix_cache
        )

    @locked
    @completes
    def drop_prefix_cache(self) -> int:
        """Releases every cell the prefix cache holds alone (what running requests hold
        stays); returns how many. 0 without a prefix cache."""
        return self._sessions.drop()

    # -- saved conversations (docs/contract.md §13) -----------------------------

    @locked
    @completes
    def save(self, request: int, path: str | os.PathLike) -> SeqState:
        """Writes request `request`'s conversation to `path` (a `SeqState` file with its
        tokens, positions 0 .. n-1: its prompt and sample 0's tokens but the last) and
        returns the state. The K/V are the prefix cache's, from a sequence of the pool
        holding them, else from its host tier. Refused (ConfigError) without a prefix
        cache, for an unknown request, one whose sample 0 has not finished with "stop" or
        "length", or a salted one (the file keeps no salt); CapacityError when the prefix
        cache gave its cells back and keeps no copy; StateError when the file cannot be
        written."""
        return self._saved.save(request, path)

    @locked
    @completes
    def load(self, path: str | os.PathLike | SeqState) -> int:
        """Loads the conversation at `path` (a file `save` wrote, or its `SeqState`) into
        the prefix cache, as a holder: a later prompt that begins with it hits all of it.
        Room is made as for a request (the prefix cache's least recently used go first).
        Returns its length in tokens. Refused: no prefix cache or another geometry
        (ConfigError), a damaged file or a state without tokens or saved from start > 0
        (StateError), no room for its session or cells (CapacityError); nothing is loaded
        then (what was evicted to make room stays evicted)."""
        return self._saved.load(path)

    # -- running ---------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        """Admits what fits, runs one batch and returns the tokens it sampled ([] when idle).
        Raises the first exception an `on_token` callback (else an observer) raised, once
        the step is done (docs/contract.md §9.1)."""
        events, faults = self._step()
        error = faults.error(self.n_steps)
        if error is not None:
            raise error
        return events

    def stream(self) -> Iterator[TokenEvent]:
        """Steps until idle, yielding every token as it is sampled. Requests may be
        submitted or cancelled between tokens, from any thread. When a callback or an
        observer raised, the step's events are yielded, then the exception ends the
        iterator; nothing is cancelled (a new `stream()` goes on)."""
        while True:
            with self._lock:
                if not self.is_busy:
                    return
                events, faults = self._step()
                error = faults.error(self.n_steps)
            yield from events
            if error is not None:
                raise error

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int = 16,
        sampling: Sampling = GREEDY,
        stop_tokens: Sequence[int] | None = None,
        n: int = 1,
        on_token: Callable[[TokenEvent], None] | None = None,
        cache_salt: str | None = None,
    ) -> list[Completion]:
        """Submits every prompt (all or none: each is checked first), steps until all are
        done, returns their completions in order; `on_token` hears every token of these
        requests as it is sampled. When its own fault stops a step (a callback of these
        requests, the executor) or an interrupt does, the requests of this call still
        unfinished are cancelled, then the exception propagates: nothing is left running
        that no caller holds an id of. Another request's callback or an observer raising
        stops nothing: once these requests are done, the first such exception propagates
        (docs/contract.md §9.1)."""
        if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence):
            raise ConfigError(f"prompts must be a list of prompts, got {prompts!r}; for one: [p]")
        with self._lock:
            check_not_in_callbacks(self._in_callbacks, "generate")
            args = (max_new_tokens, sampling, stop_tokens, n, on_token, cache_salt)
            fields = [check_submission(self.executor, self.tokenizer, p, *args) for p in prompts]
            ids = [self._queue(f) for f in fields]
        requests = [self._requests[i] for i in ids]
        deferred = None  # the first fault of others, raised once these requests are done
        try:
            while not all(r.is_finished for r in requests):
                _, faults = self._step()
                error = faults.error(self.n_steps)
                if error is not None and faults.stops(set(ids)):
                    raise error
                deferred = deferred or error
        except BaseException as error:
            with self._lock, self._observed.noted_on(error):
                for r in requests:
                    if not r.is_finished:
                        self._stop(r, "cancelled")
            if deferred is not None:
                error.add_note(f"numbakv: an earlier step of generate() raised {deferred!r}")
            raise
        if deferred is not None:
            deferred.add_note(f"numbakv: generate() finished its requests {ids} first")
            raise deferred
        return [self.result(i) for i in ids]

    @locked
    def _step(self) -> tuple[list[TokenEvent], StepFaults]:
        """One step: (its events, what its callbacks and observers raised)."""
        check_not_in_callbacks(self._in_callbacks, "step")
        try:
            with self._observed.call() as observed:
                events, raised = self._run_step()
        finally:  # a failed step's changes too (the requests it ended)
            if self.kv_events is not None:
                self.kv_events.publish()
        return events, StepFaults(raised, observed)

    def _run_step(self) -> tuple[list[TokenEvent], dict[int, BaseException]]:
        """Admits, runs one batch, hands out its tokens: (events, what callbacks raised)."""
        self._admission.admit()
        batch = self._admission.fit(self.scheduler.next_batch())
        if not batch:
            return [], {}
        starts = {w.session: self._running[w.session][1].n_fed for w in reversed(batch)}
        again = self._admission.recomputing(batch)
        inputs = [next_input(*self._running[work.session], work) for work in batch]
        requests = {self._running[w.session][0].id: self._running[w.session][0] for w in batch}
        try:
            with self._notes.growth(self.executor):
                outputs = self._executor.execute(inputs)
        except BaseException:
            for session, start in starts.items():  # the executor rewound them there
                self._running[session][1].n_fed = start
            for r in requests.values():  # their work left the queues: they cannot go on
                self._stop(r, "error")
            raise
        self.n_steps += 1
        for r in requests.values():
            r.n_steps += 1
        for r, n in again:
            r.n_recomputed_tokens += n
        events: list[TokenEvent] = []
        for work, out in zip(batch, outputs, strict=True):
            if out.token is not None:
                events += self._sampled(work, out)
        return events, self._call_back(events)

    def _sampled(self, work: Work, out: Output) -> list[TokenEvent]:
        """Hands out a sampled token; after the prompt, the other samples' first tokens too
        (their sessions are the executor's clones, `out.forks`)."""
        r, sample = self._running[work.session]
        if work.kind == "prefill" and sample.index == 0 and sample.n_fed == len(r.prompt):
            self._sessions.shared(r, sample.session)
        pairs = [(sample, out.token)]
        for i, (session, token) in enumerate(out.forks, start=len(r.samples)):
            clone = Sample(i, session, n_fed=sample.n_fed)
            r.samples.append(clone)
            self._running[session] = (r, clone)
            self._sessions.forked(sample.session, session)
            pairs.append((clone, token))
        if out.forks:
            seqs = [session for session, _ in out.forks]
            self._notes("fork", request=r.id, seqs=seqs, source=sample.session)
        if r.first_token_at is None:
            r.first_token_at = self.clock()
        return [self._emit(r, s, token, out.logits) for s, token in pairs]

    def _emit(self, r: Request, sample: Sample, token: int, logits) -> TokenEvent:
        """Appends `token` to `sample`, then queues its next decode or ends it."""
        sample.tokens.append(token)
        reason = None
        if token in r.stop_tokens:
            reason = "stop"
        elif len(sample.tokens) == r.max_new_tokens:
            reason = "length"
        if reason is None:
            self.scheduler.submit([Task(sample.session, "decode", 1)])
        else:
            self._close(r, sample, reason)
        return TokenEvent(r.id, sample.index, token, logits, reason)

    def _call_back(self, events: list[TokenEvent]) -> dict[int, BaseException]:
        """`call_back` with callbacks marked as running (no stepping from them)."""
        self._in_callbacks = True
        try:
            return call_back(events, self._requests, self._stop)
        finally:
            self._in_callbacks = False

    def _stop(self, r: Request, reason: FinishReason) -> None:
        """Ends every unfinished sample of `r` with `reason`, closing its sessions."""
        self._notes("cancel" if reason == "cancelled" else "error", request=r.id)
        if r in self._waiting:
            self._waiting.remove(r)
        for sample in r.samples:
            if sample.finish_reason is None and sample.session is None:  # preempted
                sample.finish_reason = reason
            elif sample.finish_reason is None:
                self.scheduler.cancel(sample.session)
                self._close(r, sample, reason)
        r.samples += [Sample(i, finish_reason=reason) for i in range(len(r.samples), r.n)]
        r.finished_at = self.clock()

    def _close(self, r: Request, sample: Sample, reason: FinishReason) -> None:
        """Ends a sample: its session closes now; the request finishes with its last sample."""
        sample.finish_reason = reason
        del self._running[sample.session]
        self._sessions.end(r, sample)
        self._notes("finish", request=r.id, sample=sample.index, seq=sample.session, reason=reason)
        if len(r.samples) == r.n and all(s.finish_reason for s in r.samples):
            r.finished_at = self.clock()
