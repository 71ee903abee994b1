"""The `Engine`'s requests: what a caller gets back (`TokenEvent`, `Completion`,
`RequestMetrics`), what the engine keeps per request and per sample, and the checks of a
submission's arguments (ConfigError, naming the bad value, before anything is queued) and
of the engine's parts."""

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from numbakv.core import arrays
from numbakv.core.errors import CapacityError, ConfigError
from numbakv.core.values import as_int, int_at_least, token_ids
from numbakv.serve.graphs import ForwardCounts
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.protocol import SessionExecutor
from numbakv.serve.sampling import Sampling, check_sampling
from numbakv.serve.targets import check_salt
from numbakv.serve.tokenizer import Tokenizer

FinishReason = Literal["length", "stop", "cancelled", "error"]


@dataclass(frozen=True)
class TokenEvent:
    """A token sampled for sample `sample` of request `request_id`, with the [vocab_size]
    float32 logits it was drawn from; `finish_reason` is set on the sample's last token."""

    request_id: int
    sample: int
    token: int
    logits: np.ndarray = field(repr=False)
    finish_reason: FinishReason | None


@dataclass(frozen=True)
class RequestMetrics:
    """time_to_first_token : seconds from submit to the first sampled token (None before it)
    tokens_per_second      : tokens generated over all samples / seconds from submit to finish
    n_steps                : engine steps that ran any of the request's tokens
    n_tokens               : tokens generated over all samples
    n_prompt_tokens        : tokens of its prompt
    n_cached_tokens        : of those, served from the prefix cache and never computed
                             by it (an OpenAI-style usage `cached_tokens`): the hit when
                             admitted, and a resume's hit past what it had computed; from
                             the pool and from its host tier together
    n_recomputed_tokens    : positions computed again after a preemption, each time they
                             were (never hits)
    n_preemptions          : times it was preempted
    n_host_cached_tokens   : of n_cached_tokens, those reloaded from host memory (the rest,
                             `n_pool_cached_tokens`, were in the pool)"""

    time_to_first_token: float | None
    tokens_per_second: float | None
    n_steps: int
    n_tokens: int
    n_prompt_tokens: int = 0
    n_cached_tokens: int = 0
    n_recomputed_tokens: int = 0
    n_preemptions: int = 0
    n_host_cached_tokens: int = 0

    @property
    def n_pool_cached_tokens(self) -> int:
        return self.n_cached_tokens - self.n_host_cached_tokens


@dataclass(frozen=True)
class EngineMetrics:
    """n_steps : engine steps so far
    forwards   : how the executor's forwards ran (captures, replays, eager_forwards), None
                 when the executor does not count them
    n_prompt_tokens, n_cached_tokens, n_recomputed_tokens, n_preemptions : the sums of
                 every request's (`RequestMetrics`)
    n_evicted_cells : cells the prefix cache gave back so far
    n_cached_cells  : cells the prefix cache holds alone now (0 without one)
    n_host_cached_tokens : the sum of every request's (of n_cached_tokens, those reloaded
                 from host memory); `n_pool_cached_tokens` the rest
    n_host_bytes    : K/V bytes the prefix cache's host tier holds now (0 without one)
    n_offloaded_tokens, n_reloads : positions its host tier kept so far, and the hits it
                 served (reloads into the pool), 0 without one

    `n_computed_tokens` is what prefill computed: n_prompt_tokens - n_cached_tokens +
    n_recomputed_tokens."""

    n_steps: int
    forwards: ForwardCounts | None
    n_prompt_tokens: int = 0
    n_cached_tokens: int = 0
    n_recomputed_tokens: int = 0
    n_preemptions: int = 0
    n_evicted_cells: int = 0
    n_cached_cells: int = 0
    n_host_cached_tokens: int = 0
    n_host_bytes: int = 0
    n_offloaded_tokens: int = 0
    n_reloads: int = 0

    @property
    def n_pool_cached_tokens(self) -> int:
        return self.n_cached_tokens - self.n_host_cached_tokens

    @property
    def n_computed_tokens(self) -> int:
        return self.n_prompt_tokens - self.n_cached_tokens + self.n_recomputed_tokens


@dataclass(frozen=True)
class Completion:
    """A request's result: per sample its tokens and why it ended (None while running)."""

    request_id: int
    prompt: list[int]
    tokens: list[list[int]]
    finish_reasons: list[FinishReason | None]
    metrics: RequestMetrics


@dataclass
class Sample:
    """One of a request's n samples: its session while it runs, its tokens, its end."""

    index: int
    session: int | None = None
    tokens: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    n_fed: int = 0  # positions its session holds once the work taken for it has run
    n_done: int = 0  # the most positions it ever held (what a resume computes again)


