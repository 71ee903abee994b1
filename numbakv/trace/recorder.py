"""`Recorder`: the cell table of a cache (either implementation) recorded over a workload,
through its observer hook, as the frames of a `Trace` (numba-free).

A frame stores only the cells that changed since the one before (format 3,
`numbakv.trace.file`), so a decode step of n sequences costs O(n) bytes and O(n) time;
`annotate` adds the caller's own events (an engine's
admissions and finishes) between the frames.
"""

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.core.snapshot import SHARED, owner_codes
from numbakv.trace.checks import annotation_problem, plain_data
from numbakv.trace.file import ARRAYS, FRAME_EVENTS
from numbakv.trace.frames import Trace
from numbakv.trace.upgrade import shared_toggles


class Recorder:
    """Records a cache's table after every step (and every verb with `every_verb=True`).

    >>> recorder = Recorder(cache)      # frame 0: the table now
    >>> ...                             # run the workload
    >>> recorder.annotate("admit", request=0, seqs=[0])   # an event between frames
    >>> recorder.save("run.npz")        # load_trace("run.npz") gives it back

    Each frame stores only the cells that changed since the one before, so a decode step
    of n sequences costs O(n) bytes; and it reads only the cells the table says its verbs
    touched (`touched_cells`, `cells_state`), so it costs O(n) time too. A cache without
    those two is compared whole, O(read_len) a frame.
    """

    def __init__(self, cache, every_verb: bool = False):
        self.config: CacheConfig = cache.config
        self.every_verb = every_verb
        self._cache = cache
        # a cache that says what its verbs touched is read there; any other is read whole
        self._reads_touched = hasattr(cache, "touched_cells") and hasattr(cache, "cells_state")
        self._pos = np.zeros(0, dtype=np.int32)  # the table as last recorded
        self._owners = np.zeros((0, self.config.n_owner_words), dtype=np.uint64)
        self._touched: list[np.ndarray] = []  # cells the verbs since the last frame touched
        self._columns = {
            name: _Column(dtype, self.config.max_seqs if name == "live" else None)
            for name, (dtype, _) in ARRAYS.items()
        }
        for name in ("delta_offsets", "step_offsets"):
            self._columns[name].extend(np.zeros(1, np.int64))
        self._annotations: list[dict] = []
        self._record(cache, "start", None)
        cache.add_observer(self._on_event)

    def close(self) -> None:
        """Stops recording; frames so far stay."""
        self._cache.remove_observer(self._on_event)

    def annotate(self, kind: str, **data) -> None:
        """Attaches an event to the trace now: after the frames recorded so far (its `frame`
        is the last of them), so it belongs to the step it leads into (`Trace.frame_steps`).
        It touches neither the cache nor the frames. An engine takes this method as its
        `annotate` hook (`Engine(..., annotate=recorder.annotate)`).

        kind : 1 to 64 ASCII letters, digits or underscores, not starting with a digit,
               e.g. "admit", "finish", "growth" or one of your own
        data : keyword arguments of such names, each None, a bool, an int in int64's range,
               a finite float, a str, or a list or tuple of those (stored as a list);
               numpy scalars count as the Python values they hold

        Refused with ConfigError naming the bad value, and nothing recorded, otherwise.
        """
        data = {key: _python(value) for key, value in data.items()}
        problem = annotation_problem(kind, data)
        if problem is not None:
            raise ConfigError(f"{problem}; nothing was recorded")
        frame = len(self._columns["events"]) - 1
        self._annotations.append({"frame": frame, "kind": kind, "data": plain_data(data)})

    def _on_event(self, cache, event: str, step) -> None:
        if self._reads_touched:
            self._touched.append(cache.touched_cells())
        if step is not None or self.every_verb:
            self._record(cache, event, step)

    def _record(self, cache, event: str, step) -> None:
        read_len, rows, live, cells, pos, owners = self._read(cache, event)
        if len(cells) and cells[-1] >= len(self._pos):
            self._grow(int(cells[-1]) + 1)
        was_pos, was_owners = self._pos[cells], self._owners[cells]
        changed = (pos != was_pos) | (owners != was_owners).any(axis=1)
        cells, pos, owners, was_owners = (x[changed] for x in (cells, pos, owners, was_owners))
        self._pos[cells], self._owners[cells] = pos, owners
        c = self._columns
        codes = owner_codes(owners)
        shared = codes == SHARED
        counts, seqs = shared_toggles(codes, was_owners[shared], owners[shared])
        c["toggle_counts"].extend(counts)
        c["toggle_seqs"].extend(seqs)
        c["events"].extend([FRAME_EVENTS.index(event)])
        c["read_len"].extend([read_len])
        c["rows"].extend([rows])
        c["live"].extend(live[None])
        c["delta_cells"].extend(cells)
        c["delta_pos"].extend(pos)
        c["delta_codes"].extend(codes)
        c["delta_offsets"].extend([len(c["delta_cells"])])
        if step is not None:
            c["step_cells"].extend(step.cells)
            c["step_positions"].extend(step.positions)
            c["step_seq_ids"].extend(step.seq_ids)
        c["step_offsets"].extend([len(c["step_cells"])])

    def _read(self, cache, event: str):
        """(read_len, rows, [max_seqs] bool live, cells ascending, their [n] pos and [n,
        words] owners) of the cells the verbs touched since the last frame; every cell the
        first time and for a cache that does not say what its verbs touched."""
        if event != "start" and self._reads_touched:
            touched, self._touched = self._touched, []
            cells = np.unique(np.concatenate([np.zeros(0, np.int32), *touched]))
            live = np.zeros(self.config.max_seqs, dtype=bool)
            live[cache.live_seqs] = True
            return (cache.read_len, cache.rows, live, cells, *cache.cells_state(cells))
        snap = cache.snapshot()
        self._touched = []
        n = max(snap.read_len, len(self._pos))
        pos = np.full(n, -1, dtype=np.int32)
        owners = np.zeros((n, self.config.n_owner_words), dtype=np.uint64)
        pos[: snap.read_len], owners[: snap.read_len] = snap.pos, snap.owners
        return snap.read_len, snap.rows, snap.live, np.arange(n), pos, owners

    def _grow(self, n: int) -> None:
        """The kept table covers cells [0, n) (doubling, so growth costs O(1) a cell)."""
        size = max(n, 2 * len(self._pos))
        pos = np.full(size, -1, dtype=np.int32)
        owners = np.zeros((size, self.config.n_owner_words), dtype=np.uint64)
        pos[: len(self._pos)], owners[: len(self._pos)] = self._pos, self._owners
        self._pos, self._owners = pos, owners

    def trace(self) -> Trace:
        """The frames recorded so far (read-only views of the recorder's arrays: no copy)."""
        arrays = {name: column.view() for name, column in self._columns.items()}
        return Trace(self.config, arrays, self._annotations)

    def save(self, path) -> None:
        """Writes the frames recorded so far to one `.npz` file."""
        self.trace().save(path)


class _Column:
    """A numpy array that grows by doubling: appending n entries costs O(n) amortized."""

    def __init__(self, dtype, width: int | None = None):
        self._data = np.zeros((16,) if width is None else (16, width), dtype=dtype)
        self._n = 0

    def extend(self, values) -> None:
        values = np.asarray(values, dtype=self._data.dtype)
        end = self._n + len(values)
        if end > len(self._data):
            data = np.zeros(
                (max(end, 2 * len(self._data)), *self._data.shape[1:]), self._data.dtype
            )
            data[: self._n] = self._data[: self._n]
            self._data = data
        self._data[self._n : end] = values
        self._n = end

    def __len__(self) -> int:
        return self._n

    def view(self) -> np.ndarray:
        view = self._data[: self._n]
        view.flags.writeable = False
        return view


def _python(value: object) -> object:
    """`value` with numpy scalars (np.int64, np.bool_, np.float32 ...) as Python's own."""
    if isinstance(value, list | tuple):
        return [v.item() if isinstance(v, np.generic) else v for v in value]
    return value.item() if isinstance(value, np.generic) else value
