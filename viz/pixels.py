"""The data behind every picture: pixels that aggregate what they cover, never samples.

A picture of a 65 536-cell pool over 4 000 steps has far fewer pixels than cell-steps.
Each pixel here covers a block of cells (`cell_bin` per column) over a block of steps
(`step_bin` per row) and keeps what all of them hold: the fraction occupied, the fraction
shared, and the owner holding the majority of the occupied cell-steps (MIXED when none
does; CACHED when the prefix cache's holders alone hold them, `numbakv.viz.holders`). A
mask pixel keeps how many of its (token, cell) pairs are attended, so one attended cell
among thousands still lights its pixel.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from numbakv.core.snapshot import FREE, SHARED
from numbakv.trace import TraceStep
from numbakv.trace.frames import Trace
from numbakv.trace.scan import owner_bits, replay_codes

from .holders import CACHED, cell_changes
from .owners import MIXED, Owners

PAIRS_PER_BLOCK = 1 << 22  # a recorded mask's (token, cell) pairs enumerated at a time


@dataclass(frozen=True)
class OwnerPixels:
    """[rows, cols] pixels of owners over cells (columns) and steps (rows).

    cell_edges : [cols + 1] int64, column j covers cells [cell_edges[j], cell_edges[j + 1])
    step_edges : [rows + 1] int64, row i covers recorded steps [step_edges[i], step_edges[i+1])
    occupied   : [rows, cols] float64, fraction of the pixel's cell-steps occupied
    shared     : [rows, cols] float64, fraction of them shared (held by several running
                 sequences: holders of the prefix cache left out, `numbakv.viz.holders`)
    label      : [rows, cols] int64, the owner group (`Owners.labels`), SHARED or CACHED
                 (held by holders of the prefix cache alone) holding more than half of the
                 occupied cell-steps; MIXED when none does; FREE when none is occupied
    """

    cell_edges: np.ndarray
    step_edges: np.ndarray
    occupied: np.ndarray
    shared: np.ndarray
    label: np.ndarray


def edges(lo: int, hi: int, size: int) -> np.ndarray:
    """[n + 1] int64 bounds of blocks of `size` covering [lo, hi) (the last may be short)."""
    return (
        np.append(np.arange(lo, hi, size, dtype=np.int64), np.int64(hi))
        if hi > lo
        else (np.array([lo], dtype=np.int64))
    )


def owner_pixels(
    trace: Trace,
    owners: Owners,
    cells: tuple[int, int],
    steps: tuple[int, int],
    cell_bin: int,
    step_bin: int,
    progress=None,
) -> OwnerPixels:
    """Owner pixels of cells [cells[0], cells[1]) at recorded steps [steps[0], steps[1]),
    `cell_bin` cells per column and `step_bin` steps per row. Cells past a step's read_len
    are free; a cell only `owners.holders` hold is CACHED, and holders sharing a cell with
    running sequences leave it to them. One replay of the trace up to the last step drawn,
    O(changes + rows * cols * ids used): never a [steps, cells] array. `progress(done,
    total)`, when given, hears how many of the steps drawn are done, now and then."""
    cell_edges, step_edges = edges(*cells, cell_bin), edges(*steps, step_bin)
    n_cols = len(cell_edges) - 1
    changes = cell_changes(trace, owners.holders)
    new_codes = changes["codes"]
    ids = np.unique(new_codes)
    ids = ids[ids >= 0]  # only ids that ever hold a cell alone get counts: O(ids used)
    slot_of = np.full(trace.config.max_seqs - CACHED, len(ids), dtype=np.int64)  # code: slot
    slot_of[ids], slot_of[FREE], slot_of[CACHED] = np.arange(len(ids)), -1, len(ids) + 1
    # FREE, SHARED and CACHED index from the end, so free (-1) and the shared (len(ids)) and
    # cached (len(ids) + 1) slots need no branch
    groups = owners.seq_groups[:, ids]
    rows = _Rows(cell_edges, step_edges, len(ids), groups)
    column = np.full(max(cells[1], 1), n_cols, dtype=np.int64)  # each cell's column; n_cols: out
    column[cells[0] : cells[1]] = (np.arange(cells[0], cells[1]) - cells[0]) // cell_bin
    slot = np.full(max(cells[1], 1), -1, dtype=np.int64)  # each cell's owner's slot, -1 free
    clock = trace.frame_steps  # a frame's changes hold from the step it leads into on
    n_cells = int(trace.arrays["read_len"].max(initial=0))
    for f, codes, changed in replay_codes(changes, n_cells, new_codes):
        t = int(clock[f])
        if t >= steps[1]:
            break
        rows.advance(t)
        if f > 0 and (moved := np.flatnonzero(groups[f] != groups[f - 1])).size:
            rows.rebind(moved, f)
        inside = changed[changed < cells[1]]
        if inside.size:
            new, old = slot_of[codes[inside]], slot[inside]
            rows.change(column[inside][old >= 0], old[old >= 0], -1)
            rows.change(column[inside][new >= 0], new[new >= 0], 1)
            slot[inside] = new
        if progress is not None and f % 256 == 0:
            progress(max(t - steps[0], 0), steps[1] - steps[0])
    rows.advance(steps[1])
    if progress is not None:
        progress(steps[1] - steps[0], steps[1] - steps[0])
    return OwnerPixels(cell_edges, step_edges, rows.occupied, rows.shared, rows.label)


class _Rows:
    """The rows of owner pixels as the replay reaches them. Counts per (column, id) are
    summed over steps lazily: an entry adds its count times the steps it held it only when
    it changes or its row ends (O(changes), not O(steps * columns * ids))."""

    def __init__(self, cell_edges, step_edges, n_ids: int, seq_groups: np.ndarray):
        n_cols, n_rows = len(cell_edges) - 1, len(step_edges) - 1
        self.cell_edges, self.step_edges, self.seq_groups = cell_edges, step_edges, seq_groups
        self.occupied, self.shared = np.zeros((n_rows, n_cols)), np.zeros((n_rows, n_cols))
        self.label = np.full((n_rows, n_cols), FREE, dtype=np.int64)
        # column (, out) x slot (, shared, cached)
        self.now = np.zeros((n_cols + 1, n_ids + 2), dtype=np.int64)
        self.summed = np.zeros_like(self.now)  # cell-steps so far in the current row
        self.since = np.full(self.now.shape, step_edges[0], dtype=np.int64)
        self.retired: list[tuple[int, np.ndarray]] = []  # (group, counts) of ids rebound
        self.row, self.t = 0, int(step_edges[0])
        self.groups = seq_groups[0]  # each id's group now

    def advance(self, t: int) -> None:
        """Moves the clock to step `t`, finishing every row that ends at or before it."""
        edges = self.step_edges
        while self.row < len(edges) - 1 and t >= edges[self.row + 1]:
            end = int(edges[self.row + 1])
            self.summed += self.now * (end - self.since)
            area = np.diff(self.cell_edges) * (end - edges[self.row])
            self.occupied[self.row], self.shared[self.row], self.label[self.row] = _row(
                self.summed[:-1], self.groups, self.retired, area
            )
            self.summed[:], self.since[:], self.retired, self.row = 0, end, [], self.row + 1
        self.t = max(t, int(edges[0]))

    def change(self, cols: np.ndarray, ids: np.ndarray, by: int) -> None:
        """Entries (cols[i], ids[i]) change by `by` from the current step on."""
        held = self.now[cols, ids] * (self.t - self.since[cols, ids])
        self.summed[cols, ids] += held  # repeated entries: the same value, written once
        self.since[cols, ids] = self.t
        np.add.at(self.now, (cols, ids), by)

    def rebind(self, ids: np.ndarray, frame: int) -> None:
        """Sequence `ids` belong to another group from now on: their cell-steps so far in
        this row stay with the group they had."""
        self.summed[:, ids] += self.now[:, ids] * (self.t - self.since[:, ids])
        self.since[:, ids] = self.t
        self.retired += [
            (int(self.groups[s]), self.summed[:-1, s].copy())
            for s in ids.tolist()
            if self.summed[:, s].any()
        ]
        self.summed[:, ids] = 0
        self.groups = self.seq_groups[frame]


def _row(
    summed: np.ndarray, seq_groups: np.ndarray, retired: list, area: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(occupied, shared, label) [cols] of one row of pixels from its [cols, ids + 2]
    cell-step counts per sequence (then shared, then cached), the sequences' groups, and
    counts of groups whose ids were rebound during the row."""
    if not retired and len(np.unique(seq_groups)) == len(seq_groups):  # a group per id
        group_ids, by_group = seq_groups.astype(np.int64), summed[:, :-2]
    else:  # ids of one group (a request's forks, a reused id) summed into its column
        keys = np.concatenate([seq_groups, [g for g, _ in retired]]).astype(np.int64)
        counts = np.hstack([summed[:, :-2], *[c[:, None] for _, c in retired]])
        group_ids, index = np.unique(keys, return_inverse=True)
        order = np.argsort(index, kind="stable")
        starts = np.flatnonzero(np.diff(index[order], prepend=-1))
        by_group = np.add.reduceat(counts[:, order], starts, axis=1)  # [cols, groups here]
    held = np.hstack([by_group, summed[:, -2:]])  # the last two: shared, cached cell-steps
    total = held.sum(axis=1)
    best = held.argmax(axis=1)
    label = np.append(group_ids, [SHARED, CACHED])[best]
    label[2 * held[np.arange(len(held)), best] <= total] = MIXED
    label[total == 0] = FREE
    return total / area, summed[:, -2] / area, label


