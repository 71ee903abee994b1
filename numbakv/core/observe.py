"""The observer hook both cache implementations call after every verb and step, and the
one reentrant lock every public method of a cache holds."""

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from numbakv.core.errors import ConfigError, ObserverError
from numbakv.core.values import short_repr

# observer(cache, event, step): event is the verb's name; step is the new Step after
# "prepare_step" and None otherwise
Observer = Callable[[Any, str, Any], None]

EVENTS = (
    "seq_new", "seq_clone", "seq_rm", "rewind", "clear", "declare_step", "prepare_step",
    "seq_load",
)  # fmt: skip

Method = TypeVar("Method", bound=Callable[..., Any])


def locked(method: Method) -> Method:
    """Runs `method` holding its object's reentrant lock (`self._lock`), so that threads
    sharing a cache take turns, verb by verb; an observer may call back into the cache."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


class Observable:
    """Keeps observers and tells them, in order, about each verb that succeeded."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._observers: list[Observer] = []
        self._touched = _NONE

    @property
    def lock(self) -> threading.RLock:
        """The cache's reentrant lock. Each call holds it; hold it yourself across a step
        (declare_step, prepare_step, write, attend) that threads must not interleave."""
        return self._lock

    @locked
    def add_observer(self, observer: Observer) -> None:
        """Calls `observer(cache, event, step)` after every successful verb from now on."""
        if not callable(observer):
            raise ConfigError(f"an observer is a callable (cache, event, step), got {observer!r}")
        self._observers.append(observer)

    @locked
    def remove_observer(self, observer: Observer) -> None:
        if observer not in self._observers:
            raise ConfigError(f"observer {observer!r} is not registered; add_observer() it first")
        self._observers.remove(observer)

    def touched_cells(self) -> np.ndarray:
        """[n] int32: the cells whose position or owners the verb the observers are hearing
        of may have changed, as the cell table says (repeats allowed; no other cell changed).
        Valid during an observer's call; empty otherwise. A `Recorder` reads only these."""
        return self._touched

    def _notify(self, event: str, step=None, result=None):
        """Tells every observer; returns `result`. Called last, once the verb is complete:
        when observers raise, all still run, then ObserverError(from the first) is raised.
        The cells the table says the verb touched (`self._table.take_touched()`) are
        `touched_cells()` meanwhile."""
        failed, outer = [], self._touched  # an observer's own verb nests a notification
        self._touched = self._table.take_touched()
        try:
            for observer in list(self._observers):
                try:
                    observer(self, event, step)
                except Exception as error:
                    failed.append((observer, error))
        finally:
            self._touched = outer
        if failed:
            observer, error = failed[0]
            raise ObserverError(
                f"observer {observer!r} raised {error!r} after {event}(), which completed "
                f"({len(failed)} of {len(self._observers)} observers raised); the change "
                "stands: fix the observer or remove_observer() it",
                event,
                step if result is None else result,
            ) from error
        return result


_NONE = np.zeros(0, dtype=np.int32)
_NONE.flags.writeable = False


def check_cells(cells, capacity: int) -> np.ndarray:
    """`cells` as [n] int64; ConfigError naming the first that is no cell of [0, capacity)."""
    array = np.asarray(cells)
    if array.ndim != 1 or (array.dtype.kind not in "iu" and array.size):
        raise ConfigError(f"cells are a 1-d array of ints; got {short_repr(cells)}")
    if (bad := np.flatnonzero((array < 0) | (array >= capacity))).size:
        raise ConfigError(f"cell {array[bad[0]]} is outside [0, capacity={capacity})")
    return array.astype(np.int64)
