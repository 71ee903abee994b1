"""The invariants a trace's arrays must hold, so that every accessor of a `Trace` that
loaded (replay, `step(f).mask(w)`, metrics, timeline) works (numba-free).

They are the cell table's (docs/contract.md §2) read off the recorded changes: vectorized over the
changes and the frames, never replaying the table frame by frame. Annotations (events a
caller attached to the trace, `Recorder.annotate`) are held to their own rules:
`annotation_problem` for one, `annotation_records` for a trace's list of them.
"""

import math
import re

import numpy as np

from numbakv.config import CacheConfig
from numbakv.errors import TraceError
from numbakv.trace.file import ARRAYS, FRAME_EVENTS, STEP_EVENT, short
from numbakv.trace.scan import change_frames, id_words


def check_arrays(config: CacheConfig, a: dict[str, np.ndarray]) -> None:
    """Raises TraceError, naming the first broken rule, unless `a` (the arrays of ARRAYS)
    is a trace of `config`:

    - dtypes and dims as ARRAYS says; one entry per frame; offsets that cover their arrays;
      frame 0, and only it, is "start";
    - read_len <= rows <= capacity, and rows never shrink;
    - each frame's changes are distinct cells of [0, capacity), ascending, each a real
      change (a cell's first change occupies it); a cell is free (pos -1) exactly when it
      has no owner; positions < max_seq_len; owners are ids < max_seqs, live for as long as
      they own the cell;
    - read_len is the trimmed extent: every occupied cell lies below it, the one just below
      is occupied;
    - only step frames have step rows, 1 to max_width of them: real rows, then padding (all
      -1); a real row is a live sequence's token in a cell below read_len that no other row
      of the step uses, and that cell holds the token's position and that sequence alone.
    """
    _check_layout(config, a)
    history = _History(a)
    _check_changes(config, a, history)
    _check_extent(a, history)
    _check_owners_live(a, history)
    _check_steps(config, a, history)


def _first(bad: np.ndarray) -> int | None:
    """The first index where `bad` holds, or None."""
    where = np.flatnonzero(bad)
    return int(where[0]) if where.size else None


def _check_layout(config: CacheConfig, a: dict[str, np.ndarray]) -> None:
    if not isinstance(a, dict) or a.keys() != ARRAYS.keys():
        raise TraceError(f"a trace has the arrays {list(ARRAYS)}; got {list(a)}")
    for name, (dtype, extra_dims) in ARRAYS.items():
        x = a[name]
        if not isinstance(x, np.ndarray) or x.dtype != dtype or x.ndim != 1 + extra_dims:
            raise TraceError(
                f"trace array {name!r} has dtype {getattr(x, 'dtype', type(x).__name__)} and "
                f"{getattr(x, 'ndim', '?')} dims; a trace's has {np.dtype(dtype)} and "
                f"{1 + extra_dims}"
            )
    events, n_frames = a["events"], len(a["events"])
    if n_frames == 0 or events.max() >= len(FRAME_EVENTS):
        raise TraceError("trace has no frames or an unknown event")
    if events[0] != 0 or (events[1:] == 0).any():
        raise TraceError("a trace's first frame, and only that one, is the 'start' frame")
    for name in ("read_len", "rows", "live"):
        if len(a[name]) != n_frames:
            raise TraceError(f"trace array {name!r} has {len(a[name])} frames, events {n_frames}")
    if a["live"].shape[1] != config.max_seqs:
        raise TraceError(f"trace live has {a['live'].shape[1]} ids; max_seqs={config.max_seqs}")
    if a["delta_owners"].shape[1] != config.n_owner_words:
        raise TraceError(
            f"trace owners have {a['delta_owners'].shape[1]} words; max_seqs={config.max_seqs} "
            f"needs {config.n_owner_words}"
        )
    columns = {"delta": ("cells", "pos", "owners"), "step": ("cells", "positions", "seq_ids")}
    for prefix, names in columns.items():
        offsets = a[f"{prefix}_offsets"]
        lengths = {len(a[f"{prefix}_{name}"]) for name in names}
        if (
            len(offsets) != n_frames + 1
            or offsets[0] != 0
            or (np.diff(offsets) < 0).any()
            or lengths != {offsets[-1]}
        ):
            raise TraceError(f"trace {prefix} offsets do not cover its {prefix} arrays")
    read_len, rows, capacity = a["read_len"], a["rows"], config.capacity
    if (f := _first((read_len < 0) | (read_len > capacity))) is not None:
        raise TraceError(f"frame {f}'s read_len {read_len[f]} is outside [0, {capacity=}]")
    if (f := _first((rows < read_len) | (rows > capacity))) is not None:
        raise TraceError(
            f"frame {f}'s pool has {rows[f]} rows, outside [read_len={read_len[f]}, {capacity=}]"
        )
    if (f := _first(np.diff(rows) < 0)) is not None:
        raise TraceError(f"the pool shrinks at frame {f + 1}, from {rows[f]} to {rows[f + 1]} rows")


