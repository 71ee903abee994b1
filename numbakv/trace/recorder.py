"""`Recorder`: the cell table of a cache (either implementation) recorded over a workload,
through its observer hook, as the frames of a `Trace` (numba-free).

A frame stores only the cells that changed since the one before (format 3,
`numbakv.trace.file`), so a decode step of n sequences costs O(n) bytes and O(n) time;
`annotate` adds the caller's own events (an engine's
admissions and finishes) between the frames.

At a frame the recorder reads the cells the verbs touched and keeps them pending, with the
live ids and the step's rows. The pending frames are encoded together (`_encode`), in
whole-array passes over all their cells: what each cell held before (the batch's read of it
before, else the recorder's own copy of the table, `_Kept`), which changed, their owner
codes, the owner bits each change to a shared cell flips. Every pass costs O(cells
touched), none O(capacity) (the copy of the table is allocated once, its owners' pages
mapped as shared cells are recorded), and a pass's fixed cost is shared by the frames of a
batch (BATCH_FRAMES, BATCH_CELLS). Each column's chunks are deflated into its member of
the trace file on a background thread, a MiB at a time (`zip_stream`), and only that is
kept: a recorder holds its frames in about the file's size, and `save` has little left
to deflate.
"""

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.core.snapshot import FREE, SHARED, owner_codes
from numbakv.trace.checks import annotation_problem, plain_data
from numbakv.trace.file import ARRAYS, FRAME_EVENTS, write_trace_file
from numbakv.trace.frames import Trace
from numbakv.trace.zip_stream import Deflated, Stream, npy_head

BATCH_FRAMES = 256  # pending frames that make a batch
BATCH_CELLS = 1 << 14  # or pending cells read: a batch holds their [cells, words] owners
_NO_STEP = (np.zeros(0, np.int32),) * 3  # a frame's step rows when it is no step
# the verbs that may change which ids are live: after any other the live ids are not read
_LIVE_EVENTS = frozenset({"seq_new", "seq_clone", "seq_rm", "clear", "seq_load"})


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
        self._kept = _Kept(self.config.capacity, self.config.n_owner_words)
        self._extent = 0  # the largest read_len recorded: every cell past it stayed free
        self._touched: list[np.ndarray] = []  # cells the verbs since the last frame touched
        self._live: np.ndarray | None = None  # [max_seqs] bool, None once a verb changed it
        self._columns = {
            name: _Column(dtype, self.config.max_seqs if name == "live" else None)
            for name, (dtype, _) in ARRAYS.items()
        }
        for name in ("delta_offsets", "step_offsets"):
            self._columns[name].extend(np.zeros(1, np.int64))
        self._pending = _Pending()
        self._n_frames = 0
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
        frame = self._n_frames - 1
        self._annotations.append({"frame": frame, "kind": kind, "data": plain_data(data)})

    def _on_event(self, cache, event: str, step) -> None:
        if self._reads_touched:
            self._touched.append(cache.touched_cells())
        if event in _LIVE_EVENTS:
            self._live = None
        if step is not None or self.every_verb:
            self._record(cache, event, step)

    def _record(self, cache, event: str, step) -> None:
        """Reads the frame after `event` (`step`: the Step of a prepare_step, else None)
        into the pending batch; encodes the batch once it is full."""
        read_len, rows, live, reads = self._read(cache, event)
        steps = _NO_STEP if step is None else (step.cells, step.positions, step.seq_ids)
        self._pending.add((FRAME_EVENTS.index(event), read_len, rows), live, reads, steps)
        self._extent = max(self._extent, read_len)
        self._n_frames += 1
        if self._pending.is_full():
            self._flush()

    def _read(self, cache, event: str) -> tuple:
        """(read_len, rows, [max_seqs] bool live, ([n] cells ascending, their [n] int32 pos,
        [n, words] uint64 owners)): the cells the verbs touched since the last frame; every
        cell the first time and for a cache that does not say what its verbs touched. The
        live ids are read again only after a verb of _LIVE_EVENTS."""
        if event != "start" and self._reads_touched:
            touched, self._touched = self._touched, []
            cells = _distinct(np.concatenate([np.zeros(0, np.int32), *touched]))
            if self._live is None:
                self._live = np.zeros(self.config.max_seqs, dtype=bool)
                self._live[cache.live_seqs] = True
            return cache.read_len, cache.rows, self._live, (cells, *cache.cells_state(cells))
        snap = cache.snapshot()
        self._touched, self._live = [], snap.live
        n = max(snap.read_len, self._extent)
        pos = np.full(n, -1, dtype=np.int32)
        owners = np.zeros((n, self.config.n_owner_words), dtype=np.uint64)
        pos[: snap.read_len], owners[: snap.read_len] = snap.pos, snap.owners
        return snap.read_len, snap.rows, snap.live, (np.arange(n), pos, owners)

    def _flush(self) -> None:
        """Appends the pending frames to the columns, encoded (`_encode`)."""
        pending, self._pending = self._pending, _Pending()
        if pending.frames:
            c = self._columns
            offsets = len(c["delta_cells"]), len(c["step_cells"])
            for name, values in _encode(pending, self._kept, *offsets):
                c[name].extend(values)

    def trace(self) -> Trace:
        """The frames recorded so far: read-only arrays, inflated from the recorder's deflated
        columns (and checked, as `load_trace` checks a file)."""
        self._flush()
        arrays = {name: column.view() for name, column in self._columns.items()}
        return Trace(self.config, arrays, self._annotations)

    def save(self, path) -> None:
        """Writes the frames recorded so far to one `.npz` file: the file `trace().save`
        writes, without `trace()`'s check of the recorder's own arrays (`load_trace` checks
        every file it reads). The columns were deflated as they grew, on a background
        thread (`zip_stream`): saving deflates the chunks still waiting (under a MiB a
        column), once the worker is done with what was queued before."""
        self._flush()
        members = {name: column.deflated() for name, column in self._columns.items()}
        write_trace_file(path, self.config, members, self._annotations)


