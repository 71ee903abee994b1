"""`Segments`: each sequence's cells in position order, as segments of one int32 arena.

Sequence s owns arena[off[s] : off[s] + cap[s]] and holds its cells for positions
0 .. len[s]-1 in the first len[s] words. Appending costs O(1) amortised: a segment that
fills up moves to the arena's top with double the room (its old words become garbage),
and an arena without room at the top is compacted into a new one at least twice the
size still held.

    seg  : [4, max_seqs] int64, rows OFF, CAP, LEN and NEW (`reserve_room`'s count of each
           id's new cells, zero between calls)
    meta : [2] int64, TOP (first unused word) and GARBAGE (words of abandoned segments)

The arrays are few on purpose: each array an njit call takes costs its dispatch time.
"""

import numbakv.cache.device  # noqa: F401, I001  (sets numba's simulator flag before numba is imported)

import numba
import numpy as np

OFF, CAP, LEN, NEW = 0, 1, 2, 3  # rows of `seg`
TOP, GARBAGE = 0, 1  # slots of `meta`
MIN_SEGMENT = 16  # words a sequence's segment holds at least once it holds any


class Segments:
    """Per sequence id, a segment of cells in position order (0 words for a free id)."""

    def __init__(self, max_seqs: int, meta: np.ndarray | None = None):
        """meta: where to keep TOP and GARBAGE, a [2] int64 view of the owner's own counters
        (so that the owner's kernels take one array for both), default a new array."""
        self.seg = np.zeros((4, max_seqs), dtype=np.int64)
        self.meta = np.zeros(2, dtype=np.int64) if meta is None else meta
        self.arena = np.empty(MIN_SEGMENT * max(4, max_seqs), dtype=np.int32)  # grows

    def length(self, seq: int) -> int:
        return int(self.seg[LEN, seq])

    def cells(self, seq: int, start: int = 0) -> np.ndarray:
        """[length - start] int32, a copy: `seq`'s cells at positions [start, length)."""
        off = self.seg[OFF, seq]
        return self.arena[off + start : off + self.seg[LEN, seq]].copy()

    def open(self, seq: int, room: int) -> None:
        """Gives free id `seq` an empty segment of at least `room` words."""
        cap = max(MIN_SEGMENT, room)
        if self.meta[TOP] + cap > len(self.arena):
            self._compact(cap)
        self.seg[:, seq] = (self.meta[TOP], cap, 0, 0)
        self.meta[TOP] += cap

    def open_prefix(self, seq: int, src: int, upto: int) -> np.ndarray:
        """Opens free id `seq` holding `src`'s first `upto` cells; returns them ([upto] int32)."""
        self.open(seq, 2 * upto)  # may compact: read src's segment after
        src_off, off = self.seg[OFF, src], self.seg[OFF, seq]
        shared = self.arena[src_off : src_off + upto].copy()
        self.arena[off : off + upto] = shared
        self.seg[LEN, seq] = upto
        return shared

    def close(self, seq: int) -> None:
        """Abandons `seq`'s segment."""
        self.meta[GARBAGE] += self.seg[CAP, seq]
        self.seg[:, seq] = 0

    def truncate(self, seq: int, length: int) -> None:
        self.seg[LEN, seq] = length

    def reserve(self, seq_ids: np.ndarray) -> None:
        """Makes room to append one cell per entry of `seq_ids` ([n] int32 open ids)."""
        while short := reserve_room(self.arena, self.seg, self.meta, seq_ids):
            self._compact(short)

    def is_consistent(self, is_open: np.ndarray) -> bool:
        """Whether only ids of `is_open` ([max_seqs] bool) have segments (a new one gets its
        segment with its first cell), each within its room, disjoint, below the top, every
        NEW count zero, and top = held + garbage (for checks)."""
        off, cap, n, new = self.seg
        top, garbage = self.meta
        held = cap > 0
        order = np.argsort(off[held])
        starts, ends = off[held][order], (off + cap)[held][order]
        return bool(
            not cap[~is_open].any()
            and not new.any()
            and (n <= cap).all()
            and (starts[1:] >= ends[:-1]).all()
            and (ends <= top).all()
            and top == cap.sum() + garbage <= len(self.arena)
        )

    def clear(self) -> None:
        self.seg.fill(0)
        self.meta.fill(0)

    def _compact(self, short: int) -> None:
        """Moves the open segments to the start of a new arena with `short` words spare.

        The new arena holds at least twice what is held, so compactions are O(1) amortised
        per appended cell.
        """
        held = int(self.meta[TOP] - self.meta[GARBAGE])
        arena = np.empty(max(len(self.arena), 2 * (held + short)), dtype=np.int32)
        self.meta[TOP] = _pack(self.arena, arena, self.seg)
        self.meta[GARBAGE] = 0
        self.arena = arena


@numba.njit(cache=True)
def append(arena, seg, seq, cell):
    """Appends `cell` to `seq`'s segment, which has room (`Segments.reserve`)."""
    arena[seg[OFF, seq] + seg[LEN, seq]] = cell
    seg[LEN, seq] += 1


@numba.njit(cache=True)
def reserve_room(arena, seg, meta, seq_ids):
    """Moves each segment too small for its new cells to the arena's top, doubled.

    Returns 0 when every sequence in seq_ids has room, else the arena words still missing
    (the caller compacts and calls again; moves already made are kept).
    """
    for s in seq_ids:
        seg[NEW, s] += 1
    short = 0
    for s in seq_ids:
        k = seg[NEW, s]  # the new cells of s; 0 once s is handled
        seg[NEW, s] = 0
        off, n = seg[OFF, s], seg[LEN, s]
        if n + k <= seg[CAP, s]:
            continue
        cap = max(2 * seg[CAP, s], n + k, MIN_SEGMENT)
        top = meta[TOP]
        if short or top + cap > len(arena):
            short += cap
            continue
        arena[top : top + n] = arena[off : off + n]
        meta[GARBAGE] += seg[CAP, s]
        seg[OFF, s], seg[CAP, s] = top, cap
        meta[TOP] = top + cap
    return short


@numba.njit(cache=True)
def _pack(arena, new_arena, seg):
    """Copies every open segment (cap > 0) to the start of new_arena, in id order; returns
    the new top."""
    top = 0
    for s in range(seg.shape[1]):
        off, cap, n = seg[OFF, s], seg[CAP, s], seg[LEN, s]
        if cap > 0:
            new_arena[top : top + n] = arena[off : off + n]
            seg[OFF, s] = top
            top += cap
    return top