class _History:
    """The changes sorted by (cell, frame); change i holds for frames [start[i], end[i])."""

    def __init__(self, a: dict[str, np.ndarray]):
        self.n_frames = len(a["events"])
        self.frame = change_frames(a)  # unsorted
        order = np.lexsort((self.frame, a["delta_cells"]))
        self.cells, self.start = a["delta_cells"][order], self.frame[order]
        self.pos, self.owners = a["delta_pos"][order], a["delta_owners"][order]
        same = self.cells[1:] == self.cells[:-1]  # change i + 1 is the next of change i's cell
        self.is_first = np.concatenate([[True], ~same])[: len(self.cells)]
        self.end = np.where(np.append(same, False), np.append(self.start[1:], 0), self.n_frames)
        self.keys = self.cells.astype(np.int64) * self.n_frames + self.start

    def state(self, cells: np.ndarray, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([n] int32 pos, [n, n_owner_words] uint64 owners) of each of `cells` right after
        its frame of `frames` ([n] each): its last change by then (free before any)."""
        j = np.searchsorted(self.keys, cells.astype(np.int64) * self.n_frames + frames, "right")
        j -= 1
        if len(self.cells):
            j[self.cells[np.maximum(j, 0)] != cells] = -1
        pos = np.append(self.pos, np.int32(-1))  # index -1: a free cell
        owners = np.vstack([self.owners, np.zeros((1, self.owners.shape[1]), np.uint64)])
        return pos[j], owners[j]


def _check_changes(config: CacheConfig, a: dict[str, np.ndarray], h: _History) -> None:
    cells, pos, owners, frame = a["delta_cells"], a["delta_pos"], a["delta_owners"], h.frame
    if (i := _first((cells < 0) | (cells >= config.capacity))) is not None:
        raise TraceError(
            f"frame {frame[i]} changes cell {cells[i]}, outside [0, capacity={config.capacity})"
        )
    if (i := _first((frame[1:] == frame[:-1]) & (cells[1:] <= cells[:-1]))) is not None:
        raise TraceError(f"frame {frame[i]} lists cell {cells[i + 1]} out of order or twice")
    if (i := _first((pos < -1) | (pos >= config.max_seq_len))) is not None:
        raise TraceError(
            f"frame {frame[i]} gives cell {cells[i]} position {pos[i]}, outside "
            f"[-1, max_seq_len={config.max_seq_len})"
        )
    if (i := _first((pos == -1) == owners.any(axis=1))) is not None:
        raise TraceError(
            f"frame {frame[i]} gives cell {cells[i]} position {pos[i]} and "
            f"{'no' if pos[i] >= 0 else 'some'} owners; a cell is free exactly when unowned"
        )
    if config.max_seqs % 64:
        past = owners[:, -1] >> np.uint64(config.max_seqs % 64) != 0
        if (i := _first(past)) is not None:
            raise TraceError(
                f"frame {frame[i]} gives cell {cells[i]} an owner id past "
                f"max_seqs={config.max_seqs}"
            )
    if (i := _first(h.is_first & (h.pos < 0))) is not None:
        raise TraceError(f"frame {h.start[i]} frees cell {h.cells[i]}, which was never occupied")
    again = ~h.is_first[1:] & (h.pos[1:] == h.pos[:-1]) & (h.owners[1:] == h.owners[:-1]).all(1)
    if (i := _first(again)) is not None:
        raise TraceError(
            f"frame {h.start[i + 1]} records cell {h.cells[i + 1]} changing to the state it had"
        )


def _check_extent(a: dict[str, np.ndarray], h: _History) -> None:
    """read_len is the trimmed extent: each occupied cell lies below it for as long as it is
    occupied, and the cell just below it is occupied."""
    read_len = a["read_len"]
    occupied = np.flatnonzero(h.pos >= 0)
    if len(occupied):  # the lowest read_len over each occupied stretch [start, end)
        bounds = np.stack([h.start[occupied], h.end[occupied]], axis=1).ravel()
        lowest = np.minimum.reduceat(np.append(read_len, 0), bounds)[::2]
        if (i := _first(lowest <= h.cells[occupied])) is not None:
            raise TraceError(
                f"cell {h.cells[occupied[i]]} is occupied from frame {h.start[occupied[i]]} "
                f"while read_len drops to {lowest[i]}; every occupied cell lies below read_len"
            )
    frames = np.flatnonzero(read_len > 0)
    below, _ = h.state(read_len[frames] - 1, frames)
    if (i := _first(below < 0)) is not None:
        f = frames[i]
        raise TraceError(
            f"frame {f}'s read_len {read_len[f]} is not trimmed: cell {read_len[f] - 1} is free"
        )


def _check_owners_live(a: dict[str, np.ndarray], h: _History) -> None:
    """Every owner of a cell is live for as long as the cell holds it: no owner of change i
    is dead at any frame of [start[i], end[i])."""
    dead = _dead_during(a["live"], h.start, h.end)  # [n_changes, n_owner_words] uint64
    if (i := _first((h.owners & dead).any(axis=1))) is not None:
        words = (h.owners[i] & dead[i]).tolist()
        word = next(w for w, bits in enumerate(words) if bits)
        seq = 64 * word + (words[word] & -words[word]).bit_length() - 1  # its lowest such id
        raise TraceError(
            f"cell {h.cells[i]} is owned by sequence {seq} from frame {h.start[i]} while "
            f"that sequence is not live"
        )


def _dead_during(live: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """[n, words] uint64: the ids not live at some frame of [start[i], end[i]) (end > start),
    by range-OR over a sparse table of each frame's dead ids (log2 n_frames levels)."""
    n_frames = len(live)
    levels = [id_words(~live)]
    while 2 ** len(levels) <= n_frames:
        half, prev = 2 ** (len(levels) - 1), levels[-1]
        levels.append(prev[: len(prev) - half] | prev[half:])  # frames [i, i + 2 half)
    k = np.log2(end - start).astype(np.int64)  # exact for int64 below 2 ** 52
    out = np.zeros((len(start), levels[0].shape[1]), dtype=np.uint64)
    for level in np.unique(k).tolist():
        at = np.flatnonzero(k == level)
        table = levels[level]
        out[at] = table[start[at]] | table[end[at] - 2**level]
    return out


def _check_steps(config: CacheConfig, a: dict[str, np.ndarray], h: _History) -> None:
    widths, is_step = np.diff(a["step_offsets"]), a["events"] == STEP_EVENT
    if (f := _first(~is_step & (widths != 0))) is not None:
        raise TraceError(f"frame {f} is no step but has {widths[f]} step rows")
    if (f := _first(is_step & ((widths < 1) | (widths > config.max_width)))) is not None:
        raise TraceError(
            f"frame {f}'s step has width {widths[f]}, outside [1, max_width={config.max_width}]"
        )
    cells, positions, seq_ids = a["step_cells"], a["step_positions"], a["step_seq_ids"]
    frame = np.repeat(np.arange(len(widths)), widths)
    pad = seq_ids == -1
    if (r := _first(pad & ((cells != -1) | (positions != -1)))) is not None:
        raise TraceError(
            f"frame {frame[r]}'s step row {r} is padding (sequence -1) with cell {cells[r]} "
            f"and position {positions[r]}; padding rows are all -1"
        )
    if (r := _first(pad[:-1] & ~pad[1:] & (frame[1:] == frame[:-1]))) is not None:
        raise TraceError(f"frame {frame[r]}'s step has a real row after padding; padding is last")
    if (f := _first(is_step & np.append(pad, True)[a["step_offsets"][:-1]])) is not None:
        raise TraceError(f"frame {f}'s step starts with padding; a step has a real token first")
    real = np.flatnonzero(~pad)
    f, c, p, s = frame[real], cells[real], positions[real], seq_ids[real]
    if (i := _first((s < 0) | (s >= config.max_seqs))) is not None:
        raise TraceError(
            f"frame {f[i]}'s step names sequence {s[i]}, past max_seqs={config.max_seqs}"
        )
    if (i := _first(~a["live"][f, s])) is not None:
        raise TraceError(f"frame {f[i]}'s step names sequence {s[i]}, which is not live")
    if (i := _first((c < 0) | (c >= a["read_len"][f]))) is not None:
        raise TraceError(
            f"frame {f[i]}'s step places a token in cell {c[i]}, outside "
            f"[0, read_len={a['read_len'][f[i]]})"
        )
    order = np.lexsort((c, f))
    if (i := _first((np.diff(f[order]) == 0) & (np.diff(c[order]) == 0))) is not None:
        raise TraceError(f"frame {f[order[i]]}'s step places two tokens in cell {c[order[i]]}")
    held_pos, held_owners = h.state(c, f)
    expect = np.zeros((len(real), config.n_owner_words), dtype=np.uint64)
    expect[np.arange(len(real)), s // 64] = np.left_shift(np.uint64(1), (s % 64).astype(np.uint64))
    if (i := _first((held_pos != p) | (held_owners != expect).any(axis=1))) is not None:
        raise TraceError(
            f"frame {f[i]}'s step puts sequence {s[i]} position {p[i]} in cell {c[i]}, but "
            f"the table holds position {held_pos[i]} there, or other owners"
        )


# -- annotations ---------------------------------------------------------------------

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a kind or a data key: identifier-like
_NAME_RULE = "1 to 64 ASCII letters, digits or underscores, not starting with a digit"
SCALARS = (bool, int, float, str, type(None))  # in the order `_plain` tries them
INT64 = range(-(2**63), 2**63)


def annotation_problem(kind: object, data: object) -> str | None:
    """Why (`kind`, `data`) cannot be an annotation, naming the bad value; None when it can.

    kind : a str of 1 to 64 ASCII letters, digits and underscores, not starting with a digit
    data : a dict of such keys to JSON-safe values: None, bool, an int in int64's range, a
           finite float, a str, or a list or tuple of those (no nesting)
    """
    if not isinstance(kind, str) or not NAME.fullmatch(kind):
        return f"an annotation's kind must be {_NAME_RULE}; got {short(kind)}"
    if not isinstance(data, dict):
        return f"an annotation's data must be a dict; got {short(data)}"
    for key, value in data.items():
        if not isinstance(key, str) or not NAME.fullmatch(key):
            return f"{kind} annotation: a data key must be {_NAME_RULE}; got {short(key)}"
        items = value if isinstance(value, list | tuple) else [value]
        bad = [item for item in items if not _is_scalar(item)]
        if bad:
            return (
                f"{kind} annotation: {key}={short(value)} is not JSON-safe ({short(bad[0])}); "
                "give None, a bool, an int64, a finite float, a str or a list of those"
            )
    return None


def annotation_records(n_frames: int, records: object) -> list[dict]:
    """`records` (parsed JSON) as a trace's annotations: a list of {"frame", "kind", "data"}
    dicts, each frame an int in [0, n_frames), frames non-decreasing, each (kind, data)
    passing `annotation_problem`; TraceError naming the first that does not. Returns
    copies (`plain_data`)."""
    if not isinstance(records, list | tuple):
        raise TraceError(f"a trace's annotations are a list; got {short(records)}")
    out, last = [], 0
    for i, record in enumerate(records):
        if not isinstance(record, dict) or record.keys() != {"frame", "kind", "data"}:
            raise TraceError(f"annotation {i} is not {{frame, kind, data}}: {short(record)}")
        frame = record["frame"]
        if isinstance(frame, bool) or not isinstance(frame, int) or not 0 <= frame < n_frames:
            raise TraceError(
                f"annotation {i} follows frame {short(frame)}, outside [0, n_frames={n_frames})"
            )
        if frame < last:
            raise TraceError(
                f"annotation {i} follows frame {frame}, before annotation {i - 1}'s frame "
                f"{last}; annotations are in recording order"
            )
        problem = annotation_problem(record["kind"], record["data"])
        if problem is not None:
            raise TraceError(f"annotation {i}: {problem}")
        out.append({"frame": frame, "kind": record["kind"], "data": plain_data(record["data"])})
        last = frame
    return out


def plain_data(data: dict) -> dict:
    """A copy of an annotation's data (one `annotation_problem` passed) in Python's own
    types: lists for tuples, `bool`/`int`/`float`/`str` for their subclasses (numpy's
    float64, an IntEnum), so it saves as JSON and loads back equal."""
    return {
        key: [_plain(v) for v in value] if isinstance(value, list | tuple) else _plain(value)
        for key, value in data.items()
    }


def _plain(value: object) -> object:
    return next((kind(value) for kind in SCALARS[:4] if isinstance(value, kind)), None)


def _is_scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value in INT64
    return isinstance(value, SCALARS)
