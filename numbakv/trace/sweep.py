"""The cell table swept frame by frame, keeping only each cell's last change and the owner
bits of the cells it shares (numba-free): what each change of a trace found in the table
before it and what some cells hold after a frame (`sweep`, `Before`), and from those the
cell table's rules read off every change at once (`TableRules`, for
`numbakv.trace.checks`).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import TraceError
from numbakv.core.snapshot import FREE, SHARED
from numbakv.trace.scan import (
    change_frames,
    id_bits,
    owner_bits,
    owner_events,
    table_at,
    toggle_ids,
)

OWNED_AT_ONCE = 1 << 20  # (frame, id) counts `owned_cells` makes at a time: 8 MiB


@dataclass(frozen=True)
class Before:
    """What the changes of a trace's frames [0, end) found in the table before them, and
    what some cells hold after a frame (`sweep`); n: their changes, m: their toggles.

    previous : [n] int64, each change's same-cell change before, -1 for none
    had      : [m] bool, each toggle's bit of its cell's owners before its frame (False: the
               cell lacked the id)
    shared   : [k] int64, the changes to SHARED; `n_owners` [k] int64 how many owners each
               leaves its cell
    ended    : [e] int64, those of them a plain change follows (it takes their owners away);
               `owners` [e, words] uint64 the owners each leaves its cell (a change to
               SHARED followed by another keeps no set: at 1 024 ids a set is 128 bytes)
    step     : [rows] int64, the last change of each step row's cell after its frame
    top      : [end] int64, the last change of cell read_len - 1 after each frame (-1: none)
    drops    : [d] int64, the frames after which a cell in [read_len, the read_len before)
               is occupied
    pos      : [n + 1] int32, each change's position, then -1 (what change -1 leaves);
    codes      `codes` likewise its code, then FREE
    """

    previous: np.ndarray
    had: np.ndarray
    shared: np.ndarray
    n_owners: np.ndarray
    ended: np.ndarray
    owners: np.ndarray
    step: np.ndarray
    top: np.ndarray
    drops: np.ndarray
    pos: np.ndarray
    codes: np.ndarray

    def change_owners(self) -> np.ndarray:
        """[n] int32: how many owners each change leaves its cell."""
        n_owners = (self.codes[:-1] >= 0).astype(np.int32)
        n_owners[self.shared] = self.n_owners
        return n_owners


def sweep(
    arrays: dict[str, np.ndarray], end: int, n_words: int, toggled: np.ndarray, ids: np.ndarray
) -> Before:
    """What the changes of frames [0, end) found before them (`Before`), in two passes over
    those frames: one keeping each cell's last change (`_Lasts`), one keeping the owner
    bits of the cells changed to SHARED (`_SharedBits`). `toggled` and `ids` ([n_toggles]
    int64 each): each toggle's change and id. Each of those frames changes cells below
    every read_len, each once, ascending, and each change's toggles are ascending (what
    the trace checks hold before this)."""
    lasts = _Lasts(arrays, end)
    lasts.run(arrays["read_len"][:end].tolist())
    n = len(lasts.previous)
    codes = np.append(arrays["delta_codes"][:n], FREE)
    m = int(np.searchsorted(toggled, n))  # the toggles of those frames' changes
    bits = _SharedBits(arrays, lasts, codes, n_words, toggled[:m], ids[:m])
    bits.run()
    return Before(lasts.previous, bits.had, bits.shared, bits.n_owners, bits.ended, bits.owners,
                  lasts.step, lasts.top, np.array(lasts.drops, dtype=np.int64), lasts.pos,
                  codes)  # fmt: skip


def owned_cells(
    before: Before, max_seqs: int,
    frames: np.ndarray, toggled: np.ndarray, ids: np.ndarray, gained: np.ndarray,
) -> Iterator[tuple[int, np.ndarray]]:  # fmt: skip
    """(f0, [k, max_seqs] int64) blocks, in order: how many cells each id owns after each
    frame f0 .. f0 + k - 1 of those `before` covers (`sweep`), every change's gains and
    losses (`scan.owner_events`) summed; a block holds OWNED_AT_ONCE counts or one frame.
    `frames`: each change's frame; `toggled`, `ids`, `gained`: each toggle's change, id,
    gain."""
    n, m, end = len(before.previous), len(before.had), len(before.top)
    frames, codes = frames[:n], before.codes[:n]
    events = owner_events(codes, before.previous, toggled[:m], ids[:m], gained[:m],
                          before.ended, before.owners)  # fmt: skip
    events = [(*_by_change(c, i), 1 if g else -1) for i, c, g in events]
    owned, step = np.zeros((1, max_seqs), dtype=np.int64), max(OWNED_AT_ONCE // max_seqs, 1)
    for f0 in range(0, end, step):
        f1 = min(f0 + step, end)
        first, stop = np.searchsorted(frames, [f0, f1])  # the block's changes
        counts = np.zeros((f1 - f0) * max_seqs, dtype=np.int64)
        for changes, who, sign in events:
            lo, hi = np.searchsorted(changes, [first, stop])
            keys = (frames[changes[lo:hi]] - f0) * max_seqs + who[lo:hi]
            counts += sign * np.bincount(keys, minlength=len(counts))
        counts = counts.reshape(-1, max_seqs)
        counts[0] += owned[-1]
        owned = np.cumsum(counts, axis=0, out=counts)
        yield f0, owned


def _by_change(changes: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(changes, ids) of owner events, ordered by change (stably)."""
    if (changes[1:] < changes[:-1]).any():
        order = np.argsort(changes, kind="stable")
        return changes[order], ids[order]
    return changes, ids


