"""The invariants a trace's arrays must hold, so that every accessor of a `Trace` that
loaded (replay, `step(f).mask(w)`, metrics, timeline) works (numba-free).

They are the cell table's (docs/contract.md §2) read off the recorded changes: the
arrays' own here, those of the table over every change at once beside what each found in
it (`numbakv.trace.sweep.TableRules`), naming the first frame that breaks one and its
first rule, as a replay frame by frame would.
Annotations (events a caller attached to the trace, `Recorder.annotate`) are held to their
own rules: `annotation_problem` for one, `annotation_records` for a trace's list of them.
"""

import math
import re

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import TraceError
from numbakv.core.snapshot import FREE, SHARED
from numbakv.core.values import short_repr
from numbakv.trace.file import ARRAYS, FRAME_EVENTS, STEP_EVENT
from numbakv.trace.scan import CellIndex
from numbakv.trace.sweep import TableRules


def check_arrays(config: CacheConfig, a: dict[str, np.ndarray]) -> CellIndex:
    """Raises TraceError, naming the first broken rule, unless `a` (the arrays of ARRAYS)
    is a trace of `config`:

    - dtypes and dims as ARRAYS says; one entry per frame; offsets that cover their arrays;
      frame 0, and only it, is "start";
    - read_len <= rows <= capacity, and rows never shrink;
    - each frame's changes are distinct cells of [0, capacity), ascending, each a real
      change; a cell is free (pos -1, code FREE) exactly when it has no owner; positions <
      max_seq_len; codes are ids < max_seqs, FREE or SHARED; only a change to a shared
      cell has toggles, each gaining an id the cell lacks or losing one it has, ids
      ascending, leaving it several owners; owners are live for as long as they own a cell;
    - read_len is the trimmed extent: every occupied cell lies below it, the one just below
      is occupied;
    - only step frames have step rows, 1 to max_width of them: real rows, then padding (all
      -1); a real row is a live sequence's token in a cell below read_len that no other row
      of the step uses, and that cell holds the token's position and that sequence alone.

    The arrays are read in place, each rule over every change at once: O(changes + frames
    * max_seqs) time and memory. Returns the changes' `CellIndex`, which the trace's
    figures reuse.
    """
    _check_layout(config, a)
    _check_values(config, a)
    _check_rows(config, a)
    rules = TableRules(config, a)
    rules.name_first()
    seen = rules.seen
    owners = (seen.ended, seen.owners)
    return CellIndex(a, seen.previous, seen.change_owners(), owners, rules.frames)


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
    columns = {
        "delta": ("cells", "pos", "codes"),
        "toggle": ("counts",),  # delta_offsets cover toggle_counts too
        "step": ("cells", "positions", "seq_ids"),
    }
    for prefix, names in columns.items():
        offsets = a[f"{'delta' if prefix == 'toggle' else prefix}_offsets"]
        lengths = {len(a[f"{prefix}_{name}"]) for name in names}
        if (
            len(offsets) != n_frames + 1
            or offsets[0] != 0
            or (np.diff(offsets) < 0).any()
            or lengths != {offsets[-1]}
        ):
            raise TraceError(f"trace {prefix} offsets do not cover its {prefix} arrays")
    counts = a["toggle_counts"]
    if (counts < 0).any() or counts.sum(dtype=np.int64) != len(a["toggle_seqs"]):
        raise TraceError(
            f"trace toggle_counts are negative or add up to other than its "
            f"{len(a['toggle_seqs'])} toggle_seqs"
        )
    read_len, rows, capacity = a["read_len"], a["rows"], config.capacity
    if (f := _first((read_len < 0) | (read_len > capacity))) is not None:
        raise TraceError(f"frame {f}'s read_len {read_len[f]} is outside [0, {capacity=}]")
    if (f := _first((rows < read_len) | (rows > capacity))) is not None:
        raise TraceError(
            f"frame {f}'s pool has {rows[f]} rows, outside [read_len={read_len[f]}, {capacity=}]"
        )
    if (f := _first(np.diff(rows) < 0)) is not None:
        raise TraceError(f"the pool shrinks at frame {f + 1}, from {rows[f]} to {rows[f + 1]} rows")


def _frame_of(a: dict[str, np.ndarray], change: int) -> int:
    """The frame change `change` belongs to."""
    return int(np.searchsorted(a["delta_offsets"], change, side="right")) - 1


