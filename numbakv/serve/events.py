"""What the `Engine` tells code outside it as it runs: each sampled token to its request's
`on_token` callback (`call_back`), and its own events to an `annotate(kind, **data)` hook
(`Notes`), such as `numbakv.Recorder.annotate` or a callable of yours.

The annotations, each made when its event has happened:

    kind     data                            when
    admit    request, seqs                   a request got its first session (sample 0's),
                                             before its prompt's first chunk runs
    fork     request, seqs, source           its prompt's last chunk cloned `source` into
                                             the sessions of samples 1 .. n-1
    finish   request, sample, seq, reason    a sample's session closed; reason "stop",
                                             "length", "cancelled" or "error"
    cancel   request                         a request was cancelled (waiting or running);
                                             its running samples' finishes follow
    error    request                         a request ended by a fault (the executor
                                             failed on its batch, or its on_token raised)
    growth   rows_before, rows, growths      the cache's pool grew `growths` times in one
                                             engine step, made after its forwards (the
                                             executor's `cache`, when it has `rows` and
                                             `growth_count`; a trace's rows show at which
                                             forward)

`seq` and `seqs` are session ids, which an `Executor` (and a `Lockstep`) makes the cache's
sequence ids, so `admit` and `fork` bind every sequence a request's cells live under to
the request. With a prefix cache, and when memory is short (docs/contract.md §9.2):

    hit      request, seq, tokens            the session started as a clone sharing its
                                             first `tokens` positions
    insert   request, seq, tokens, held      a session's first `tokens` positions became
                                             hits: its prompt while it runs (held False),
                                             or all of it when it ended (held True: the
                                             prefix cache holds the sequence now)
    evict    cells, cached_cells             the prefix cache gave back `cells` cells
    offload  tokens, bytes, host_bytes       before giving cells back, its host tier kept
                                             states of `tokens` positions (`bytes` of K/V;
                                             it holds `host_bytes` now); comes before
                                             their `evict`
    reload   request, seq, tokens            the session's hit loaded `tokens` positions
                                             from host memory; its `hit` follows (all the
                                             positions it shares)
    preempt  request, seqs                   its sessions ended (their inserts came first)
    resume   request, seqs                   it got sessions again, before new admissions

A hook that raises is treated like an observer of the cache that raises: the
event stands, the engine finishes its call, then an `ObserverError` (the hook's exception
as its cause) propagates (`faults.Observed.annotate_hook`).
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from numbakv.core.errors import ConfigError, StepError
from numbakv.serve.requests import FinishReason, Request, TokenEvent

Annotate = Callable[..., None]  # annotate(kind: str, **data) -> None


def check_annotate(annotate) -> Annotate | None:
    """`annotate` when it is None or a callable `annotate(kind, **data)`, else ConfigError."""
    if annotate is not None and not callable(annotate):
        raise ConfigError(
            f"annotate must be a callable annotate(kind, **data), e.g. a Recorder's "
            f"annotate, or None; got {annotate!r}"
        )
    return annotate


class Notes:
    """The engine's annotate hook: `notes(kind, **data)` tells it of an event.

    annotate : None (nothing is told), or a callable `annotate(kind, **data)`
    """

    def __init__(self, annotate: Annotate | None):
        self.annotate = annotate

    def __call__(self, kind: str, **data) -> None:
        if self.annotate is not None:
            self.annotate(kind, **data)

    @contextmanager
    def growth(self, executor: object) -> Iterator[None]:
        """Around an `execute`: a `growth` annotation when `executor`'s pool grew in it (also
        when it failed: a batch may grow the pool before it fails)."""
        before = pool_size(executor)
        try:
            yield
        finally:
            after = pool_size(executor)
            if before is not None and after is not None and after[1] > before[1]:
                growths = after[1] - before[1]
                self("growth", rows_before=before[0], rows=after[0], growths=growths)


def pool_size(executor: object) -> tuple[int, int] | None:
    """(rows, growth_count) of `executor.cache`, or None when it has no cache counting them."""
    cache = getattr(executor, "cache", None)
    rows, growths = getattr(cache, "rows", None), getattr(cache, "growth_count", None)
    return (rows, growths) if isinstance(rows, int) and isinstance(growths, int) else None


def call_back(
    events: list[TokenEvent],
    requests: dict[int, Request],
    stop: Callable[[Request, FinishReason], None],
) -> dict[int, BaseException]:
    """Hands each event to its request's `on_token`, in order; a callback that raises ends
    its request (`stop(request, "error")`, unless it had finished) and hears nothing more.
    Returns {request id: what its callback raised}, in the order they raised."""
    raised: dict[int, BaseException] = {}
    for event in events:
        r = requests[event.request_id]
        if r.on_token is None or r.id in raised:
            continue
        try:
            r.on_token(event)
        except BaseException as error:
            raised[r.id] = error
            if not r.is_finished:
                stop(r, "error")
    return raised


def check_not_in_callbacks(in_callbacks: bool, what: str) -> None:
    """StepError when `what` (a method name) is called while callbacks run, inside a step."""
    if in_callbacks:
        raise StepError(
            f"{what}() was called from an on_token callback, inside a step; callbacks "
            "may submit() and cancel(); step from the loop that called step()"
        )
