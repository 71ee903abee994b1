"""The observer hook both cache implementations call after every verb and step."""

from collections.abc import Callable
from typing import Any

# observer(cache, event, step): event is the verb's name; step is the new Step after
# "prepare_step" and None otherwise
Observer = Callable[[Any, str, Any], None]

EVENTS = ("seq_new", "seq_clone", "seq_rm", "rewind", "clear", "declare_step", "prepare_step")


class Observable:
    """Keeps observers and tells them, in order, about each verb that succeeded."""

    def __init__(self) -> None:
        self._observers: list[Observer] = []

    def add_observer(self, observer: Observer) -> None:
        """Calls `observer(cache, event, step)` after every successful verb from now on."""
        self._observers.append(observer)

    def remove_observer(self, observer: Observer) -> None:
        self._observers.remove(observer)

    def _notify(self, event: str, step=None) -> None:
        for observer in self._observers:
            observer(self, event, step)