def _check_values(config: CacheConfig, a: dict[str, np.ndarray]) -> None:
    """Each change's cell, position and code, and each toggle's id, in range."""
    cells, pos, codes = a["delta_cells"], a["delta_pos"], a["delta_codes"]
    if (i := _first((cells < 0) | (cells >= config.capacity))) is not None:
        raise TraceError(
            f"frame {_frame_of(a, i)} changes cell {cells[i]}, outside "
            f"[0, capacity={config.capacity})"
        )
    if (i := _first((pos < -1) | (pos >= config.max_seq_len))) is not None:
        raise TraceError(
            f"frame {_frame_of(a, i)} gives cell {cells[i]} position {pos[i]}, outside "
            f"[-1, max_seq_len={config.max_seq_len})"
        )
    if (i := _first((codes < SHARED) | (codes >= config.max_seqs))) is not None:
        raise TraceError(
            f"frame {_frame_of(a, i)} gives cell {cells[i]} owner code {codes[i]}: an owner "
            f"id past max_seqs={config.max_seqs} or no code (an id, FREE -1 or SHARED -2)"
        )
    if (i := _first((pos == -1) != (codes == FREE))) is not None:
        raise TraceError(
            f"frame {_frame_of(a, i)} gives cell {cells[i]} position {pos[i]} and "
            f"{'no' if pos[i] >= 0 else 'some'} owners; a cell is free exactly when unowned"
        )
    if (i := _first((a["toggle_counts"] > 0) & (codes != SHARED))) is not None:
        raise TraceError(
            f"frame {_frame_of(a, i)} changes cell {cells[i]} to code {codes[i]} with toggles; "
            f"only a change to a shared cell (code {SHARED}) has toggles"
        )
    seqs = a["toggle_seqs"]
    if (
        t := _first((seqs >= config.max_seqs) | (seqs < ~np.int32(config.max_seqs - 1)))
    ) is not None:
        i = int(np.searchsorted(np.cumsum(a["toggle_counts"], dtype=np.int64), t, "right"))
        raise TraceError(
            f"frame {_frame_of(a, i)} flips cell {cells[i]}'s owner "
            f"{seqs[t] if seqs[t] >= 0 else ~seqs[t]}: an owner id past max_seqs={config.max_seqs}"
        )


def _check_rows(config: CacheConfig, a: dict[str, np.ndarray]) -> None:
    """Step rows where steps are, 1 to max_width of them, real rows then padding, each a
    live sequence's token in a distinct cell below read_len."""
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
    f, c, s = frame[real], cells[real], seq_ids[real]
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
    span = int(c.max(initial=0)) + 1
    placed = np.sort(f * span + c)  # by frame, then cell
    if (i := _first(placed[1:] == placed[:-1])) is not None:
        frame, cell = divmod(int(placed[i]), span)
        raise TraceError(f"frame {frame}'s step places two tokens in cell {cell}")


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
        return f"an annotation's kind must be {_NAME_RULE}; got {short_repr(kind)}"
    if not isinstance(data, dict):
        return f"an annotation's data must be a dict; got {short_repr(data)}"
    for key, value in data.items():
        if not isinstance(key, str) or not NAME.fullmatch(key):
            return f"{kind} annotation: a data key must be {_NAME_RULE}; got {short_repr(key)}"
        items = value if isinstance(value, list | tuple) else [value]
        bad = [item for item in items if not _is_scalar(item)]
        if bad:
            return (
                f"{kind} annotation: {key}={short_repr(value)} is not JSON-safe "
                f"({short_repr(bad[0])}); "
                "give None, a bool, an int64, a finite float, a str or a list of those"
            )
    return None


def annotation_records(n_frames: int, records: object) -> list[dict]:
    """`records` (parsed JSON) as a trace's annotations: a list of {"frame", "kind", "data"}
    dicts, each frame an int in [0, n_frames), frames non-decreasing, each (kind, data)
    passing `annotation_problem`; TraceError naming the first that does not. Returns
    copies (`plain_data`)."""
    if not isinstance(records, list | tuple):
        raise TraceError(f"a trace's annotations are a list; got {short_repr(records)}")
    out, last = [], 0
    for i, record in enumerate(records):
        if not isinstance(record, dict) or record.keys() != {"frame", "kind", "data"}:
            raise TraceError(f"annotation {i} is not {{frame, kind, data}}: {short_repr(record)}")
        frame = record["frame"]
        if isinstance(frame, bool) or not isinstance(frame, int) or not 0 <= frame < n_frames:
            raise TraceError(
                f"annotation {i} follows frame {short_repr(frame)}, outside "
                f"[0, n_frames={n_frames})"
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