def table_pixels(
    codes: np.ndarray, seq_groups: np.ndarray, cells: tuple[int, int], cell_bin: int
) -> OwnerPixels:
    """One row of owner pixels of one table: `codes` [read_len] int32 (ids, FREE, SHARED,
    CACHED), `seq_groups` [max_seqs] each id's group, over cells [cells[0], cells[1])."""
    cell_edges = edges(*cells, cell_bin)
    inside = np.arange(cells[0], min(cells[1], len(codes)))
    code = codes[inside].astype(np.int64)
    ids = np.unique(code[code >= 0])  # a count per id present, not per max_seqs
    special = np.select([code == SHARED, code == CACHED], [len(ids), len(ids) + 1], -1)
    slot = np.where(code >= 0, np.searchsorted(ids, code), special)
    held, width = slot >= 0, len(ids) + 2
    flat = (inside[held] - cells[0]) // cell_bin * width + slot[held]
    summed = np.bincount(flat, minlength=(len(cell_edges) - 1) * width).reshape(-1, width)
    occupied, shared, label = _row(summed, seq_groups[ids], [], np.diff(cell_edges))
    return OwnerPixels(cell_edges, np.array([0, 1]), occupied[None], shared[None], label[None])


@dataclass(frozen=True)
class MaskPixels:
    """[rows, cols] pixels of a step's mask: tokens (rows) by cells (columns).

    token_edges : [rows + 1] int64, row i covers the step's tokens [edges[i], edges[i + 1])
    cell_edges  : [cols + 1] int64, column j covers cells [edges[j], edges[j + 1])
    attended    : [rows, cols] int64, the (token, cell) pairs of the pixel attended
    """

    token_edges: np.ndarray
    cell_edges: np.ndarray
    attended: np.ndarray

    @property
    def pairs(self) -> np.ndarray:
        """[rows, cols] int64: the (token, cell) pairs each pixel covers."""
        return np.outer(np.diff(self.token_edges), np.diff(self.cell_edges))


