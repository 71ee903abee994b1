"""How each entry point of numba's CUDA simulator is counted: the wrappers that
`numbakv.testing.launches.patches` puts in place of the originals, and the counters they
report to.

A call made inside another counted call is not counted again: `device_array_like` is one
allocation, not two; `to_device(x, to=d)` is one copy. The copies a launch makes of NumPy
arguments (the simulator's automatic transfers) are counted as the simulator makes them:
to_device before the kernel runs, copy_to_host after, on stream 0, after the launch in the
log.
"""

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np

from numbakv.testing.launches.records import NO_STREAM, STREAM_KINDS, Call, Launch

ACTIVE: list = []  # the DeviceCalls of the blocks now open, outermost first


class _State(threading.local):
    depth = 0  # counted calls in progress on this thread: inner ones are not counted


_STATE = _State()
_kernel_streams: "weakref.WeakKeyDictionary[object, object]" = weakref.WeakKeyDictionary()


def _emit(call: Call) -> None:
    for counter in ACTIVE:
        counter.calls.append(call)


@contextlib.contextmanager
def _counted(*calls: Call) -> Iterator[None]:
    """Records `calls` after the body succeeds, unless inside another counted call."""
    outermost = _STATE.depth == 0
    _STATE.depth += 1
    try:
        yield
    finally:
        _STATE.depth -= 1
    if outermost:
        for call in calls:
            _emit(call)


def _bound(signature: inspect.Signature, args, kwargs) -> dict:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def allocation(name: str, original: Callable) -> Callable:
    """An allocation entry point: one ("allocations", name) with the stream it was given."""
    signature = inspect.signature(original)
    parameters = signature.parameters
    takes_keywords = any(p.kind is p.VAR_KEYWORD for p in parameters.values())

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if "stream" in parameters:
            stream = _bound(signature, args, kwargs)["stream"]
        elif takes_keywords:  # device_array(*args, **kwargs) pops an optional stream
            stream = kwargs.get("stream", 0)
        else:
            stream = NO_STREAM
        with _counted(Call("allocations", name, stream)):
            return original(*args, **kwargs)

    return wrapper


def to_device(original: Callable) -> Callable:
    """to_device: an allocation and a host->device copy, or with `to=` a copy only."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        arguments = _bound(signature, args, kwargs)
        copy = Call("copies", "to_device", arguments["stream"], "h2d")
        if arguments["to"] is None:
            calls = (Call("allocations", "to_device", arguments["stream"]), copy)
        else:
            calls = (copy,)
        with _counted(*calls):
            return original(*args, **kwargs)

    return wrapper


def synchronization(name: str, original: Callable, takes_stream: bool = False) -> Callable:
    """A synchronization entry point: one ("synchronizations", name), with the stream it
    was given when it takes one."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        stream = _bound(signature, args, kwargs).get("stream", 0) if takes_stream else NO_STREAM
        with _counted(Call("synchronizations", name, stream)):
            return original(*args, **kwargs)

    return wrapper


def default_stream(name: str, stream_class: type) -> Callable:
    """A default-stream function: a stream of `stream_class` registered as the default."""

    def make_default_stream():
        outermost = _STATE.depth == 0
        with _counted():  # the class's __init__ is not counted again
            stream = stream_class()
        STREAM_KINDS[stream] = "default"
        if outermost:
            _emit(Call("streams", name, stream))
        return stream

    make_default_stream.__name__ = make_default_stream.__qualname__ = name
    make_default_stream.__doc__ = f"`cuda.{name}()`, counted (numbakv.testing.launches)."
    return make_default_stream


def made(category: str, name: str, stream_kind: str | None = None) -> Callable:
    """An `__init__` for the simulator's stream or event class (neither defines one); a
    stream (`stream_kind` given) is registered and is the `stream` of its call."""

    def __init__(self):
        if stream_kind is not None:
            STREAM_KINDS.setdefault(self, stream_kind)
        if _STATE.depth == 0:
            _emit(Call(category, name, self if stream_kind is not None else NO_STREAM))

    return __init__


def stream_synchronize(original: Callable) -> Callable:
    """stream.synchronize: a synchronization recorded with the stream itself."""

    @functools.wraps(original)
    def synchronize(self):
        with _counted(Call("synchronizations", "stream.synchronize", self)):
            return original(self)

    return synchronize


