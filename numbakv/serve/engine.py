"""`Engine`: continuous batching of generation requests over an `Executor` (or any
`SessionExecutor`).

A request is a prompt, a token budget, a sampling and stop tokens, asking for `n` samples.
Each `step()` admits waiting requests while sessions are free (in arrival order), asks the
`DecodeFirstScheduler` for the next batch, runs it through the executor and hands out the
tokens it sampled:

- a prompt (text through the engine's tokenizer, or token ids) is one prefill task, served
  in chunks while other sessions decode;
- the prompt's last chunk asks the executor for `n - 1` forks: it clones the session after
  the prompt (the prompt's cells are shared, never copied) and sample i draws with seed
  `seed + i` from the same last-row logits;
- each sampled token becomes the sample's next decode task, until it samples a stop token
  (kept as the last token) or reaches `max_new_tokens`; a finished or cancelled sample's
  session closes at once, freeing its cells for the next step;
- when the executor fails (the pool could not grow), the requests of that batch end with
  finish reason "error" and the error propagates; the other requests go on.

Tokens stream through each request's `on_token` callback, through the events `step()`
returns, and through the `stream()` iterator.
"""

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from numbakv.config import int_at_least
from numbakv.errors import CapacityError, ConfigError
from numbakv.serve.executor import Input, Output
from numbakv.serve.protocol import SessionExecutor
from numbakv.serve.sampling import GREEDY, Sampling, check_sampling
from numbakv.serve.scheduler import DecodeFirstScheduler, Task, Work
from numbakv.serve.tokenizer import BYTE_TOKENIZER, Tokenizer

FinishReason = Literal["length", "stop", "cancelled", "error"]


@dataclass(frozen=True)
class TokenEvent:
    """A token sampled for sample `sample` of request `request`, with the [vocab_size] float32
    logits it was drawn from; `finish_reason` is set on the sample's last token."""

    request: int
    sample: int
    token: int
    logits: np.ndarray = field(repr=False)
    finish_reason: FinishReason | None


@dataclass(frozen=True)
class RequestMetrics:
    """time_to_first_token : seconds from submit to the first sampled token (None before it)
    tokens_per_second      : tokens generated over all samples / seconds from submit to finish
    n_steps                : engine steps that ran any of the request's tokens
    n_tokens               : tokens generated over all samples"""

    time_to_first_token: float | None
    tokens_per_second: float | None
    n_steps: int
    n_tokens: int


@dataclass(frozen=True)
class Completion:
    """A request's result: per sample its tokens and why it ended (None while running)."""

    request: int
    prompt: list[int]
    tokens: list[list[int]]
    finish_reasons: list[FinishReason | None]
    metrics: RequestMetrics


@dataclass
class _Sample:
    index: int
    session: int | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None


@dataclass
class _Request:
    id: int
    prompt: list[int]
    max_new_tokens: int
    sampling: Sampling
    stop_tokens: frozenset[int]
    n: int
    on_token: Callable[[TokenEvent], None] | None
    submitted_at: float
    samples: list[_Sample] = field(default_factory=list)
    n_prefilled: int = 0
    n_steps: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.finished_at is not None