def mask_pixels(
    step, window: int, cells: tuple[int, int], cell_bin: int, token_bin: int = 1
) -> MaskPixels:
    """Mask pixels of `step` (a live `Step` or a `TraceStep`) under `window` over cells
    [cells[0], cells[1]): the step's own mask (docs/contract.md §3), binned. A live step's
    mask is read from the step; a recorded step's is counted from each token's visible
    slice, so it costs the pairs attended, not width x read_len."""
    token_edges, cell_edges = edges(0, step.width, token_bin), edges(*cells, cell_bin)
    shape = (len(token_edges) - 1, len(cell_edges) - 1)
    if cells[1] <= cells[0]:
        return MaskPixels(token_edges, cell_edges, np.zeros(shape, dtype=np.int64))
    if isinstance(step, TraceStep):
        attended = _attended_pairs(step, window, cells, cell_bin, token_bin, shape)
    else:
        block = np.asarray(step.mask(window))[:, cells[0] : cells[1]].astype(np.int64)
        by_token = np.add.reduceat(block, token_edges[:-1], axis=0)
        attended = np.add.reduceat(by_token, cell_edges[:-1] - cells[0], axis=1)
    return MaskPixels(token_edges, cell_edges, attended)


def _attended_pairs(
    step: TraceStep,
    window: int,
    cells: tuple[int, int],
    cell_bin: int,
    token_bin: int,
    shape: tuple[int, int],
) -> np.ndarray:
    """[rows, cols] int64 attended pairs of a recorded step: the cells of [cells[0],
    cells[1]) a token sees are, in its sequence's position order, one slice."""
    lo, hi = cells
    held, seqs = owner_bits(step.snapshot.owners[lo:hi])  # a free cell has no owner
    # (sequence, position) keys sorted: each sequence's cells in position order
    keys = (seqs << 32) + step.snapshot.pos[lo:hi][held]
    order = np.argsort(keys, kind="stable")
    keys, cols = keys[order], held[order] // cell_bin
    seq, p = step.seq_ids.astype(np.int64), step.positions.astype(np.int64)
    oldest = np.maximum(p - window + 1, 0) if window > 0 else np.zeros_like(p)
    first = np.searchsorted(keys, (seq << 32) + oldest, side="left")
    counts = np.where(seq >= 0, np.searchsorted(keys, (seq << 32) + p, side="right") - first, 0)
    attended = np.zeros(shape[0] * shape[1], dtype=np.int64)
    for tokens in _blocks(counts, PAIRS_PER_BLOCK):
        n = counts[tokens]
        pairs = np.arange(n.sum()) + np.repeat(first[tokens] - (np.cumsum(n) - n), n)
        rows = np.repeat(np.arange(step.width)[tokens] // token_bin, n)
        attended += np.bincount(rows * shape[1] + cols[pairs], minlength=attended.size)
    return attended.reshape(shape)


def _blocks(counts: np.ndarray, limit: int) -> Iterator[slice]:
    """Consecutive slices of `counts` ([n] int64) summing to at most `limit` each (or one
    element)."""
    ends, start = np.cumsum(counts), 0
    while start < len(counts):
        base = ends[start - 1] if start else 0
        stop = max(int(np.searchsorted(ends, base + limit, side="right")), start + 1)
        yield slice(start, stop)
        start = stop
