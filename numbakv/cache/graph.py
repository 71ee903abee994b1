"""Captured steps: `CellCache.capture(fn)` keeps the launches of one step's per-layer work,
`StepGraph.replay()` runs them again for whatever step of that width is prepared now.

Why the same launches do the next step's work: every value that changes per step lives in
a fixed device buffer (the step buffer, the masks, the table mirror, seq_cells, and the
caller's own input and output arrays), and every kernel reads it from there. What breaks a
capture is storage that moved (the pool grew: `BindingError`, recapture) or a step of
another width (its grids: `StepError`).

Two ways to keep the launches, both behind the one launcher (`kernels.launch.recording`):
on the CUDA simulator, and with `capture(fn, backend="record")`, the launches run eagerly and
are kept with their arguments (`Recorded`), and replay re-issues them on the step's stream.
On a GPU the step's stream is captured into a CUDA graph with cuda.core's `GraphBuilder`
(the path numba-cuda >= 0.29 supports for its launches; thread-local mode, so an
allocation or a synchronous copy inside `fn` fails the capture instead of escaping it),
which is then launched once so that the captured step's outputs exist as after an eager run.
"""

import functools
from collections.abc import Callable
from threading import RLock

from numbakv.cache.bindings import Bindings, check_bindings
from numbakv.cache.cuda import IS_SIMULATOR, begin_graph, launch_graph, stream_handle
from numbakv.cache.kernels.launch import is_recording, launch, recording
from numbakv.cache.step import Progress
from numbakv.core.errors import StepError
from numbakv.core.observe import locked

BACKENDS = ("auto", "record", "graph")


def not_while_capturing(method: Callable) -> Callable:
    """Refuses `method` (a verb, a step call, a host copy, an allocation: a method or a
    function) inside any capture in this thread, before it acts: in a CUDA graph its device
    work would be captured, not run, while the host table changed."""

    @functools.wraps(method)
    def refusing(*args, **kwargs):
        if is_recording():
            raise StepError(
                f"{method.__name__.lstrip('_')}() inside capture(fn): fn may only write, attend "
                "and launch kernels; do the rest before or after the capture"
            )
        return method(*args, **kwargs)

    return refusing


class Recorded:
    """Launches run as they come and kept: (kernel, grid, threads, args) in order."""

    kind = "recorded launches"
    runs_eagerly = True  # what the launches did is done, captured or not

    def __init__(self):
        self.launches: list[tuple] = []

    def abandon(self) -> None:
        """Nothing to undo: the launches ran."""

    def launch(self, kernel, grid, threads, stream, args: tuple) -> None:
        kernel[grid, threads, stream](*args)
        self.launches.append((kernel, grid, threads, args))

    def finish(self, stream) -> None:
        """Nothing to build: the launches already ran."""

    def replay(self, stream) -> None:
        for kernel, grid, threads, args in self.launches:
            launch(kernel, grid, threads, stream, *args)


class CudaGraph:
    """Launches captured into a CUDA graph on the step's stream (run by `finish`)."""

    kind = "CUDA graph"
    runs_eagerly = False  # nothing ran until `finish` launches the graph

    def __init__(self, stream):
        self.launches: list[tuple] = []
        self._builder = begin_graph(stream)
        self._graph = None

    def launch(self, kernel, grid, threads, stream, args: tuple) -> None:
        kernel[grid, threads, self._builder](*args)
        self.launches.append((kernel, grid, threads, args))

    def finish(self, stream) -> None:
        self._graph = self._builder.end_building().complete()
        launch_graph(self._graph, stream)

    def abandon(self) -> None:
        if self._builder.is_building:
            self._builder.end_building()

    def replay(self, stream) -> None:
        launch_graph(self._graph, stream)


