"""The step's stream: what `prepare_step(stream=...)` takes, as a numba stream.

A stream is a numba stream; an object with `__cuda_stream__` (the CUDA stream protocol of
cuda.core and recent PyTorch: a method returning (version, handle)), `.cuda_stream` (a
`torch.cuda.Stream`) or `.ptr` (a `cupy.cuda.Stream`); or a raw handle (an int; 0 is the
legacy default stream). On a GPU a foreign handle is wrapped with
`cuda.external_stream` (once per handle); the CUDA simulator cannot wrap one, and runs every
launch to completion in issue order, so there a foreign stream maps to a simulator stream of
its own, which orders the work the same way.
"""

import operator

from numbakv.cache.cuda import IS_SIMULATOR, STREAM_TYPE, cuda, ordering_event
from numbakv.core.errors import StepError
from numbakv.core.values import short_repr


class Streams:
    """The streams a cache has run on: its own (the default), and the foreign ones wrapped.

    `use(stream)` returns the numba stream for `stream` and, when it differs from the one
    in use, makes it wait for the work already queued there (one event, recorded and
    waited on, never a host synchronization), so the cache's work stays in issue order.
    """

    def __init__(self):
        self.own = cuda.stream()
        self.current = self.own
        self._wrapped: dict[int, object] = {}
        self._handoff = ordering_event()

    def use(self, stream):
        """The numba stream of `stream` (None: the cache's own), now the one in use."""
        resolved = self.own if stream is None else self._resolve(stream)
        if resolved is not self.current:
            self._handoff.record(self.current)
            self._handoff.wait(resolved)
            self.current = resolved
        return resolved

    def _resolve(self, stream):
        if isinstance(stream, STREAM_TYPE):
            return stream
        handle = _handle(stream)
        if handle not in self._wrapped:
            if IS_SIMULATOR:
                self._wrapped[handle] = cuda.stream()
            elif handle == 0:  # exports stream 1 in __cuda_array_interface__ (0 is not allowed)
                self._wrapped[handle] = cuda.legacy_default_stream()
            else:
                self._wrapped[handle] = cuda.external_stream(handle)
        return self._wrapped[handle]


def _handle(stream) -> int:
    """The raw handle of a foreign stream, or StepError naming what was given."""
    try:
        if hasattr(stream, "__cuda_stream__"):
            protocol = stream.__cuda_stream__
            _, handle = protocol() if callable(protocol) else protocol
        elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream before __cuda_stream__
            handle = stream.cuda_stream
        elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
            handle = stream.ptr
        elif isinstance(stream, bool):
            raise TypeError("a bool is not a stream handle")
        else:
            handle = stream
        handle = operator.index(handle)
    except Exception as error:
        raise StepError(
            f"stream={short_repr(stream)} is not a stream: give a numba stream, an object with "
            f"__cuda_stream__ (torch.cuda.Stream, cupy.cuda.Stream) or a raw handle ({error!r})"
        ) from error
    if handle < 0:
        raise StepError(f"stream handle {handle} is negative")
    return handle