def auto_synchronize(original: Callable) -> Callable:
    """stream.auto_synchronize: a synchronization of the stream on leaving the block."""

    @contextlib.contextmanager
    @functools.wraps(original)
    def wrapper(self):
        with original(self) as value:
            yield value
        with _counted(Call("synchronizations", "stream.auto_synchronize", self)):
            pass

    return wrapper


def event_record(original: Callable) -> Callable:
    """event.record: an ("events", "event.record") with the stream it was given."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def record(*args, **kwargs):
        stream = _bound(signature, args, kwargs).get("stream", 0)
        with _counted(Call("events", "event.record", stream)):
            return original(*args, **kwargs)

    return record


def array_methods(array_class: type, kernel_module: ModuleType) -> dict[str, Callable]:
    """copy_to_device, copy_to_host, __getitem__ and __setitem__ of the simulator's array;
    one element read or written from the host is a copy, indexing inside a kernel is not."""
    to_device = array_class.__dict__["copy_to_device"]
    to_host = array_class.__dict__["copy_to_host"]
    get, put = array_class.__dict__["__getitem__"], array_class.__dict__["__setitem__"]
    to_device_signature = inspect.signature(to_device)
    to_host_signature = inspect.signature(to_host)

    def on_host() -> bool:
        return kernel_module._kernel_context is None and _STATE.depth == 0

    @functools.wraps(to_device)
    def copy_to_device(self, *args, **kwargs):
        arguments = _bound(to_device_signature, (self, *args), kwargs)
        direction = "d2d" if isinstance(arguments["ary"], array_class) else "h2d"
        with _counted(Call("copies", "copy_to_device", arguments["stream"], direction)):
            return to_device(self, *args, **kwargs)

    @functools.wraps(to_host)
    def copy_to_host(self, *args, **kwargs):
        stream = _bound(to_host_signature, (self, *args), kwargs)["stream"]
        with _counted(Call("copies", "copy_to_host", stream, "d2h")):
            return to_host(self, *args, **kwargs)

    @functools.wraps(get)
    def __getitem__(self, idx):
        value = get(self, idx)
        if on_host() and not isinstance(value, array_class):  # an element, not a view
            _emit(Call("copies", "getitem", 0, "d2h"))
        return value

    @functools.wraps(put)
    def __setitem__(self, idx, value):
        put(self, idx, value)
        if on_host():
            direction = "d2d" if isinstance(value, array_class) else "h2d"
            _emit(Call("copies", "setitem", 0, direction))

    return {
        "copy_to_device": copy_to_device,
        "copy_to_host": copy_to_host,
        "__getitem__": __getitem__,
        "__setitem__": __setitem__,
    }


def kernel_methods(
    kernel_class: type, kernel_module: ModuleType, array_class: type
) -> dict[str, Callable]:
    """__getitem__ (remembers the stream slot, which the simulator drops) and __call__
    (counts a launch from the host) of the simulator's kernel."""
    configure = kernel_class.__dict__["__getitem__"]
    call = kernel_class.__dict__["__call__"]

    @functools.wraps(configure)
    def __getitem__(self, configuration):
        result = configure(self, configuration)
        _kernel_streams[self] = configuration[2] if len(configuration) >= 3 else 0
        return result

    @functools.wraps(call)
    def __call__(self, *args):
        if not (self._device or kernel_module._kernel_context):
            launch = Launch(
                name=getattr(self, "__name__", type(self).__name__),
                grid=tuple(self.grid_dim) if self.grid_dim is not None else None,
                block=tuple(self.block_dim) if self.block_dim is not None else None,
                stream=_kernel_streams.get(self, 0),
                args=tuple(_describe(args, (), array_class)),
            )
            _emit(Call("launches", launch.name, launch.stream, launch))
        return call(self, *args)

    return {"__getitem__": __getitem__, "__call__": __call__}


def _describe(values, path: tuple, array_class: type) -> Iterator[tuple]:
    """The entries of Launch.args for `values` (nested tuples flattened)."""
    for i, value in enumerate(values):
        where = (*path, i)
        if isinstance(value, array_class):
            ary = value._ary
            address = ary.__array_interface__["data"][0]
            yield ("array", where, address, ary.shape, ary.strides, ary.dtype.str)
        elif isinstance(value, np.ndarray) and value.ndim > 0:
            yield ("host", where, value.shape, value.dtype.str)
        elif isinstance(value, tuple):
            yield from _describe(value, where, array_class)
        else:
            scalar = value.item() if isinstance(value, np.generic) else value
            yield ("scalar", where, type(value).__name__, scalar)
