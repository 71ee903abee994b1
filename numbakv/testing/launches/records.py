"""What `count_device_calls` records: one Call per counted call of numba.cuda (a Launch for
a kernel launch), and DeviceCalls, the log in call order with views by category.

The categories and their entry points:

    launches         a kernel launch from the host, by the kernel's name (device-function
                     calls and calls inside a running kernel are not launches)
    copies           to_device, copy_to_device (host->device, or device->device from a
                     device array), copy_to_host, and from the host one element of a device
                     array read (getitem, device->host) or written (setitem)
    allocations      device_array, device_array_like, mapped_array, pinned_array,
                     pinned_array_like, pinned, managed_array, and to_device without `to=`
    synchronizations synchronize, stream.synchronize, stream.auto_synchronize (on leaving
                     it), event.synchronize, event.wait (on a GPU it makes a stream wait,
                     not the host; counted here all the same, under its own name)
    streams          stream, default_stream, legacy_default_stream, per_thread_default_stream
    events           event, event.record

Each launch, copy and allocation records the stream it was given (0 when none), so that a
test can ask whether anything went to the legacy default stream (`is_default_stream`).
"""

import weakref
from collections import Counter
from dataclasses import dataclass

import numpy as np

CATEGORIES = ("launches", "copies", "allocations", "synchronizations", "streams", "events")


class _NoStream:
    """The `stream` of a call that takes none (cuda.synchronize, stream.synchronize)."""

    def __repr__(self) -> str:
        return "NO_STREAM"


NO_STREAM = _NoStream()


@dataclass(frozen=True)
class Launch:
    """One kernel launch.

    name   : the kernel's name (its Python function's `__name__`)
    grid   : (x, y, z) blocks; block: (x, y, z) threads per block
    stream : the stream slot of `kernel[grid, block, stream]`, 0 when not given
    args   : one entry per argument, tuples flattened (path = indices into the argument
             list and into nested tuples):
               ("array", path, address, shape, strides, dtype)  a device array
               ("host", path, shape, dtype)                      a NumPy array
               ("scalar", path, type name, value)                anything else
    """

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    stream: object
    args: tuple

    @property
    def arrays(self) -> tuple:
        """(path, address, shape, strides, dtype) of each device-array argument."""
        return tuple(arg[1:] for arg in self.args if arg[0] == "array")

    @property
    def replay_key(self) -> tuple:
        """What a replay of this launch must find unchanged: the kernel, its grid and block,
        and where each device-array argument lives (scalars and the stream left out)."""
        return (self.name, self.grid, self.block, self.arrays)


@dataclass(frozen=True)
class Call:
    """One counted call.

    category : one of CATEGORIES
    name     : the entry point (see the module docstring)
    stream   : the stream it was given (0 when it takes one and got none), the stream made
               (streams), NO_STREAM when the entry point takes none
    detail   : a Launch for launches; "h2d", "d2h" or "d2d" for copies; else None
    """

    category: str
    name: str
    stream: object = NO_STREAM
    detail: object = None


# stream -> how it was made ("stream" or "default"), kept after the counter that saw it
STREAM_KINDS: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()


def is_default_stream(stream: object) -> bool:
    """True for the legacy default stream: 0, None, or a stream that `cuda.default_stream()`
    (or its legacy / per-thread twins) made while a counter was active. The simulator's
    default streams are of the same class as `cuda.stream()`'s, so one made while no counter
    was active cannot be told from another stream: make the streams under a counter."""
    if stream is None:
        return True
    if isinstance(stream, int | np.integer):
        return int(stream) == 0
    try:
        return STREAM_KINDS.get(stream) == "default"
    except TypeError:  # not weakly referenceable: not a stream the simulator makes
        return False


def stream_kind(stream: object) -> str:
    """How `stream` was made: "default" (see is_default_stream), "stream" (by `cuda.stream()`
    while a counter was active), "unknown" (while none was), or "none" (NO_STREAM)."""
    if stream is NO_STREAM:
        return "none"
    if is_default_stream(stream):
        return "default"
    try:
        return STREAM_KINDS.get(stream, "unknown")
    except TypeError:
        return "unknown"


class DeviceCalls:
    """What `count_device_calls` saw, in call order (`calls`); views by category below."""

    def __init__(self, calls: list[Call] | None = None) -> None:
        self.calls: list[Call] = [] if calls is None else calls

    def __len__(self) -> int:
        return len(self.calls)

    def __getitem__(self, category: str) -> int:
        if category not in CATEGORIES:
            raise KeyError(f"{category!r} is not one of {CATEGORIES}")
        return sum(1 for call in self.calls if call.category == category)

    @property
    def counts(self) -> dict[str, int]:
        """{category: calls} for every category of CATEGORIES (0 when none)."""
        seen = Counter(call.category for call in self.calls)
        return {category: seen[category] for category in CATEGORIES}

    @property
    def log(self) -> list[tuple[str, str]]:
        """(category, name) of every call, in order."""
        return [(call.category, call.name) for call in self.calls]

    @property
    def launches(self) -> list[Launch]:
        """The Launch of every kernel launch, in order."""
        return [call.detail for call in self.calls if call.category == "launches"]

    def of(self, *categories: str) -> list[Call]:
        """The calls of `categories`, in order."""
        return [call for call in self.calls if call.category in categories]

    def streams(self, categories: tuple[str, ...] = ("launches", "copies")) -> list:
        """The distinct streams the calls of `categories` used (by identity; 0 and None as
        values), in order of first use."""
        found: list = []
        for call in self.of(*categories):
            if call.stream is not NO_STREAM and not any(_same(call.stream, s) for s in found):
                found.append(call.stream)
        return found

    def on_default_stream(self, categories: tuple[str, ...] = ("launches", "copies")) -> list[Call]:
        """The calls of `categories` that went to the legacy default stream."""
        return [call for call in self.of(*categories) if is_default_stream(call.stream)]

    def label(self, stream: object) -> str:
        """A short name for `stream`: "default", "-" for NO_STREAM, else "s1", "s2", ... in
        order of first use in these calls ("s?" for one they never used)."""
        if stream is NO_STREAM:
            return "-"
        if is_default_stream(stream):
            return "default"
        others = [s for s in self.streams(CATEGORIES) if not is_default_stream(s)]
        for i, s in enumerate(others, 1):
            if _same(s, stream):
                return f"s{i}"
        return "s?"

    def mark(self) -> int:
        """A position in the log, for `since`."""
        return len(self.calls)

    def since(self, start: int, stop: int | None = None) -> "DeviceCalls":
        """The calls between two marks (`stop` default: now), as a DeviceCalls."""
        return DeviceCalls(self.calls[start:stop])

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts.items() if v)
        return f"DeviceCalls({counts or 'nothing'})"


def _same(a, b) -> bool:
    """One stream: equal values for 0 and None, the same object otherwise."""
    if isinstance(a, int | type(None)) or isinstance(b, int | type(None)):
        return type(a) is type(b) and a == b
    return a is b
