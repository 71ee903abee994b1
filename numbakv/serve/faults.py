"""The one place where the serving stack meets an `ObserverError`, and what went wrong in
one engine step.

An `ObserverError` means a verb completed, then an observer of the cache raised: the change
stands and `.result` holds what the verb returned. The executor, the lockstep and the
engine reach everything that may raise one (a cache, an executor, the annotate hook)
through their `Observed` log: `Observed.around(target)` gives `target` with calls that
return the verb's result and record the error. Each public call runs as one
`Observed.call` (the `completes` decorator) and raises what was recorded once the whole
call is done, so their state always matches the cache's (docs/contract.md §9.1).
"""

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from numbakv.core.errors import ObserverError

Method = TypeVar("Method", bound=Callable[..., Any])
Raising = Callable[[list[ObserverError], Any], ObserverError]


class Observed:
    """The ObserverErrors of the public call in progress on one object. That object holds
    its lock for each call, so one thread at a time records here."""

    def __init__(self) -> None:
        self.errors: list[ObserverError] = []

    def record(self, error: ObserverError) -> None:
        """Keeps `error` (its verb completed) for the call in progress."""
        self.errors.append(error)

    def around(self, target: Any) -> "Completing":
        """`target` whose calls never raise an ObserverError: they record it here."""
        return Completing(target, self)

    def annotate_hook(self, annotate: Callable[..., None] | None) -> Callable[..., None] | None:
        """`annotate` (None, or a hook `annotate(kind, **data)`) as a hook that never raises
        an `Exception`: one it raises is recorded as an ObserverError of the event `kind`,
        with the hook's exception as its cause (the event stands)."""
        if annotate is None:
            return None

        def hook(kind: str, **data) -> None:
            try:
                annotate(kind, **data)
            except Exception as error:
                failure = ObserverError(
                    f"the annotate hook {annotate!r} raised {error!r} on a {kind!r} "
                    "annotation; the engine's event stands: fix the hook or give the engine "
                    "annotate=None",
                    kind,
                )
                failure.__cause__ = error
                self.record(failure)

        return hook

    @contextmanager
    def call(self) -> Iterator[list[ObserverError]]:
        """One public call: yields the list its ObserverErrors go to, its own (a public call
        made inside it, such as a callback's `cancel` inside a step, keeps its own). An
        exception that ends the call propagates noted with them."""
        outer, self.errors = self.errors, []
        try:
            yield self.errors
        except BaseException as error:
            note_observed(error, self.errors)
            raise
        finally:
            self.errors = outer

    @contextmanager
    def noted_on(self, error: BaseException) -> Iterator[None]:
        """A clean-up call made while `error` propagates: its ObserverErrors are noted on
        `error` instead of raised."""
        with self.call() as errors:
            yield
        note_observed(error, errors)


class Completing:
    """`target` seen through an `Observed` log: a call that raises an ObserverError records
    it and returns the verb's result (`.result`) instead; every other exception propagates
    and every attribute that is not callable reads through."""

    def __init__(self, target: Any, observed: Observed) -> None:
        self._target = target
        self._observed = observed

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value

        @functools.wraps(value)
        def completed(*args, **kwargs):
            try:
                return value(*args, **kwargs)
            except ObserverError as error:
                self._observed.record(error)
                return error.result

        return completed


def completes(
    method: Method | None = None, *, raising: Raising | None = None
) -> Callable[..., Any]:
    """Decorates a public method of an object whose `_observed` is its `Observed` (inside
    `locked`): the method runs as one `Observed.call`; when it returns after observers
    raised, it raises `raising(errors, its result)` (default `first_observed`).

        @locked
        @completes
        def close_session(self, session): ...
    """

    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            with self._observed.call() as observed:
                result = method(self, *args, **kwargs)
            if observed:
                raise (raising or first_observed)(observed, result)
            return result

        return run  # type: ignore[return-value]

    return decorate if method is None else decorate(method)


def first_observed(observed: list[ObserverError], result: Any) -> ObserverError:
    """The first of `observed` (its `.result` is its verb's), noting how many more there
    were; `result`, the call's, is not used."""
    first, *others = observed
    if others:
        first.add_note(f"numbakv: observers raised after {len(others)} more verbs of this call")
    return first


def batch_observed(observed: list[ObserverError], outputs: list) -> ObserverError:
    """The error `Executor.execute` raises when observers raised during a batch that ran to
    its end: the first one's event and cause, with the batch's `outputs` as `.result`."""
    first, *others = observed
    error = ObserverError(
        f"execute() completed, its outputs are this error's .result; but {first}",
        first.event,
        outputs,
    )
    error.__cause__ = first.__cause__
    if others:
        events = [e.event for e in others]
        error.add_note(f"numbakv: observers raised after more verbs of the batch too: {events}")
    return error


def call_observed(observed: list[ObserverError], result: Any) -> ObserverError:
    """The error a call that runs several verbs raises when observers raised: the first
    one's event and cause, with the call's own `result` as `.result` (not the verb's)."""
    first, *others = observed
    error = ObserverError(f"the call completed, its result is this error's .result; but {first}",
                          first.event, result)  # fmt: skip
    error.__cause__ = first.__cause__
    if others:
        error.add_note(f"numbakv: observers raised after {len(others)} more verbs of this call")
    return error


def note_observed(error: BaseException, observed: list[ObserverError]) -> None:
    """Notes on `error` (about to propagate) the observer errors of the call it ends."""
    if observed:
        error.add_note(f"numbakv: observers of the cache raised too: {observed!r}")


@dataclass
class StepFaults:
    """What went wrong in one engine step, once all its bookkeeping was done.

    raised   : {request id: what its on_token raised}, in the order they raised
    observed : the ObserverErrors of the step's executor calls (the calls completed)
    """

    raised: dict[int, BaseException] = field(default_factory=dict)
    observed: list[ObserverError] = field(default_factory=list)

    def error(self, n_step: int) -> BaseException | None:
        """The exception the step raises (the first callback's, else the first observer's),
        noted with who raised it and what else went wrong; None when nothing did."""
        if self.raised:
            (first, error), *others = self.raised.items()
            note = (
                f"numbakv: on_token of request {first} raised this in engine step {n_step}; "
                "its running samples ended with finish reason 'error', the step's other "
                "requests got their tokens; step() again to go on"
            )
            if others:
                note += f"; on_token of requests {[i for i, _ in others]} raised too: "
                note += ", ".join(repr(e) for _, e in others)
        elif self.observed:
            error, *others = self.observed
            note = (
                f"numbakv: an observer of the executor's cache raised this in engine step "
                f"{n_step}, after the verb completed; the step's bookkeeping is done and no "
                "request lost a token; step() again to go on"
            )
            if others:
                note += f"; observers raised after {len(others)} more verbs of the step"
        else:
            return None
        if self.raised and self.observed:
            note += f"; observers of the executor's cache raised too: {self.observed!r}"
        error.add_note(note)
        return error

    def stops(self, requests: set[int]) -> bool:
        """True when a caller owning `requests` must stop at once: one of its callbacks
        raised, or a callback raised what is not an `Exception` (KeyboardInterrupt)."""
        return any(r in requests or not isinstance(e, Exception) for r, e in self.raised.items())
