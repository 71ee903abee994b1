"""The invariants a trace's arrays must hold, so that every accessor of a `Trace` that
loaded (replay, `step(f).mask(w)`, metrics, timeline) works (numba-free).

They are the cell table's (docs/contract.md §2) read off the recorded changes: ranges
vectorized over the changes, the rest in one replay of the table that checks each frame's
changes against the table before them. Annotations (events a
caller attached to the trace, `Recorder.annotate`) are held to their own rules:
`annotation_problem` for one, `annotation_records` for a trace's list of them.
"""

import math
import re

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import TraceError
from numbakv.core.snapshot import FREE, SHARED
from numbakv.core.values import short_repr
from numbakv.trace.file import ARRAYS, FRAME_EVENTS, STEP_EVENT
from numbakv.trace.scan import TableReplay, id_bits, owner_bits


def check_arrays(config: CacheConfig, a: dict[str, np.ndarray]) -> None:
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

    The arrays are read in place: one replay of the table, frame by frame, O(changes +
    frames * max_seqs) time and O(cells * words) memory.
    """
    _check_layout(config, a)
    _check_values(config, a)
    _check_rows(config, a)
    _Replay(config, a).run()


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


class _Replay:
    """The table replayed frame by frame, each frame's changes checked against the table
    before them (`scan.TableReplay`), with each id's owned cells counted."""

    def __init__(self, config: CacheConfig, a: dict[str, np.ndarray]):
        self.config, self.a = config, a
        self.table = TableReplay(a, int(a["read_len"].max(initial=0)) + 1, config.n_owner_words)
        self.codes = np.full(len(self.table.pos), FREE, dtype=np.int32)
        self.owned = np.zeros(config.max_seqs, dtype=np.int64)  # cells each id owns
        self.steps = a["step_offsets"]

    def run(self) -> None:
        n_cells = len(self.table.pos) - 1
        for f in range(len(self.a["events"])):
            cells = self.table.changes(f)[0]
            if len(cells) and cells[-1] >= n_cells:  # past every read_len: never in bounds
                raise TraceError(
                    f"cell {cells[-1]} is occupied from frame {f} while read_len drops to "
                    f"{self.a['read_len'][f]}; every occupied cell lies below read_len"
                )
            self._check_frame(f)
            self._check_extent(f)
            if self.steps[f + 1] > self.steps[f]:
                self._check_step(f)

    def _check_frame(self, f: int) -> None:
        table, codes, a = self.table, self.codes, self.a
        cells, pos, new = table.changes(f)
        if (i := _first(cells[1:] <= cells[:-1])) is not None:
            raise TraceError(f"frame {f} lists cell {cells[i + 1]} out of order or twice")
        rows, ids, gained = table.toggles(f)
        old = codes[cells]
        if (i := _first(np.diff(rows * self.config.max_seqs + ids) <= 0)) is not None:
            raise TraceError(
                f"frame {f} flips an owner of cell {cells[rows[i + 1]]} out of order or twice"
            )
        words, bits = id_bits(ids)
        had = (table.owners[cells[rows], words] & bits) != 0
        if (t := _first(had == gained)) is not None:
            raise TraceError(
                f"frame {f} {'gives' if gained[t] else 'takes'} cell {cells[rows[t]]} owner "
                f"{ids[t]}, which it {'has' if had[t] else 'lacks'} already"
            )
        flipped = np.zeros(len(cells), dtype=bool)
        flipped[rows] = True
        same = (pos == table.pos[cells]) & (new == old) & ~flipped
        if (i := _first(same)) is not None:
            if old[i] == FREE:
                raise TraceError(f"frame {f} frees cell {cells[i]}, which was never occupied")
            raise TraceError(f"frame {f} records cell {cells[i]} changing to the state it had")
        plain, n_ids = new != SHARED, self.config.max_seqs  # a plain change sets all owners
        self.owned -= np.bincount(old[plain & (old >= 0)], minlength=n_ids)
        self.owned -= _id_counts(table.owners[cells[plain & (old == SHARED)]], n_ids)
        self.owned += np.bincount(new[plain & (new >= 0)], minlength=n_ids)
        self.owned += np.bincount(ids, np.where(gained, 1, -1), n_ids).astype(np.int64)
        table.apply(f)
        codes[cells] = new
        self._check_shared(f, cells[~plain])
        dead = (self.owned > 0) & ~a["live"][f]
        if (s := _first(dead)) is not None:
            word, bit = s // 64, np.uint64(1) << np.uint64(s % 64)
            cell = _first(table.owners[:, word] & bit)
            raise TraceError(
                f"cell {cell} is owned by sequence {s} at frame {f} while that sequence is not live"
            )

    def _check_shared(self, f: int, cells: np.ndarray) -> None:
        """The toggles leave each of `cells` (changed to SHARED) several owners."""
        counts = np.bitwise_count(self.table.owners[cells]).sum(axis=1)
        if (i := _first(counts < 2)) is not None:
            raise TraceError(
                f"frame {f}'s toggles leave cell {cells[i]} {counts[i]} owners; its code "
                f"{SHARED} says several"
            )

    def _check_extent(self, f: int) -> None:
        """Every occupied cell lies below read_len, and the one just below is occupied."""
        read_len, pos = self.a["read_len"], self.table.pos
        cells, new_pos, _ = self.table.changes(f)
        before = read_len[f - 1] if f else 0
        occupied = np.concatenate(
            [cells[new_pos >= 0], np.flatnonzero(pos[read_len[f] : before] >= 0) + read_len[f]]
        )
        if (i := _first(occupied >= read_len[f])) is not None:
            raise TraceError(
                f"cell {occupied[i]} is occupied from frame {f} while read_len drops to "
                f"{read_len[f]}; every occupied cell lies below read_len"
            )
        if read_len[f] > 0 and pos[read_len[f] - 1] < 0:
            raise TraceError(
                f"frame {f}'s read_len {read_len[f]} is not trimmed: cell {read_len[f] - 1} is free"
            )

    def _check_step(self, f: int) -> None:
        """Each real row's cell holds the token's position and its sequence alone."""
        a, rows = self.a, slice(self.steps[f], self.steps[f + 1])
        seqs = a["step_seq_ids"][rows]
        real = seqs >= 0
        c, p, s = a["step_cells"][rows][real], a["step_positions"][rows][real], seqs[real]
        held_pos, held = self.table.pos[c], self.codes[c]
        if (i := _first((held_pos != p) | (held != s))) is not None:
            raise TraceError(
                f"frame {f}'s step puts sequence {s[i]} position {p[i]} in cell {c[i]}, but "
                f"the table holds position {held_pos[i]} there, or other owners"
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
    order = np.lexsort((c, f))
    if (i := _first((np.diff(f[order]) == 0) & (np.diff(c[order]) == 0))) is not None:
        raise TraceError(f"frame {f[order[i]]}'s step places two tokens in cell {c[order[i]]}")


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


def _id_counts(owners: np.ndarray, n_ids: int) -> np.ndarray:
    """[n_ids] int64: how many of the bitsets `owners` ([k, words] uint64) hold each id."""
    return np.bincount(owner_bits(owners)[1], minlength=n_ids)[:n_ids]