class _Lasts:
    """`sweep`'s first pass over frames [0, end): each cell's `last` change so far, and so
    each change's `previous`, each step row's cell's last change after its frame (`step`),
    cell read_len - 1's (`top`) and the frames after which a cell in [read_len, the
    read_len before) is occupied (`drops`)."""

    def __init__(self, a: dict[str, np.ndarray], end: int):
        offsets, steps = a["delta_offsets"][: end + 1], a["step_offsets"][: end + 1]
        n = int(offsets[-1])
        self.bounds = list(zip(pairwise(offsets.tolist()), pairwise(steps.tolist()), strict=True))
        self.cells = a["delta_cells"][:n]
        self.pos = np.append(a["delta_pos"][:n], -1)
        self.step_cells = a["step_cells"][: int(steps[-1])]
        self.last = np.full(int(a["read_len"].max(initial=0)) + 1, -1, dtype=np.int64)
        self.previous, self.step = np.empty(n, np.int64), np.empty(len(self.step_cells), np.int64)
        self.top, self.drops = np.full(end, -1), []

    def run(self, read_len: list[int]) -> None:
        """Every frame in turn, with each frame's read_len."""
        last, cells, previous, step = self.last, self.cells, self.previous, self.step
        for f, ((c0, c1), (r0, r1)) in enumerate(self.bounds):
            previous[c0:c1] = last[cells[c0:c1]]
            last[cells[c0:c1]] = np.arange(c0, c1)
            if r1 > r0:
                step[r0:r1] = last[self.step_cells[r0:r1]]
            now, was = read_len[f], read_len[f - 1] if f else 0
            if now:
                self.top[f] = last[now - 1]
            if now < was and (self.pos[last[now:was]] >= 0).any():
                self.drops.append(f)


class _SharedBits:
    """`sweep`'s second pass: the owner bits of each cell a frame changes to SHARED (`table`
    [cells, words] uint64, `flat` the same in one row), set from the plain change before
    it when not shared before, then flipped by its toggles; what each toggle found
    (`had`), how many owners each change to SHARED (`shared`) leaves (`n_owners`) and the
    bits those a plain change follows (`ended`) leave (`owners`)."""

    def __init__(self, a: dict[str, np.ndarray], lasts: _Lasts, codes: np.ndarray, n_words: int,
                 toggled: np.ndarray, ids: np.ndarray):  # fmt: skip
        cells, n = lasts.cells, len(lasts.previous)
        self.shared = np.flatnonzero(codes[:n] == SHARED)
        plain = lasts.previous[codes[:n] != SHARED]
        self.ended = np.sort(plain[(plain >= 0) & (codes[plain] == SHARED)])
        was = codes[lasts.previous[self.shared]]  # what each change to SHARED found
        fresh = self.shared[was != SHARED]  # shared anew: set from the change before
        words, self.t_bits = id_bits(ids)
        self.t_flat = cells[toggled].astype(np.int64) * n_words + words
        given = fresh[was[was != SHARED] >= 0]  # ... that gave one owner: its bit
        words, self.g_bits = id_bits(codes[lasts.previous[given]])
        self.g_flat = cells[given].astype(np.int64) * n_words + words
        self.f_cells, self.s_cells = cells[fresh], cells[self.shared]
        self.e_cells = cells[self.ended]
        offsets = a["delta_offsets"][: len(lasts.bounds) + 1]
        kinds = (self.shared, toggled, fresh, given, self.ended)
        bounds = [np.searchsorted(k, offsets).tolist() for k in kinds]
        self.bounds = [
            b for b in zip(*(pairwise(x) for x in bounds), strict=True) if b[0][1] > b[0][0]
        ]
        self.table = np.zeros((len(lasts.last), n_words), dtype=np.uint64)
        self.flat = self.table.reshape(-1)
        self.had = np.empty(len(toggled), dtype=bool)
        self.n_owners = np.empty(len(self.shared), dtype=np.int64)
        self.owners = np.empty((len(self.ended), n_words), dtype=np.uint64)

    def run(self) -> None:
        """Every frame that changes a cell to SHARED, in turn."""
        table, flat, t_flat, t_bits = self.table, self.flat, self.t_flat, self.t_bits
        for (s0, s1), (t0, t1), (f0, f1), (g0, g1), (e0, e1) in self.bounds:
            table[self.f_cells[f0:f1]] = 0
            flat[self.g_flat[g0:g1]] = self.g_bits[g0:g1]
            if t1 > t0:
                self.had[t0:t1] = (flat[t_flat[t0:t1]] & t_bits[t0:t1]) != 0
                np.bitwise_xor.at(flat, t_flat[t0:t1], t_bits[t0:t1])
            self.n_owners[s0:s1] = np.bitwise_count(table[self.s_cells[s0:s1]]).sum(axis=1)
            self.owners[e0:e1] = table[self.e_cells[e0:e1]]


