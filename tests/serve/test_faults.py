"""`numbakv.serve.faults`, the one place the serving stack meets an `ObserverError`: through
an `Observed` log a call that raised one gives its verb's result, each public call keeps
its own errors and raises the first once it is done, and a failure carries them as a note."""

import threading

import pytest

from numbakv.core.errors import ObserverError
from numbakv.core.observe import locked
from numbakv.serve.faults import Observed, completes


class Verbs:
    """A target whose verbs complete, then raise an ObserverError when told to."""

    size = 3

    def __init__(self):
        self.done = []
        self.raising = False

    def verb(self, value, scale=1):
        self.done.append(value)
        if self.raising:
            raise ObserverError(f"after verb({value})", "verb", value * scale)
        return value * scale

    def refuse(self):
        raise ValueError("refused")


class Caller:
    """An object with public calls over `Verbs`, as the executor has over its cache."""

    def __init__(self):
        self._lock = threading.RLock()
        self._observed = Observed()
        self.verbs = Verbs()
        self._verbs = self._observed.around(self.verbs)

    @locked
    @completes
    def twice(self, value):
        return [self._verbs.verb(value), self._verbs.verb(value + 1, scale=10)]

    @locked
    @completes(raising=lambda errors, result: ObserverError("whole", "twice", result))
    def whole(self, value):
        return self._verbs.verb(value)

    @locked
    @completes
    def inner_then_outer(self):
        with pytest.raises(ObserverError):
            self.twice(5)  # a public call inside keeps its own errors
        return self._verbs.verb(7)

    @locked
    @completes
    def fails(self):
        self._verbs.verb(1)
        self._verbs.refuse()


def test_a_call_that_raised_an_observer_error_gives_the_verbs_result():
    caller = Caller()
    assert caller.twice(2) == [2, 30] and caller._verbs.size == 3
    caller.verbs.raising = True
    with pytest.raises(ObserverError) as raised:
        caller.twice(2)
    assert caller.verbs.done == [2, 3, 2, 3]  # the call went on past the first error
    assert str(raised.value) == "after verb(2)" and raised.value.result == 2
    assert "observers raised after 1 more verbs of this call" in "".join(raised.value.__notes__)
    with pytest.raises(ObserverError, match="whole") as raised:
        caller.whole(4)
    assert raised.value.result == 4
    assert caller._observed.errors == []  # nothing is left over for the next call


def test_a_public_call_inside_another_keeps_its_own_errors():
    caller = Caller()
    caller.verbs.raising = True
    with pytest.raises(ObserverError) as raised:
        caller.inner_then_outer()
    assert str(raised.value) == "after verb(7)" and not getattr(raised.value, "__notes__", [])


def test_a_failure_carries_the_observer_errors_of_its_call():
    caller = Caller()
    caller.verbs.raising = True
    with pytest.raises(ValueError, match="refused") as raised:
        caller.fails()
    assert "observers of the cache raised too" in "".join(raised.value.__notes__)
    assert caller._observed.errors == []
    error = ValueError("cleaning up")
    with caller._observed.noted_on(error):
        caller._verbs.verb(1)
    assert "after verb(1)" in "".join(error.__notes__)


def test_an_annotate_hook_that_raises_is_recorded_as_an_observer_error():
    observed = Observed()
    assert observed.annotate_hook(None) is None

    def hook(kind, **data):
        raise RuntimeError(f"{kind} {data}")

    with observed.call() as errors:
        observed.annotate_hook(hook)("admit", request=0)
    [error] = errors
    assert isinstance(error, ObserverError) and error.event == "admit"
    assert isinstance(error.__cause__, RuntimeError) and "annotate hook" in str(error)