class _Pending:
    """Frames read since the columns were last appended to, not yet encoded."""

    def __init__(self):
        self.frames: list[tuple[int, int, int]] = []  # (event index, read_len, rows) each
        self.live: list[np.ndarray] = []  # [max_seqs] bool each
        self.cells: list[tuple[np.ndarray, ...]] = []  # (cells, pos, owners): `_read`
        self.steps: list[tuple[np.ndarray, ...]] = []  # ([width] cells, positions, seq_ids)
        self._n_cells = 0

    def add(self, frame: tuple, live: np.ndarray, cells: tuple, steps: tuple) -> None:
        self.frames.append(frame)
        self.live.append(live)
        self.cells.append(cells)
        self.steps.append(steps)
        self._n_cells += len(cells[0])

    def is_full(self) -> bool:
        """True once the frames or the cells read are enough for a batch."""
        return len(self.frames) >= BATCH_FRAMES or self._n_cells >= BATCH_CELLS


class _Kept:
    """The cell table as the frames so far leave it: [capacity] int32 pos and owner codes,
    and the owners of the cells coded SHARED (any other cell's owners are its code's: one
    id, or none), one void item of `words` uint64 a cell (numpy gathers and scatters those
    several times faster than the rows of a 2-d array). The owners are allocated, not
    written: memory is taken only for the shared cells recorded."""

    def __init__(self, capacity: int, n_words: int):
        self._pos = np.full(capacity, -1, dtype=np.int32)
        self._codes = np.full(capacity, FREE, dtype=np.int32)
        self._owners = np.zeros(capacity, dtype=(np.void, 8 * n_words))

    def swap(
        self, cells: np.ndarray, pos: np.ndarray, codes: np.ndarray, owners: np.ndarray
    ) -> tuple:
        """Sets cells to what a batch's reads say: [n] `cells` (each frame's distinct, frames
        in order), their [n] int32 `pos` and owner `codes` and [n, words] uint64 `owners`.
        Compares each read with what its cell held before it (the batch's read of the cell
        before, else the table here): ([n] bool whether it changed, and of each owner word
        that changed in a read coded SHARED, in order: [k] int64 its read, [k] int64 its
        word, [k] uint64 its changed bits). A read coded otherwise changed its owners
        exactly when it changed its code, so only SHARED reads compare words."""
        order = np.argsort(cells, kind="stable")  # by cell, then frame
        by_cell = cells[order]
        first, last = np.ones(len(cells), dtype=bool), np.ones(len(cells), dtype=bool)
        first[1:] = last[:-1] = by_cell[1:] != by_cell[:-1]
        again = np.flatnonzero(~first)
        at, earlier = order[again], order[again - 1]
        before = np.full(len(cells), -1)  # the batch's read of the same cell before, or -1
        before[at] = earlier
        was_pos, was_code = self._pos[cells], self._codes[cells]
        was_pos[at], was_code[at] = pos[earlier], codes[earlier]
        changed = (pos != was_pos) | (codes != was_code)
        mine = np.ascontiguousarray(owners).view(self._owners.dtype).ravel()
        shared = np.flatnonzero(codes == SHARED)
        was = self._was(cells[shared], was_code[shared], before[shared], mine)
        was = was.view(np.uint64).reshape(len(shared), owners.shape[1])
        diff = (was ^ np.take(owners, shared, axis=0)).ravel()  # rows: faster than [shared]
        words = np.flatnonzero(diff)
        reads, word = np.divmod(words, owners.shape[1])
        changed[shared[reads]] = True
        ends = np.flatnonzero(last)
        at, held = order[ends], by_cell[ends]
        self._pos[held], self._codes[held] = pos[at], codes[at]
        at = at[codes[at] == SHARED]
        self._owners[cells[at]] = mine[at]
        return changed, shared[reads], word, diff[words]

    def _was(
        self, cells: np.ndarray, codes: np.ndarray, before: np.ndarray, mine: np.ndarray
    ) -> np.ndarray:
        """[n] owner items: what `cells` (coded `codes` before) held, from the batch's read
        `before` (`mine`: the batch's owners) where one is (>= 0), else from here."""
        was = np.zeros(len(cells), dtype=mine.dtype)
        batch = np.flatnonzero(before >= 0)
        was[batch] = mine[before[batch]]
        here = np.flatnonzero((before < 0) & (codes == SHARED))
        was[here] = self._owners[cells[here]]
        one = np.flatnonzero((before < 0) & (codes >= 0))
        words = was.view(np.uint64).reshape(len(cells), mine.dtype.itemsize // 8)
        words[one, codes[one] // 64] = np.uint64(1) << (codes[one] % 64).astype(np.uint64)
        return was


def _encode(pending: _Pending, kept: _Kept, n_changes: int, n_rows: int) -> list[tuple]:
    """(name, entries) for every array of ARRAYS: the pending frames', in order; `kept` is
    left as they leave the table. n_changes, n_rows: the changes and step rows recorded
    before them (their offsets start there)."""
    events, read_len, rows = (np.array(x) for x in zip(*pending.frames, strict=True))
    cells, pos, owners = (np.concatenate(x) for x in zip(*pending.cells, strict=True))
    codes = owner_codes(owners)
    changed, *words = kept.swap(cells, pos, codes, owners)
    flips, toggle_seqs = _flips(owners, *words)
    ends = np.cumsum([len(reads[0]) for reads in pending.cells])
    done = np.concatenate([[0], np.cumsum(changed)])[ends]  # each frame's changes end there
    changed = np.flatnonzero(changed)
    steps = [np.concatenate(x) for x in zip(*pending.steps, strict=True)]
    return [
        ("events", events), ("read_len", read_len), ("rows", rows),
        ("live", np.stack(pending.live)), ("delta_offsets", n_changes + done),
        ("delta_cells", cells[changed]), ("delta_pos", pos[changed]),
        ("delta_codes", codes[changed]), ("toggle_counts", flips[changed]),
        ("toggle_seqs", toggle_seqs),
        ("step_offsets", n_rows + np.cumsum([len(s[0]) for s in pending.steps])),
        ("step_cells", steps[0]), ("step_positions", steps[1]), ("step_seq_ids", steps[2]),
    ]  # fmt: skip


def _flips(owners: np.ndarray, reads: np.ndarray, words: np.ndarray, bits: np.ndarray) -> tuple:
    """([n] int32 how many owner bits each read flips, [t] int32 each flip: toggle_seqs, s
    where the read's cell gains owner s, ~s where it loses s, by read then id) of the
    reads' changed owner words ([k] each, by read then word): each one's read and word in
    `owners` ([n, words] uint64, after) and `bits` ([k] uint64), the bits it changed."""
    n_bits = np.bitwise_count(bits)
    flip = np.repeat(np.arange(len(words)), n_bits)  # each flipped bit's word, in order
    bit = _bits(bits, np.cumsum(n_bits) - n_bits, len(flip))
    reads, words = reads[flip], words[flip]
    gained = (owners[reads, words] >> bit.astype(np.uint64)) & np.uint64(1)
    ids = 64 * words + bit
    seqs = np.where(gained == 1, ids, ~ids).astype(np.int32)
    return np.bincount(reads, minlength=len(owners)).astype(np.int32), seqs


def _bits(values: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """[n] int64: the bits set in `values` ([m] uint64), ascending, each value's from its
    entry of `starts` on: the lowest bits of all, then the next of those with more, ..."""
    bits = np.empty(n, dtype=np.int64)
    at, rest, nth = np.arange(len(values)), values, 0
    while len(at):
        lower = rest & (rest - np.uint64(1))  # the value without its lowest bit
        bits[starts[at] + nth] = np.bitwise_count((rest ^ lower) - np.uint64(1))
        more = lower != 0
        at, rest, nth = at[more], lower[more], nth + 1
    return bits


class _Column:
    """A numpy array appended to in chunks, kept only deflated: each chunk goes to the
    column's member of the trace file, deflated off this thread a MiB at a time
    (`zip_stream`), so the recorder holds a long run in its file's size, not its arrays'.
    Reading the n entries inflates them, O(n)."""

    def __init__(self, dtype, width: int | None = None):
        self._dtype, self._shape = np.dtype(dtype), () if width is None else (width,)
        self._n = 0
        self._stream = Stream()

    def extend(self, values) -> None:
        chunk = np.ascontiguousarray(values, dtype=self._dtype)
        self._n += len(chunk)
        self._stream.append(chunk)

    def deflated(self) -> Deflated:
        """The column's `.npy` member, deflated: the entries so far."""
        return self._stream.finish(npy_head((self._n, *self._shape), self._dtype))

    def __len__(self) -> int:
        return self._n

    def view(self) -> np.ndarray:
        """The entries so far, read-only (inflated from the column's stream)."""
        body = self._stream.contents()
        return np.frombuffer(body, self._dtype).reshape(self._n, *self._shape)


def _distinct(cells: np.ndarray) -> np.ndarray:
    """[n] the distinct values of `cells` ([m] ints), ascending: np.unique by a sort (its
    hash table costs several times as much on a frame's few thousand cells), when they
    are not so already (as one verb's are)."""
    if (cells[1:] > cells[:-1]).all():
        return cells
    cells = np.sort(cells)
    keep = np.ones(len(cells), dtype=bool)
    keep[1:] = cells[1:] != cells[:-1]
    return cells[keep]


def _python(value: object) -> object:
    """`value` with numpy scalars (np.int64, np.bool_, np.float32 ...) as Python's own."""
    if isinstance(value, list | tuple):
        return [v.item() if isinstance(v, np.generic) else v for v in value]
    return value.item() if isinstance(value, np.generic) else value