class Engine:
    """Serves generation requests with continuous batching.

    executor  : a `SessionExecutor` (an `Executor`, a `Lockstep`) to run batches on
    scheduler : an empty `DecodeFirstScheduler`; default: a budget of the executor's
                max_width tokens, up to half of it decodes, prefill chunks of the rest
    clock     : seconds, for the metrics (default `time.perf_counter`)
    tokenizer : turns text prompts into tokens (default bytes); its vocab_size must not
                pass the executor's

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
    ):
        _check_parts(executor, tokenizer)
        if scheduler is None:
            width = executor.max_width
            n_decodes = max(1, width // 2)
            scheduler = DecodeFirstScheduler(width, n_decodes, max(1, width - n_decodes))
        if scheduler.pending():
            raise ConfigError("the scheduler has queued tasks; give the engine an empty one")
        self.executor = executor
        self.scheduler = scheduler
        self.clock = clock
        self.tokenizer = tokenizer
        self.n_steps = 0
        self._requests: dict[int, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._running: dict[int, tuple[_Request, _Sample]] = {}  # session -> its sample
        self._reserved = 0  # sessions admitted requests will still clone

    # -- requests --------------------------------------------------------------

    def submit(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 16,
        sampling: Sampling = GREEDY,
        stop_tokens: Sequence[int] = (),
        n: int = 1,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> int:
        """Queues a request and returns its id; it joins the batch at the next `step()` that
        has sessions for it. `prompt` is text (the tokenizer makes it tokens) or token ids
        in [0, executor.vocab_size). Refused (ConfigError, CapacityError) when it could
        never run."""
        tokens = self._tokens(prompt)
        max_new_tokens = int_at_least("max_new_tokens", max_new_tokens, 1)
        n = int_at_least("n", n, 1)
        check_sampling(sampling)
        if n > self.executor.max_sessions:
            raise CapacityError(
                f"n={n} samples need more than max_sessions={self.executor.max_sessions}"
            )
        if len(tokens) + max_new_tokens > self.executor.max_session_tokens:
            raise CapacityError(
                f"a prompt of {len(tokens)} tokens and max_new_tokens={max_new_tokens} pass "
                f"max_session_tokens={self.executor.max_session_tokens}"
            )
        request = _Request(
            len(self._requests), tokens, max_new_tokens, sampling,
            frozenset(int(t) for t in stop_tokens), n, on_token, self.clock(),
        )  # fmt: skip
        self._requests[request.id] = request
        self._waiting.append(request)
        return request.id

    def _tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """The prompt's tokens, or ConfigError when they are none or outside the vocabulary."""
        if isinstance(prompt, str):
            tokens = [int(t) for t in self.tokenizer.encode(prompt)]
        else:
            tokens = [int(t) for t in prompt]
        vocab_size = self.executor.vocab_size
        if not tokens or min(tokens) < 0 or max(tokens) >= vocab_size:
            raise ConfigError(f"a prompt is 1 or more tokens in [0, {vocab_size}), got {tokens}")
        return tokens

    def cancel(self, request: int) -> bool:
        """Stops a request, waiting or running: its queued work is dropped and its sessions
        close at once. False when it had already finished."""
        r = self._request(request)
        if r.is_finished:
            return False
        self._stop(r, "cancelled")
        return True

    def result(self, request: int) -> Completion:
        """The request's tokens so far, its finish reasons and metrics."""
        r = self._request(request)
        samples = r.samples or [_Sample(i) for i in range(r.n)]
        n_tokens = sum(len(s.tokens) for s in samples)
        ttft = None if r.first_token_at is None else r.first_token_at - r.submitted_at
        elapsed = None if r.finished_at is None else r.finished_at - r.submitted_at
        rate = n_tokens / elapsed if elapsed else None
        return Completion(
            r.id, list(r.prompt), [list(s.tokens) for s in samples],
            [s.finish_reason for s in samples], RequestMetrics(ttft, rate, r.n_steps, n_tokens),
        )  # fmt: skip

    @property
    def is_busy(self) -> bool:
        """True while any request waits or runs."""
        return bool(self._waiting or self._running)

    # -- running ---------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        """Admits what fits, runs one batch and returns the tokens it sampled ([] when idle)."""
        self._admit()
        batch = self.scheduler.next_batch()
        if not batch:
            return []
        inputs = [self._input(work) for work in batch]
        requests = {self._running[w.session][0].id: self._running[w.session][0] for w in batch}
        try:
            outputs = self.executor.execute(inputs)
        except Exception:
            for r in requests.values():  # their work left the queues: they cannot go on
                self._stop(r, "error")
            raise
        self.n_steps += 1
        for r in requests.values():
            r.n_steps += 1
        events: list[TokenEvent] = []
        for work, out in zip(batch, outputs, strict=True):
            if out.token is not None:
                events += self._sampled(work, out)
        return events

    def stream(self) -> Iterator[TokenEvent]:
        """Steps until idle, yielding every token as it is sampled. Requests may be
        submitted or cancelled between tokens."""
        while self.is_busy:
            yield from self.step()

    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int = 16,
        sampling: Sampling = GREEDY,
        stop_tokens: Sequence[int] = (),
        n: int = 1,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> list[Completion]:
        """Submits every prompt, steps until all are done, returns their completions in order;
        `on_token` hears every token of these requests as it is sampled."""
        ids = [self.submit(p, max_new_tokens, sampling, stop_tokens, n, on_token) for p in prompts]
        while not all(self._requests[i].is_finished for i in ids):
            self.step()
        return [self.result(i) for i in ids]

    def _admit(self) -> None:
        """Opens a session for each waiting request, oldest first, while sessions are free
        for all its samples; a request that does not fit holds back the ones behind it."""
        while self._waiting and self._waiting[0].n <= self.executor.free_sessions - self._reserved:
            r = self._waiting.popleft()
            sample = _Sample(0, self.executor.open_session(r.sampling))
            r.samples.append(sample)
            self._reserved += r.n - 1
            self._running[sample.session] = (r, sample)
            self.scheduler.submit([Task(sample.session, "prefill", len(r.prompt))])

    def _input(self, work: Work) -> Input:
        r, sample = self._running[work.session]
        if work.kind == "decode":
            position = len(r.prompt) + len(sample.tokens) - 1
            return Input(work.session, position, sample.tokens[-1:])
        start = r.n_prefilled
        r.n_prefilled += work.n_tokens
        chunk = r.prompt[start : r.n_prefilled]
        if r.n_prefilled < len(r.prompt):
            return Input(work.session, start, chunk, sample=False)
        forks = tuple(replace(r.sampling, seed=r.sampling.seed + i) for i in range(1, r.n))
        return Input(work.session, start, chunk, forks=forks)

    def _sampled(self, work: Work, out: Output) -> list[TokenEvent]:
        """Hands out a sampled token; after the prompt, the other samples' first tokens too
        (their sessions are the executor's clones, `out.forks`)."""
        r, sample = self._running[work.session]
        pairs = [(sample, out.token)]
        for i, (session, token) in enumerate(out.forks, start=1):
            clone = _Sample(i, session)
            r.samples.append(clone)
            self._running[session] = (r, clone)
            pairs.append((clone, token))
        self._reserved -= len(out.forks)
        if r.first_token_at is None:
            r.first_token_at = self.clock()
        return [self._emit(r, s, token, out.logits) for s, token in pairs]

    def _emit(self, r: _Request, sample: _Sample, token: int, logits) -> TokenEvent:
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
        event = TokenEvent(r.id, sample.index, token, logits, reason)
        if r.on_token is not None:
            r.on_token(event)
        return event

    def _stop(self, r: _Request, reason: FinishReason) -> None:
        """Ends every unfinished sample of `r` with `reason`, closing its sessions."""
        if r in self._waiting:
            self._waiting.remove(r)
        for sample in r.samples:
            if sample.finish_reason is None:
                self.scheduler.cancel(sample.session)
                self._close(r, sample, reason)
        if r.samples:  # admitted: release the sessions its clones would have taken
            self._reserved -= r.n - len(r.samples)
        r.samples += [_Sample(i, finish_reason=reason) for i in range(len(r.samples), r.n)]
        r.finished_at = self.clock()

    def _close(self, r: _Request, sample: _Sample, reason: FinishReason) -> None:
        """Ends a sample: its session closes now; the request finishes with its last sample."""
        sample.finish_reason = reason
        del self._running[sample.session]
        self.executor.close_session(sample.session)
        if len(r.samples) == r.n and all(s.finish_reason for s in r.samples):
            r.finished_at = self.clock()

    def _request(self, request: int) -> _Request:
        if request not in self._requests:
            raise ConfigError(f"no request {request}; submit() returns request ids")
        return self._requests[request]


def _check_parts(executor: SessionExecutor, tokenizer: Tokenizer) -> None:
    """ConfigError unless `executor` is a `SessionExecutor` and `tokenizer` a `Tokenizer`
    whose tokens the executor takes."""
    if not isinstance(executor, SessionExecutor):
        raise ConfigError(f"expected a SessionExecutor (an Executor, a Lockstep), got {executor!r}")
    if not isinstance(tokenizer, Tokenizer):
        raise ConfigError(f"expected a Tokenizer (vocab_size, encode, decode), got {tokenizer!r}")
    if tokenizer.vocab_size > executor.vocab_size:
        raise ConfigError(
            f"the tokenizer's vocab_size={tokenizer.vocab_size} passes the executor's "
            f"vocab_size={executor.vocab_size}"
        )