@dataclass
class Request:
    """A submitted request and how far it got; `samples` fills as its clones are made."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    sampling: Sampling
    stop_tokens: frozenset[int]
    n: int
    on_token: Callable[[TokenEvent], None] | None
    submitted_at: float
    cache_salt: str | None = None
    samples: list[Sample] = field(default_factory=list)
    n_steps: int = 0
    n_cached_tokens: int = 0
    n_host_cached_tokens: int = 0
    n_recomputed_tokens: int = 0
    n_preemptions: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.finished_at is not None

    def context(self, sample: Sample) -> list[int]:
        """The tokens `sample` has: the prompt, then what it sampled."""
        return self.prompt + sample.tokens

    @functools.cached_property
    def prompt_ids(self) -> np.ndarray:
        """[len(prompt)] int64: the prompt as the prefix cache reads it, made once."""
        return np.fromiter(self.prompt, np.int64, len(self.prompt))

    def context_ids(self, sample: Sample, n: int | None = None) -> np.ndarray:
        """The first `n` (default all) of `context(sample)`, as [n] int64."""
        ids = self.prompt_ids
        if sample.tokens:
            ids = np.concatenate([ids, np.asarray(sample.tokens, np.int64)])
        return ids[:n]

    def sampling_of(self, sample: Sample) -> Sampling:
        """Sample i draws with seed `seed + i`."""
        return replace(self.sampling, seed=self.sampling.seed + sample.index)

    def completion(self) -> Completion:
        """Its tokens so far, its finish reasons and metrics."""
        samples = self.samples or [Sample(i) for i in range(self.n)]
        n_tokens = sum(len(s.tokens) for s in samples)
        ttft = None if self.first_token_at is None else self.first_token_at - self.submitted_at
        elapsed = None if self.finished_at is None else self.finished_at - self.submitted_at
        rate = n_tokens / elapsed if elapsed else None
        metrics = RequestMetrics(
            ttft, rate, self.n_steps, n_tokens, len(self.prompt), self.n_cached_tokens,
            self.n_recomputed_tokens, self.n_preemptions, self.n_host_cached_tokens,
        )  # fmt: skip
        return Completion(
            self.id, list(self.prompt), [list(s.tokens) for s in samples],
            [s.finish_reason for s in samples], metrics,
        )  # fmt: skip


def check_submission(
    executor, tokenizer, prompt, max_new_tokens, sampling, stop_tokens, n, on_token,
    cache_salt=None,
) -> dict:  # fmt: skip
    """`Engine.submit`'s arguments, checked against `executor`'s limits, as the fields of a
    `Request`; ConfigError or CapacityError at the first wrong one."""
    tokens = prompt_tokens(prompt, tokenizer, executor.vocab_size)
    max_new_tokens = int_at_least("max_new_tokens", max_new_tokens, 1)
    n = int_at_least("n", n, 1)
    check_sampling(sampling)
    if stop_tokens is None:
        stop_tokens = default_stop_tokens(executor, tokenizer)
    else:
        stop_tokens = check_stop_tokens(stop_tokens, executor.vocab_size)
    check_on_token(on_token)
    if n > executor.max_sessions:
        raise CapacityError(
            f"n={n} samples need more than max_sessions={executor.max_sessions}; "
            f"ask for n <= {executor.max_sessions}"
        )
    if len(tokens) + max_new_tokens > executor.max_session_tokens:
        raise CapacityError(
            f"a prompt of {len(tokens)} tokens and max_new_tokens={max_new_tokens} pass "
            f"max_session_tokens={executor.max_session_tokens}; shorten one of them"
        )
    worst = len(tokens) + n * (max_new_tokens - 1)  # the samples share the prompt's cells
    capacity = getattr(executor, "capacity", None)
    if isinstance(capacity, int) and worst > capacity:
        raise CapacityError(
            f"a prompt of {len(tokens)} tokens and n={n} samples of max_new_tokens="
            f"{max_new_tokens} need {worst} cells, more than the pool's capacity {capacity}: "
            "the request could never run; shorten it or ask for fewer samples"
        )
    return dict(
        prompt=tokens, max_new_tokens=max_new_tokens, sampling=sampling,
        stop_tokens=stop_tokens, n=n, on_token=on_token, cache_salt=check_salt(cache_salt),
    )  # fmt: skip


def prompt_tokens(prompt, tokenizer, vocab_size: int) -> list[int]:
    """The prompt's tokens: text through `tokenizer`; token ids as a sequence of ints or a
    1-d integer array or torch tensor; or a mapping with "input_ids" of those (what a
    transformers tokenizer returns, a `BatchEncoding`). ConfigError naming what it got when
    it is none of these, or the ids are none, not ints or outside [0, vocab_size)."""
    if isinstance(prompt, str):
        tokens = tokenizer.encode(prompt)
        return token_ids("tokenizer.encode(prompt)", tokens, vocab_size, ConfigError)
    name = "prompt"
    if isinstance(prompt, Mapping):
        if "input_ids" not in prompt:
            keys = sorted(str(k) for k in prompt)[:4]
            raise ConfigError(
                f"prompt is a {type(prompt).__name__} without input_ids (keys {keys}); give "
                "text, token ids, or a tokenizer's output (a mapping with input_ids)"
            )
        name, prompt = "prompt['input_ids']", prompt["input_ids"]
    if arrays.is_torch(prompt):
        prompt = prompt.detach().cpu().numpy()
    return token_ids(name, prompt, vocab_size, ConfigError)


def default_stop_tokens(executor, tokenizer) -> frozenset[int]:
    """The tokens a request stops at when it names none: the served model's `stop_tokens`
    (a transformers model's eos ids) and the tokenizer's `eos_token_id`, where they have
    them; none for numbakv's own models and the byte tokenizer."""
    model = getattr(executor, "model", None)
    tokens = set(getattr(model, "stop_tokens", ()))
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int) and not isinstance(eos, bool):
        tokens.add(eos)
    return frozenset(t for t in tokens if 0 <= t < executor.vocab_size)


