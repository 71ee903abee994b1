"""Faults of the serving stack that are not refusals: an `ObserverError` (a cache verb
completed, then one of the cache's observers raised) met by the executor or the engine,
and what went wrong in one engine step.

An `ObserverError` means the verb is done: its change stands and `.result` holds what it
returned. The executor and the engine therefore take the result from the error, finish
their own bookkeeping (and the rest of the call), and only then raise it, so their state
always matches the cache's.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from numbakv.errors import ObserverError


def completed(observed: list[ObserverError], call: Callable, *args):
    """`call(*args)`; when it raises an ObserverError (the verb completed), the error goes
    to `observed` and its `.result` is returned instead, so the caller carries on."""
    try:
        return call(*args)
    except ObserverError as error:
        observed.append(error)
        return error.result


def raise_observed(observed: list[ObserverError]) -> None:
    """Raises the first of `observed` (noting how many more there were); nothing if none."""
    if not observed:
        return
    first, *others = observed
    if others:
        first.add_note(f"numbakv: observers raised after {len(others)} more verbs of this call")
    raise first


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