class TableRules:
    """The cell table's rules over every change of a trace at once (`a`: the arrays of a
    trace whose layout and values `numbakv.trace.checks` found right), in the order a
    replay frame by frame checks them: the frame's last cell below every read_len, its
    cells ascending, each change's toggles ascending (up to the first frame breaking one
    of those, `sweep` runs), each toggle flipping its bit, each change changing something,
    each shared cell left several owners, owners live, occupied cells below read_len, the
    one just below occupied, each step row's cell holding its token. `rules`: per rule,
    ([k] int64 the frames that break it, ascending; what it says of one of them)."""

    def __init__(self, config: CacheConfig, a: dict[str, np.ndarray]):
        self.config, self.a, self.n_frames = config, a, len(a["events"])
        self.frames = change_frames(a)
        self.toggled = np.repeat(np.arange(len(self.frames)), a["toggle_counts"])
        self.ids, self.gained = toggle_ids(a["toggle_seqs"])
        self.rules = self._ordered()
        words = config.n_owner_words
        self.seen = sweep(a, self._first_frame(), words, self.toggled, self.ids)
        self.rules += [*self._changes(), self._dead(), *self._extent(), self._steps()]

    def _first_frame(self) -> int:
        """The first frame that breaks a rule of `rules`; n_frames when none does."""
        firsts = [int(frames[0]) for frames, _ in self.rules if len(frames)]
        return min([self.n_frames, *firsts])

    def name_first(self) -> None:
        """Raises TraceError for the first frame that breaks a rule, naming its first."""
        f = self._first_frame()
        for frames, say in self.rules:
            if len(frames) and frames[0] == f:
                raise TraceError(say(f))

    def _ordered(self) -> list:
        """A frame's last cell past every read_len; its cells out of order or twice; a
        change's toggles out of order or twice."""
        a, frames, toggled, cells = self.a, self.frames, self.toggled, self.a["delta_cells"]
        last = a["delta_offsets"][1:][np.diff(a["delta_offsets"]) > 0] - 1
        last = last[cells[last] >= a["read_len"].max(initial=0)]
        order = np.flatnonzero((cells[1:] <= cells[:-1]) & (frames[1:] == frames[:-1])) + 1
        key, frame = toggled * self.config.max_seqs + self.ids, frames[toggled]
        twice = np.flatnonzero((key[1:] <= key[:-1]) & (frame[1:] == frame[:-1])) + 1
        return [
            _rule(frames[last], last, lambda f, i: _occupied(a, f, cells[i])),
            _rule(frames[order], order, lambda f, i: (
                f"frame {f} lists cell {cells[i]} out of order or twice")),
            _rule(frame[twice], twice, lambda f, t: (
                f"frame {f} flips an owner of cell {cells[toggled[t]]} out of order or twice")),
        ]  # fmt: skip

    def _changes(self) -> list:
        """A toggle to the bit its cell had; a change to what its cell was; a change to
        SHARED leaving fewer than two owners."""
        seen, cells = self.seen, self.a["delta_cells"]
        n, m = len(seen.previous), len(seen.had)
        ids, gained, toggled, frames = self.ids, self.gained, self.toggled[:m], self.frames[:n]
        had = np.flatnonzero(seen.had == gained[:m])
        was = seen.codes[seen.previous]  # not kept: a message reads it again if it must
        same = (seen.pos[:n] == seen.pos[seen.previous]) & (seen.codes[:n] == was)
        same = np.flatnonzero(same & (self.a["toggle_counts"][:n] == 0))
        few = np.flatnonzero(seen.n_owners < 2)
        return [
            _rule(frames[toggled[had]], had, lambda f, t: (
                f"frame {f} {'gives' if gained[t] else 'takes'} cell {cells[toggled[t]]} "
                f"owner {ids[t]}, which it {'has' if seen.had[t] else 'lacks'} already")),
            _rule(frames[same], same, lambda f, i: (
                f"frame {f} frees cell {cells[i]}, which was never occupied"
                if seen.codes[seen.previous[i]] == FREE
                else f"frame {f} records cell {cells[i]} changing to the state it had")),
            _rule(frames[seen.shared[few]], few, lambda f, k: (
                f"frame {f}'s toggles leave cell {cells[seen.shared[k]]} {seen.n_owners[k]} "
                f"owners; its code {SHARED} says several")),
        ]  # fmt: skip

    def _dead(self) -> tuple:
        """Frames after which a sequence that is not live owns a cell."""
        a, toggles = self.a, (self.frames, self.toggled, self.ids, self.gained)
        dead = [
            f0 + np.flatnonzero(((owned > 0) & ~a["live"][f0 : f0 + len(owned)]).any(axis=1))
            for f0, owned in owned_cells(self.seen, self.config.max_seqs, *toggles)
        ]
        words = self.config.n_owner_words
        return np.concatenate([np.zeros(0, np.int64), *dead]), lambda f: _dead_owner(a, f, words)

    def _extent(self) -> list:
        """An occupied cell at or past read_len (changed, or left where read_len fell);
        read_len not trimmed (cell read_len - 1 free)."""
        a, seen, read_len = self.a, self.seen, self.a["read_len"]
        n, words = len(seen.previous), self.config.n_owner_words
        frames = self.frames[:n]
        past = frames[(seen.pos[:n] >= 0) & (a["delta_cells"][:n] >= read_len[frames])]
        top = np.flatnonzero(read_len[: len(seen.top)] > 0)
        top = top[seen.pos[seen.top[top]] < 0]
        return [
            (np.union1d(past, seen.drops), lambda f: _occupied(a, f, _past(a, f, words))),
            (top, lambda f: (
                f"frame {f}'s read_len {read_len[f]} is not trimmed: cell {read_len[f] - 1} "
                "is free")),
        ]  # fmt: skip

    def _steps(self) -> tuple:
        """A step row whose cell holds another position or owner after its frame."""
        a, seen = self.a, self.seen
        s, p, c = a["step_seq_ids"], a["step_positions"], a["step_cells"]
        rows = np.flatnonzero(s[: len(seen.step)] >= 0)
        held, code = seen.pos[seen.step[rows]], seen.codes[seen.step[rows]]
        wrong = (held != p[rows]) | (code != s[rows])
        rows, held = rows[wrong], dict(zip(rows[wrong].tolist(), held[wrong].tolist(), strict=True))
        frames = np.searchsorted(a["step_offsets"], rows, side="right") - 1
        return _rule(frames, rows, lambda f, r: (
            f"frame {f}'s step puts sequence {s[r]} position {p[r]} in cell {c[r]}, but the "
            f"table holds position {held[r]} there, or other owners"))  # fmt: skip