class StepGraph:
    """One step's per-layer work, kept to replay (`CellCache.capture`).

    width      : the step width it was captured at; it replays steps of that width only
    bindings   : the cache's `Bindings` at capture; replay raises BindingError once they moved
    kind       : "recorded launches" (re-issued) or "CUDA graph"
    n_launches : kernel launches it holds; kernels: their kernels' names, in order
    layers     : the layers whose K/V it writes
    """

    def __init__(self, captures: "Captures", keeper, width: int, bindings: Bindings, layers,
                 masks: bool):  # fmt: skip
        self._captures, self._keeper = captures, keeper
        self.width, self.bindings = width, bindings
        self.layers, self.writes_masks = frozenset(layers), masks

    @property
    def kind(self) -> str:
        return self._keeper.kind

    @property
    def n_launches(self) -> int:
        return len(self._keeper.launches)

    @property
    def kernels(self) -> tuple[str, ...]:
        """The name of each kernel it launches, in order."""
        return tuple(kernel.py_func.__name__ for kernel, *_ in self._keeper.launches)

    def replay(self) -> None:
        """Runs the captured work for the step prepared now, on its stream. StepError when
        no step is prepared (or a verb made it stale) or its width differs; BindingError
        when the pool's storage moved since the capture (recapture after a growth)."""
        self._captures.replay(self)

    def __repr__(self) -> str:
        return f"StepGraph(width={self.width}, {self.n_launches} {self.kind})"


class Captures:
    """The device cache's captured steps (`CellCache.capture`, `StepGraph.replay`).

    Owns whether the cache is capturing now. Reads the prepared step's `progress` (a fresh
    step to capture; replay marks what the graph wrote as done), the cache's `bindings`
    (taken at capture, checked at replay), and holds the cache's `lock` while a
    `StepGraph` replays.
    """

    def __init__(self, progress: Progress, bindings: Callable[[], Bindings], lock: RLock):
        self._progress, self._bindings, self._lock = progress, bindings, lock
        self._capturing = False

    def capture(self, fn: Callable[[], object], backend: str) -> StepGraph:
        """`CellCache.capture(fn, backend=backend)`, under the cache's lock."""
        progress = self._progress
        step = progress.current()
        if backend not in BACKENDS or (backend == "graph" and IS_SIMULATOR):
            raise StepError(f"backend={backend!r}: give one of {BACKENDS} ('graph' needs a GPU)")
        if progress.written or progress.masked or is_recording():
            raise StepError(
                "capture() takes a fresh step: call it right after prepare_step(), before any "
                "write, attend or mask of the step, and not inside another capture"
            )
        if not IS_SIMULATOR and backend != "record" and stream_handle(step.stream) in (0, 1, 2):
            raise StepError(
                "a CUDA graph cannot capture a default stream; prepare the step on the "
                "cache's own stream or a stream of your own"
            )
        bindings = self._bindings()
        keeper = Recorded() if IS_SIMULATOR or backend == "record" else CudaGraph(step.stream)
        self._capturing = True
        try:
            with recording(keeper):
                fn()
        except BaseException:
            keeper.abandon()
            if not keeper.runs_eagerly:  # nothing of the step ran: it is fresh again
                progress.written, progress.masked = set(), False
            raise
        finally:
            self._capturing = False
        keeper.finish(step.stream)
        return StepGraph(self, keeper, step.width, bindings, progress.written, progress.masked)

    def active(self) -> bool:
        """Whether this cache is capturing now; StepError when another cache's capture is
        taking this thread's launches (its graph would hold this cache's work)."""
        if is_recording() and not self._capturing:
            raise StepError(
                "another cache's capture (or a raw launch recording) is taking this thread's "
                "launches: write and attend a cache only inside its own capture(fn)"
            )
        return self._capturing

    @locked
    @not_while_capturing
    def replay(self, graph: StepGraph) -> None:
        """Runs `graph` for the step prepared now (`StepGraph.replay`)."""
        progress = self._progress
        step = progress.current()
        if step.width != graph.width:
            raise StepError(
                f"the prepared step has width {step.width}; this graph was captured at width "
                f"{graph.width}: prepare_step(width={graph.width}) or capture again"
            )
        check_bindings(graph.bindings, self._bindings())
        graph._keeper.replay(step.stream)
        progress.written |= graph.layers
        progress.masked = progress.masked or graph.writes_masks