def check_stop_tokens(stop_tokens, vocab_size: int) -> frozenset[int]:
    """The stop tokens as a set of ints in [0, vocab_size), or ConfigError. Any collection
    of ids will do (a list, a tuple, a set, a 1-d array); a str, bytes, a mapping or a bare
    int are refused (None, the model's default, is `default_stop_tokens`)."""
    expected = (
        f"a collection of token ids in [0, {vocab_size}), e.g. [2], () for none or None "
        "for the model's"
    )
    is_text = isinstance(stop_tokens, str | bytes | bytearray)
    if is_text or isinstance(stop_tokens, Mapping) or not isinstance(stop_tokens, Collection):
        hint = "; tokenizer.encode(text) gives a text's ids" if is_text else ""
        raise ConfigError(f"stop_tokens must be {expected}, got {stop_tokens!r}{hint}")
    if isinstance(stop_tokens, np.ndarray) and stop_tokens.ndim != 1:
        shape = stop_tokens.shape
        raise ConfigError(f"stop_tokens is an array of shape {shape}; expected {expected}")
    hint = f"; stop_tokens must be {expected}"
    tokens = frozenset(as_int("a stop token", t, ConfigError, hint) for t in stop_tokens)
    outside = sorted(t for t in tokens if not 0 <= t < vocab_size)
    if outside:
        raise ConfigError(
            f"stop tokens {outside} are outside the vocabulary [0, {vocab_size}): they could "
            f"never be sampled; give stop_tokens as {expected}"
        )
    return tokens


def check_on_token(on_token) -> Callable[[TokenEvent], None] | None:
    """`on_token` when it is None or callable, else ConfigError."""
    if on_token is not None and not callable(on_token):
        raise ConfigError(
            f"on_token must be a callable taking a TokenEvent, or None; got {on_token!r}"
        )
    return on_token


def check_parts(executor, tokenizer, clock) -> None:
    """ConfigError unless `executor` is a `SessionExecutor`, `tokenizer` a `Tokenizer`
    whose tokens the executor takes and `clock` a callable."""
    if not isinstance(executor, SessionExecutor):
        raise ConfigError(f"expected a SessionExecutor (an Executor, a Lockstep), got {executor!r}")
    if not isinstance(tokenizer, Tokenizer):
        raise ConfigError(f"expected a Tokenizer (vocab_size, encode, decode), got {tokenizer!r}")
    if tokenizer.vocab_size > executor.vocab_size:
        raise ConfigError(
            f"the tokenizer's vocab_size={tokenizer.vocab_size} passes the executor's "
            f"vocab_size={executor.vocab_size}"
        )
    if not callable(clock):
        raise ConfigError(f"clock must be a callable returning seconds, got {clock!r}")


def check_prefix_cache(prefix_cache, executor) -> None:
    """ConfigError unless `prefix_cache` is None or a `PrefixCache` over `executor` (the
    sessions it keeps must be the engine's executor's)."""
    if prefix_cache is None:
        return
    if not isinstance(prefix_cache, PrefixCache):
        raise ConfigError(f"prefix_cache must be a PrefixCache or None, got {prefix_cache!r}")
    if prefix_cache.target is not executor:
        raise ConfigError(
            f"the prefix cache is over {prefix_cache.target!r}, not this engine's executor "
            f"{executor!r}: give PrefixCache(executor)"
        )
