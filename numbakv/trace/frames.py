"""`Trace`: the frames of a recorded workload, replayed as `Snapshot`s, with the figures the
plots draw; `load_trace` reads one back from its file (numba-free).

A frame holds the cells that changed since the one before, `read_len`, the pool's rows,
the live ids and, after a `prepare_step`, the step's tokens (`numbakv.trace.file.ARRAYS`).
`load_trace` trusts nothing in the file: `numbakv.trace.file` reads it (refusing, before
allocating, what `save` never writes) and `numbakv.trace.checks` holds the arrays to the
cell table's invariants, so every accessor of a trace that loads works; anything else is
a TraceError naming the reason.
"""

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import TraceError
from numbakv.core.snapshot import FREE, Snapshot
from numbakv.reference.step import window_mask
from numbakv.trace import scan
from numbakv.trace.checks import annotation_records, check_arrays, plain_data
from numbakv.trace.file import FRAME_EVENTS, STEP_EVENT, read_trace_file, write_trace_file


@dataclass(frozen=True)
class TraceStep:
    """A recorded step, as `plot_mask` needs it (the same attributes as a live `Step`)."""

    cells: np.ndarray  # [width] int32, -1 for padding
    positions: np.ndarray  # [width] int32
    seq_ids: np.ndarray  # [width] int32
    snapshot: Snapshot  # the table right after the step was placed
    windows: tuple[int, ...]

    @property
    def width(self) -> int:
        return len(self.cells)

    @property
    def read_len(self) -> int:
        return self.snapshot.read_len

    def mask(self, window: int, tokens: slice = slice(None)) -> np.ndarray:
        """[width, read_len] uint8 (the rows of `tokens`), by the mask rule from the table."""
        snap, seqs, positions = self.snapshot, self.seq_ids[tokens], self.positions[tokens]
        return window_mask(snap.pos, snap.owners, seqs, positions, window)


@dataclass(frozen=True)
class Annotation:
    """An event a caller attached to a trace (`Recorder.annotate`), made after frame `frame`
    (the last frame recorded before it) and before frame `frame + 1`.

    frame : int, in [0, n_frames)
    step  : int, the step it leads into: the step frames at or before `frame`
            (`Trace.frame_steps`); an annotation after step s was prepared belongs to s + 1
    kind  : str, e.g. "admit", "finish", "growth"
    data  : dict of str to None, bool, int, float, str or a list of those
    """

    frame: int
    step: int
    kind: str
    data: dict


