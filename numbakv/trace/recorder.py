"""`Recorder`: the cell table of a cache (either implementation) recorded over a workload,
through its observer hook, as the frames of a `Trace` (numba-free).

A frame stores only the cells that changed since the one before, so a decode step of n
sequences costs O(n) bytes; `annotate` adds the caller's own events (an engine's
admissions and finishes) between the frames.
"""

import numpy as np

from numbakv.config import CacheConfig
from numbakv.errors import ConfigError
from numbakv.trace.checks import annotation_problem, plain_data
from numbakv.trace.file import ARRAYS, FRAME_EVENTS
from numbakv.trace.frames import Trace


class Recorder:
    """Records a cache's table after every step (and every verb with `every_verb=True`).

    >>> recorder = Recorder(cache)      # frame 0: the table now
    >>> ...                             # run the workload
    >>> recorder.annotate("admit", request=0, seqs=[0])   # an event between frames
    >>> recorder.save("run.npz")        # load_trace("run.npz") gives it back

    Each frame stores only the cells that changed since the one before, so a decode
    step of n sequences costs O(n) bytes; the comparison costs O(read_len) time.
    """

    def __init__(self, cache, every_verb: bool = False):
        self.config: CacheConfig = cache.config
        self.every_verb = every_verb
        self._cache = cache
        self._pos = np.zeros(0, dtype=np.int32)
        self._owners = np.zeros((0, self.config.n_owner_words), dtype=np.uint64)
        self._columns: dict[str, list] = {name: [] for name in ARRAYS}
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
        if step is not None or self.every_verb:
            self._record(cache, event, step)

    def _record(self, cache, event: str, step) -> None:
        snap = cache.snapshot()
        cells, pos, owners = _changes(self._pos, self._owners, snap.pos, snap.owners)
        self._pos, self._owners = snap.pos, snap.owners
        c = self._columns
        c["events"].append(FRAME_EVENTS.index(event))
        c["read_len"].append(snap.read_len)
        c["rows"].append(snap.rows)
        c["live"].append(snap.live)
        c["delta_cells"].append(cells)
        c["delta_pos"].append(pos)
        c["delta_owners"].append(owners)
        if step is not None:
            c["step_cells"].append(step.cells)
            c["step_positions"].append(step.positions)
            c["step_seq_ids"].append(step.seq_ids)
        else:
            c["step_cells"].append(np.zeros(0, np.int32))
            c["step_positions"].append(np.zeros(0, np.int32))
            c["step_seq_ids"].append(np.zeros(0, np.int32))

    def trace(self) -> Trace:
        """The frames recorded so far."""
        c = self._columns
        arrays = {
            "events": np.array(c["events"], dtype=np.uint8),
            "read_len": np.array(c["read_len"], dtype=np.int32),
            "rows": np.array(c["rows"], dtype=np.int32),
            "live": np.array(c["live"], dtype=bool),
            "delta_offsets": _offsets(c["delta_cells"]),
            "delta_cells": np.concatenate(c["delta_cells"]).astype(np.int32),
            "delta_pos": np.concatenate(c["delta_pos"]).astype(np.int32),
            "delta_owners": np.concatenate(c["delta_owners"]).astype(np.uint64),
            "step_offsets": _offsets(c["step_cells"]),
            "step_cells": np.concatenate(c["step_cells"]).astype(np.int32),
            "step_positions": np.concatenate(c["step_positions"]).astype(np.int32),
            "step_seq_ids": np.concatenate(c["step_seq_ids"]).astype(np.int32),
        }
        return Trace(self.config, arrays, self._annotations)

    def save(self, path) -> None:
        """Writes the frames recorded so far to one `.npz` file."""
        self.trace().save(path)


def _changes(old_pos, old_owners, new_pos, new_owners):
    """(cells int32, their new pos, their new owners): the cells two tables disagree on."""
    n = max(len(old_pos), len(new_pos))

    def pad(pos, owners):
        extra = n - len(pos)
        return (
            np.concatenate([pos, np.full(extra, -1, np.int32)]),
            np.concatenate([owners, np.zeros((extra, owners.shape[1]), np.uint64)]),
        )

    (old_pos, old_owners), (new_pos, new_owners) = (
        pad(old_pos, old_owners),
        pad(new_pos, new_owners),
    )
    cells = np.flatnonzero((old_pos != new_pos) | (old_owners != new_owners).any(axis=1))
    return cells.astype(np.int32), new_pos[cells], new_owners[cells]


def _python(value: object) -> object:
    """`value` with numpy scalars (np.int64, np.bool_, np.float32 ...) as Python's own."""
    if isinstance(value, list | tuple):
        return [v.item() if isinstance(v, np.generic) else v for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _offsets(chunks: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(chunk) for chunk in chunks])]).astype(np.int64)