def _rule(frames: np.ndarray, elements: np.ndarray, say) -> tuple:
    """(frames, say of a frame): a rule broken by `elements` ([k] ints) at `frames` ([k],
    ascending), `say(frame, element)` saying it of a frame's first element."""
    return frames, lambda f: say(f, elements[np.searchsorted(frames, f)])


def _occupied(a: dict[str, np.ndarray], f: int, cell: int) -> str:
    return (
        f"cell {cell} is occupied from frame {f} while read_len drops to {a['read_len'][f]}; "
        "every occupied cell lies below read_len"
    )


def _past(a: dict[str, np.ndarray], f: int, n_words: int) -> int:
    """The first cell occupied after frame f at or past its read_len: of those frame f
    occupies, then of those below the read_len before (`table_at`)."""
    read_len, before = int(a["read_len"][f]), int(a["read_len"][f - 1]) if f else 0
    changes = slice(*a["delta_offsets"][f : f + 2])
    pos = table_at(a, f, int(a["read_len"].max(initial=0)) + 1, n_words)[0]
    occupied = np.concatenate([
        a["delta_cells"][changes][a["delta_pos"][changes] >= 0],
        np.flatnonzero(pos[read_len:before] >= 0) + read_len,
    ])  # fmt: skip
    return int(occupied[occupied >= read_len][0])


def _dead_owner(a: dict[str, np.ndarray], f: int, n_words: int) -> str:
    """Names the lowest id that owns a cell after frame f while not live, and its first
    cell (the table replayed to frame f, `table_at`)."""
    owners = table_at(a, f, int(a["read_len"].max(initial=0)) + 1, n_words)[1]
    held = owner_bits(np.bitwise_or.reduce(owners, axis=0, keepdims=True))[1]  # ids owning
    s = int(held[~a["live"][f][held]].min())
    cell = int(np.flatnonzero(owners[:, s // 64] & (np.uint64(1) << np.uint64(s % 64)))[0])
    return f"cell {cell} is owned by sequence {s} at frame {f} while that sequence is not live"
