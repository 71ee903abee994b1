"""The data behind every picture: pixels that aggregate what they cover, never samples.

A picture of a 65 536-cell pool over 4 000 steps has far fewer pixels than cell-steps.
Each pixel here covers a block of cells (`cell_bin` per column) over a block of steps
(`step_bin` per row) and keeps what all of them hold: the fraction occupied, the fraction
shared, and the owner holding the majority of the occupied cell-steps (MIXED when none
does; CACHED when the prefix cache's holders alone hold them, `numbakv.viz.holders`). A
mask pixel keeps how many of its (token, cell) pairs are attended, so one attended cell
among thousands still lights its pixel.
"""

from dataclasses import dataclass

import numpy as np

from numbakv.core.snapshot import FREE, SHARED
from numbakv.trace import TraceStep
from numbakv.trace.frames import Trace
from numbakv.trace.free_runs import radix_keys, run_starts
from numbakv.trace.scan import blocks, owner_bits

from .holders import CACHED, cell_changes, change_index
from .owners import MIXED, Owners

PAIRS_PER_BLOCK = 1 << 22  # a recorded mask's (token, cell) pairs enumerated at a time
STRETCHES_AT_ONCE = 1 << 20  # changes a range of owner pixels' columns is summed over at a time
MOVES_AT_ONCE = 1 << 16  # (step, id) group changes `_group_moves` counts at a time


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
    running sequences leave it to them. Each change holds its cell's code over a stretch
    of steps (`_Held`); what a pixel holds is a sum over the stretches of a column
    (`_Integrals`), and its majority, if any, the label whose every bit is its pixel's
    majority bit: O(changes log changes + pixels * label bits), never a [steps, cells]
    array. The columns are summed a range at a time, each over at most STRETCHES_AT_ONCE
    changes or one column, so the memory the stretches take is bounded at any length.
    `progress(done, total)`, when given, hears the steps drawn done (all at once)."""
    cell_edges, step_edges = edges(*cells, cell_bin), edges(*steps, step_bin)
    held = _Held(trace, owners, cells, steps, cell_bin)
    none = np.zeros((len(step_edges) - 1, 0))  # the pixels of no column: an empty range's
    parts = [(none, none, none.astype(np.int64))]
    parts += [_range_pixels(held, columns, step_edges, step_bin) for columns in held.ranges]
    total, shared, label = (np.concatenate(x, axis=1) for x in zip(*parts, strict=True))
    if progress is not None:
        progress(steps[1] - steps[0], steps[1] - steps[0])
    area = np.outer(np.diff(step_edges), np.diff(cell_edges))
    return OwnerPixels(cell_edges, step_edges, total / area, shared / area, label)


def _range_pixels(held: "_Held", columns: slice, step_edges, step_bin: int) -> tuple:
    """([rows, cols] float64 cell-steps held, of them shared, [rows, cols] int64 label) of
    the pixel `columns` of `held`."""
    n_groups = held.n_groups  # labels: the groups, then SHARED, then CACHED
    cols, labels, starts, ends = held.stretches(columns)
    shape = (columns.stop - columns.start, n_groups + 2)
    sums = _Integrals(cols * shape[1] + labels, starts, ends, shape, step_edges, step_bin)
    total, shared = sums.of(np.ones_like(sums.labels)), sums.of(sums.labels == n_groups)
    label = _named(_majority_labels(sums, total), n_groups)
    label[total == 0] = FREE
    return total, shared, label


class _Integrals:
    """Sums per pixel over stretches of steps during which a cell of a column holds a
    label: [k] `group` (column * n_labels + label) and [k] [starts, ends) each, `shape`
    (n_cols, n_labels), pixel rows `step_bin` steps each between `step_edges`. The
    stretches' bounds are events changing how many cells a group holds; a pixel's sum is
    the integral of that count over its row, from the events before each row edge: their
    count (the slope) and minus their count times their step (the intercept). The events
    are merged per (group, the first row edge past them), `keys` = group << edge_bits |
    that edge, ascending, so each sum costs the groups a row meets, not the steps."""

    def __init__(self, group, starts, ends, shape: tuple[int, int], step_edges, step_bin: int):
        n_edges = len(step_edges)
        # every step is at most the last end: the trace's steps, whatever the edges' range
        self.edge_bits, time_bits = n_edges.bit_length(), int(ends.max(initial=0)).bit_length()
        # keys of (group, step, is a start) in bits: shifts, not divisions, split them
        keys = np.concatenate([(group << time_bits | starts) << 1 | 1,
                               (group << time_bits | ends) << 1])  # fmt: skip
        keys.sort()
        signs = np.where(keys & 1, 1.0, -1.0)  # +1 a start, -1 an end
        keys >>= 1  # in place from here on: the events are the largest arrays of a picture
        times = keys & ((1 << time_bits) - 1)
        keys >>= time_bits
        keys <<= self.edge_bits
        edge = times - step_edges[0]  # the first row edge past each event
        edge //= step_bin
        edge += 1
        keys |= np.minimum(edge, n_edges, out=edge)
        del edge
        first = run_starts(keys)  # where each (group, edge) starts
        self.keys, self.counts = keys[first], np.add.reduceat(signs, first)
        np.negative(signs, out=signs)
        signs *= times
        self.spent = np.add.reduceat(signs, first)  # minus each event's sign times its step
        (self.n_cols, self.n_labels), self.edges = shape, step_edges
        groups = self.keys >> self.edge_bits
        self.labels = groups % self.n_labels
        edge = self.keys & ((1 << self.edge_bits) - 1)
        self.bins = edge * self.n_cols + groups // self.n_labels  # [edge, column]

    def of(self, weights: np.ndarray) -> np.ndarray:
        """[rows, cols] float64: per pixel, the cell-steps of the stretches whose label has
        `weights` 1 ([m] per entry of `keys`, 0 or 1): the integral over its row of the
        count, from its slope and intercept at each row edge."""
        n_edges, size = len(self.edges), (len(self.edges) + 1) * self.n_cols
        slope = np.bincount(self.bins, self.counts * weights, size)
        intercept = np.bincount(self.bins, self.spent * weights, size)
        slope, intercept = (np.cumsum(x.reshape(-1, self.n_cols)[:n_edges], axis=0)
                            for x in (slope, intercept))  # fmt: skip
        return np.diff(slope * self.edges[:, None] + intercept, axis=0)

    def held(self, labels: np.ndarray) -> np.ndarray:
        """[rows, cols] float64: per pixel, the cell-steps that its label of `labels` ([rows,
        cols] ints) holds, from the entries of that (column, label) before its row's edges
        (the groups' before add no slope, and an intercept its two edges cancel)."""
        n_edges = len(self.edges)
        slope = np.append(0, np.cumsum(self.counts))
        intercept = np.append(0, np.cumsum(self.spent))
        edge = np.arange(n_edges)[:, None]  # the entries at edges <= e: the events before it
        group = (np.arange(labels.shape[1]) * self.n_labels + labels) << self.edge_bits
        upper, lower = (np.searchsorted(self.keys, group + e + 1) for e in (edge[1:], edge[:-1]))
        ends = self.edges[1:, None], self.edges[:-1, None]
        return slope[upper] * ends[0] - slope[lower] * ends[1] + intercept[upper] - intercept[lower]


def _majority_labels(sums: "_Integrals", total: np.ndarray) -> np.ndarray:
    """[rows, cols] int64: per pixel, the label holding more than half of its `total`
    ([rows, cols]) cell-steps, MIXED where none does. Such a label has each of its bits
    where more than half of the cell-steps do, so it is that label, if it holds them."""
    best = np.zeros(total.shape, dtype=np.int64)
    for bit in range(int(sums.n_labels - 1).bit_length()):
        best |= (2 * sums.of((sums.labels >> bit) & 1) > total).astype(np.int64) << bit
    real = best < sums.n_labels  # bits of no label: no majority
    held = sums.held(np.where(real, best, 0))
    return np.where(real & (2 * held > total), best, MIXED)


def _counted(codes: np.ndarray, group: np.ndarray, n_groups: int) -> np.ndarray:
    """Labels counted per pixel of cells' `codes` (an id, SHARED or CACHED) and their id's
    `group` where they have one: the group, n_groups for SHARED, n_groups + 1 for CACHED
    (`_named` turns them back)."""
    return np.where(codes >= 0, group, np.where(codes == SHARED, n_groups, n_groups + 1))


def _named(label: np.ndarray, n_groups: int) -> np.ndarray:
    """Pixel labels (a group, MIXED, SHARED, CACHED) from labels counted as a group below
    `n_groups`, n_groups for SHARED, n_groups + 1 for CACHED (or MIXED)."""
    return np.select([label == n_groups, label == n_groups + 1], [SHARED, CACHED], label)


class _Held:
    """The stretches of steps [start, end) within `steps` during which a cell of `cells`
    holds one visible code (`cell_changes`), cut where an id's group changes, a range of
    columns of `cell_bin` cells at a time (`stretches`): `ranges`, each of at most
    STRETCHES_AT_ONCE changes or one column. Made once: the changes occupying those
    cells (by column when there are several ranges), and where the groups change."""

    def __init__(self, trace: Trace, owners: Owners, cells: tuple[int, int],
                 steps: tuple[int, int], cell_bin: int):  # fmt: skip
        changes = cell_changes(trace, owners.holders)
        self.index, self.steps = change_index(trace, changes), steps
        self.at, self.codes = changes["delta_cells"], changes["codes"]
        self.clock = np.append(trace.frame_steps, trace.n_steps)  # [n_frames]: after the last
        self.seq_groups, self.step_frames = owners.seq_groups, trace.step_frames
        self.span, self.n_groups = trace.n_steps + 1, len(owners.labels)
        self.moves, self.cuts = _group_moves(owners.seq_groups, trace.step_frames, self.span)
        self.first, self.cell_bin = cells[0], cell_bin
        at = self.at
        held = np.flatnonzero((self.codes != FREE) & (at >= cells[0]) & (at < cells[1]))
        column = (at[held] - cells[0]) // cell_bin
        n_columns = max(-(-(cells[1] - cells[0]) // cell_bin), 0)  # none: a reversed range
        per_column = np.bincount(column, minlength=n_columns)
        self.ranges = list(blocks(per_column, STRETCHES_AT_ONCE))
        if len(self.ranges) > 1:
            held = held[np.argsort(radix_keys(column, n_columns), kind="stable")]
        self.held, self.column_starts = held, np.append(0, np.cumsum(per_column))

    def stretches(self, columns: slice) -> tuple:
        """(column, label, start, end) [k] int64 each: the stretches of the cells of pixel
        `columns`; column: from columns.start; label: the id's group (`Owners.labels`),
        then n_groups for SHARED and n_groups + 1 for CACHED."""
        codes, index, steps = self.codes, self.index, self.steps
        kept = self.held[self.column_starts[columns.start] : self.column_starts[columns.stop]]
        starts = np.maximum(self.clock[index.frames[kept]], steps[0])
        ends = np.minimum(self.clock[index.frame_of(index.following[kept])], steps[1])
        kept, starts, ends = kept[starts < ends], starts[starts < ends], ends[starts < ends]
        codes = codes[kept].astype(np.int64)
        ids = np.maximum(codes, 0)  # SHARED and CACHED are no id's: never cut
        n = np.where(codes >= 0, self.moves[ends - 1, ids] - self.moves[starts, ids] + 1, 1)
        which, starts, ends = _cut(starts, ends, n, self.cuts, ids * self.span)
        codes, groups = codes[which], self.seq_groups[self.step_frames[starts], ids[which]]
        labels = _counted(codes, groups, self.n_groups)
        first = self.first + columns.start * self.cell_bin
        cols = (self.at[kept[which]].astype(np.int64) - first) // self.cell_bin
        return cols, labels.astype(np.int64), starts, ends


def _group_moves(
    seq_groups: np.ndarray, step_frames: np.ndarray, span: int
) -> tuple[np.ndarray, np.ndarray]:
    """([n_steps, max_seqs] int32 how often each id's group changed at steps 1 .. t, [c]
    int64 each change as id * span + step, ascending) of `seq_groups` ([n_frames,
    max_seqs] each id's group) at the `step_frames`: a stretch [s, e) of id i is cut
    moves[e - 1, i] - moves[s, i] times (a gather, not a search), at its changes. A block
    of MOVES_AT_ONCE counts at a time, reading the groups in place (a copy of them at the
    steps would double the memory; a step at a time costs a Python turn each)."""
    moves = np.zeros((len(step_frames), seq_groups.shape[1]), dtype=np.int32)
    changes, rows = [np.zeros(0, dtype=np.int64)], max(MOVES_AT_ONCE // moves.shape[1], 1)
    for t0 in range(1, len(step_frames), rows):
        t1 = min(t0 + rows, len(step_frames))
        changed = seq_groups[step_frames[t0:t1]] != seq_groups[step_frames[t0 - 1 : t1 - 1]]
        np.cumsum(changed, axis=0, dtype=np.int32, out=moves[t0:t1])
        moves[t0:t1] += moves[t0 - 1]
        step, ids = np.nonzero(changed)
        changes.append(ids * span + t0 + step)
    return moves, np.sort(np.concatenate(changes))


def _cut(
    starts: np.ndarray, ends: np.ndarray, n: np.ndarray, cuts: np.ndarray, base: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(which, start, end) [p] int64 each: the stretches [starts, ends) ([k] ints each) cut
    at every value of `cuts` strictly inside them, `n` ([k] ints) pieces each, each piece
    with the index of its stretch (the stretches not cut first). `cuts` is ascending, keyed
    by what they apply to: `base` ([k] ints) is added to a stretch's bounds to look them
    up there."""
    whole, cut = np.flatnonzero(n == 1), np.flatnonzero(n > 1)
    lo, n = np.searchsorted(cuts, base[cut] + starts[cut], side="right"), n[cut]
    which = np.repeat(cut, n)
    k = np.arange(len(which)) - np.repeat(np.cumsum(n) - n, n)  # a piece's place in it
    at = np.repeat(lo, n) + k  # the cut that ends it
    bounds, offset = np.append(cuts, 0), base[which]
    piece_starts = np.where(k == 0, starts[which], bounds[at - 1] - offset)
    piece_ends = np.where(at == np.repeat(lo + n - 1, n), ends[which], bounds[at] - offset)
    return (np.concatenate([whole, which]), np.concatenate([starts[whole], piece_starts]),
            np.concatenate([ends[whole], piece_ends]))  # fmt: skip


def _majority(
    pixel: np.ndarray, label: np.ndarray, sums: np.ndarray, area: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(occupied, shared, label) [n_pixels] of pixels of `area` ([n_pixels] int64
    cell-steps each) from the cell-steps `sums` each (pixel, label) holds ([k] int64 each,
    distinct pairs; label: a group below `n_groups`, n_groups for SHARED, n_groups + 1 for
    CACHED): the label holding more than half of the occupied cell-steps, MIXED when none
    does, FREE when none is occupied."""
    total = np.bincount(pixel, sums, len(area))
    best = np.zeros(len(area), dtype=np.int64)
    np.maximum.at(best, pixel, sums)
    won = (sums == best[pixel]) & (2 * sums > total[pixel])
    out = np.full(len(area), MIXED, dtype=np.int64)
    out[pixel[won]] = _named(label[won], n_groups)
    out[total == 0] = FREE
    shared = np.bincount(pixel[label == n_groups], sums[label == n_groups], len(area))
    return total / area, shared / area, out


def table_pixels(
    codes: np.ndarray, seq_groups: np.ndarray, cells: tuple[int, int], cell_bin: int
) -> OwnerPixels:
    """One row of owner pixels of one table: `codes` [read_len] int32 (ids, FREE, SHARED,
    CACHED), `seq_groups` [max_seqs] each id's group, over cells [cells[0], cells[1])."""
    cell_edges = edges(*cells, cell_bin)
    inside = np.arange(cells[0], min(cells[1], len(codes)))
    code = codes[inside].astype(np.int64)
    held = code != FREE
    n_labels = int(seq_groups.max(initial=0)) + 3
    label = _counted(code, seq_groups[np.maximum(code, 0)], n_labels - 2)[held]
    key = (inside[held] - cells[0]) // cell_bin * n_labels + label
    key, sums = np.unique(key, return_counts=True)
    pixel, label = key // n_labels, key % n_labels
    occupied, shared, label = _majority(pixel, label, sums, np.diff(cell_edges), n_labels - 2)
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
    for tokens in blocks(counts, PAIRS_PER_BLOCK):
        n = counts[tokens]
        pairs = np.arange(n.sum()) + np.repeat(first[tokens] - (np.cumsum(n) - n), n)
        rows = np.repeat(np.arange(step.width)[tokens] // token_bin, n)
        attended += np.bincount(rows * shape[1] + cols[pairs], minlength=attended.size)
    return attended.reshape(shape)