class Trace:
    """Frames of a recorded workload. Build one with `Recorder.trace()` or `load_trace`.
    `cell_index`: its changes by cell as its checks found them (`scan.CellIndex`), which
    the figures read."""

    def __init__(
        self, config: CacheConfig, arrays: dict[str, np.ndarray], annotations: object = ()
    ):
        """`arrays`: the arrays of `numbakv.trace.file.ARRAYS`; `annotations`: a list (or
        tuple) of `{"frame": int, "kind": str, "data": dict}` in recording order (as saved;
        copied in). TraceError unless they are a consistent trace of `config`
        (`numbakv.trace.checks`)."""
        self.cell_index = check_arrays(config, arrays)  # the changes by cell, for the scans
        self._table: tuple = (-1, None, None)  # (frame, pos, owners) of `snapshot`'s last
        self._metrics: dict | None = None  # `metrics`, once computed: [n_frames] arrays
        self.config = config
        self.arrays = arrays
        self._annotations = annotation_records(len(arrays["events"]), annotations)

    @property
    def n_frames(self) -> int:
        return len(self.arrays["events"])

    @property
    def n_steps(self) -> int:
        """The recorded steps: the frames that follow a `prepare_step`."""
        return int(np.count_nonzero(self.arrays["events"] == STEP_EVENT))

    @property
    def events(self) -> list[str]:
        """The verb each frame followed ("start" for the first)."""
        return [FRAME_EVENTS[e] for e in self.arrays["events"].tolist()]

    @property
    def step_frames(self) -> np.ndarray:
        """[n_steps] int64: the frames that follow a `prepare_step`."""
        return np.flatnonzero(self.arrays["events"] == STEP_EVENT)

    @property
    def frame_steps(self) -> np.ndarray:
        """[n_frames] int64: the step each frame belongs to, one clock for frames and
        annotations. Steps are numbered by their frames: the k-th `prepare_step` frame
        (from 0) is step k. A frame belongs to the step frames strictly before it: a step
        frame to its own step, a verb frame between steps k - 1 and k to step k (what happens
        between steps is drawn at the step it leads into), frames after the last step to
        n_steps. An annotation after frame f belongs to the step frames at or before f.

            events       start seq_new prepare_step seq_rm prepare_step prepare_step seq_rm
            frame_steps  0     0       0            1      1            2            3
        """
        is_step = self.arrays["events"] == STEP_EVENT
        return (np.cumsum(is_step) - is_step).astype(np.int64)

    @property
    def annotations(self) -> tuple[Annotation, ...]:
        """Every annotation, in recording order (fresh copies: changing one changes nothing)."""
        steps = np.cumsum(self.arrays["events"] == STEP_EVENT).tolist()
        return tuple(
            Annotation(r["frame"], steps[r["frame"]], r["kind"], plain_data(r["data"]))
            for r in self._annotations
        )

    def annotation_counts(self) -> dict[str, int]:
        """{kind: how many annotations of that kind}, kinds in order of first appearance."""
        return dict(Counter(r["kind"] for r in self._annotations))

    def seq_requests(self, frame: int) -> dict[int, int]:
        """{sequence id: request id} at `frame`: what the bindings before it say."""
        n_frames, max_seqs = self.n_frames, self.config.max_seqs
        row = scan.request_table(self.seq_bindings(), n_frames, max_seqs)[frame]
        return {seq: request for seq, request in enumerate(row.tolist()) if request >= 0}

    def seq_bindings(self) -> np.ndarray:
        """[n, 3] int64 rows (frame, seq, request) in recording order: an annotation whose
        data has an int `request` and an int `seq` or a list of ints `seqs` binds those ids
        to that request from the next frame on; a later binding of the same id replaces it
        (a closed sequence's id reused by another request). An id past max_seqs binds
        nothing (it names no sequence of this cache)."""
        rows = []
        for r in self._annotations:
            data = r["data"]
            seqs = data["seqs"] if isinstance(data.get("seqs"), list) else [data.get("seq")]
            if _is_id(data.get("request")):
                rows += [(r["frame"], seq, data["request"]) for seq in seqs
                         if _is_id(seq) and seq < self.config.max_seqs]  # fmt: skip
        return np.array(rows, dtype=np.int64).reshape(-1, 3)

    @property
    def widths(self) -> np.ndarray:
        """[n_frames] int64: each frame's step width (0 when not a step)."""
        return np.diff(self.arrays["step_offsets"])

    def snapshots(self) -> Iterator[Snapshot]:
        """Every frame's table, in order, replayed from the recorded changes."""
        for f, pos, owners, _ in self._replay():
            yield self._snapshot(f, pos, owners)

    def snapshot(self, frame: int) -> Snapshot:
        """The table at `frame` (negative counts from the end), from the changes up to it
        (the last frame asked for kept: the pictures of one step ask for it twice)."""
        frame = range(self.n_frames)[frame]
        if self._table[0] != frame:
            n_cells = int(self.arrays["read_len"].max(initial=0))
            words = self.config.n_owner_words
            self._table = (frame, *scan.table_at(self.arrays, frame, n_cells, words))
        return self._snapshot(*self._table)

    def _replay(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        n_cells = int(self.arrays["read_len"].max(initial=0))
        return scan.replay_table(self.arrays, n_cells, self.config.n_owner_words)

    def _snapshot(self, f: int, pos: np.ndarray, owners: np.ndarray) -> Snapshot:
        a, read_len = self.arrays, int(self.arrays["read_len"][f])
        return Snapshot(pos=pos[:read_len].copy(), owners=owners[:read_len].copy(),
                        live=a["live"][f].copy(), read_len=read_len,
                        capacity=self.config.capacity, rows=int(a["rows"][f]))  # fmt: skip

    def step(self, frame: int) -> TraceStep:
        """The step recorded at `frame`, which must follow a `prepare_step`."""
        frame = range(self.n_frames)[frame]
        if self.arrays["events"][frame] != STEP_EVENT:
            raise TraceError(f"frame {frame} follows {self.events[frame]}, not a prepare_step")
        a = self.arrays
        rows = slice(a["step_offsets"][frame], a["step_offsets"][frame + 1])
        return TraceStep(
            cells=a["step_cells"][rows].copy(),
            positions=a["step_positions"][rows].copy(),
            seq_ids=a["step_seq_ids"][rows].copy(),
            snapshot=self.snapshot(frame),
            windows=self.config.distinct_windows,
        )

    def metrics(self) -> dict[str, np.ndarray]:
        """Per frame, [n_frames] each: the figures `plot_metrics` draws.

        used          : occupied cells
        read_len      : the extent attention sweeps
        rows          : cells the pool has allocated
        saved         : cells saved by sharing (tokens held - occupied cells)
        fragmentation : 1 - used / read_len (0 when read_len is 0): free holes below read_len
        width         : step width (0 for frames that are not steps)
        growth        : True where the pool grew (or was first allocated)
        largest_free  : the longest run of free cells among the allocated rows

        Computed once (the free runs take the most memory of any figure while computed),
        each call given its own copies.
        """
        if self._metrics is None:
            self._metrics = self._computed_metrics()
        return {name: values.copy() for name, values in self._metrics.items()}

    def _computed_metrics(self) -> dict[str, np.ndarray]:
        used, held = scan.used_and_held(self.arrays, self.cell_index)
        read_len = self.arrays["read_len"].astype(np.int64)
        rows = self.arrays["rows"].astype(np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            fragmentation = np.where(read_len > 0, 1 - used / read_len, 0.0)
        return {
            "used": used,
            "read_len": read_len,
            "rows": rows,
            "saved": held - used,
            "fragmentation": fragmentation,
            "width": self.widths,
            "growth": np.diff(rows, prepend=0) > 0,
            "largest_free": scan.largest_free_run(self.arrays, self.cell_index),
        }

    def timeline(self, frames=None) -> np.ndarray:
        """[len(frames), max read_len] int32: owner code of each cell at each frame.

        A cell's code is its owner's id, FREE (-1) or SHARED (-2) (`numbakv.core.snapshot`);
        cells past a frame's read_len are FREE. Default frames: the step frames; negative
        frames count from the end, and one past the end is an IndexError.
        """
        frames = self.step_frames if frames is None else np.asarray(frames, dtype=np.int64)
        frames = np.array([range(self.n_frames)[f] for f in frames.tolist()], dtype=np.int64)
        n_cells = int(self.arrays["read_len"].max(initial=0))
        out = np.full((len(frames), n_cells), FREE, dtype=np.int32)
        for f, codes, _ in scan.replay_codes(self.arrays, n_cells):
            out[frames == f] = codes  # each row asking for frame f, repeats included
        return out

    def save(self, path) -> None:
        """Writes the trace to one compressed `.npz` file (`numbakv.trace.file`)."""
        write_trace_file(path, self.config, self.arrays, self._annotations)


def load_trace(path) -> Trace:
    """Reads a trace written by `Recorder.save`. Raises TraceError, naming the reason, for a
    missing, damaged, hostile or inconsistent file (`numbakv.trace.file`,
    `numbakv.trace.checks`); every accessor of a trace that loads works."""
    config, arrays, annotations = read_trace_file(path)
    try:
        return Trace(config, arrays, annotations)
    except TraceError as error:
        raise TraceError(
            f"{path} is not a consistent numbakv trace ({error}); record it again"
        ) from None


def _is_id(value: object) -> bool:
    """True for an int >= 0 that is not a bool: a sequence or request id."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
