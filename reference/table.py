"""The cell table of docs/contract.md §2: per cell a position and an owner bitset, per id a
live flag and its cells in position order."""

import numpy as np

from numbakv.core.calls import check_live, check_position
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError
from numbakv.core.snapshot import Snapshot


class CellTable:
    """Which cell holds which position of which sequences.

    pos      : [capacity] int32, -1 = free
    owners   : [capacity, n_owner_words] uint64, bit `s % 64` of word `s // 64` = sequence s
    n_owners : [capacity] int32, the owner bits set in each cell
    live     : [max_seqs] bool
    lengths  : [max_seqs] int64, positions each sequence holds (pos(seq))
    _cells   : per id an int32 array whose first pos(seq) entries are its cells in position
               order (entry i holds position i); it grows by doubling

    The per-id lists and counts are bookkeeping kept by the verbs so that each costs what
    it touches, not the pool; `check_invariants` recomputes them from `pos` and `owners`.

    Invariant: every cell at or past `read_len` is free, and no cell below `_no_hole_below`
    is free, so every search below stops at `read_len` and starts at `_no_hole_below`.
    """

    def __init__(self, config: CacheConfig):
        self.config = config
        self.pos = np.full(config.capacity, -1, dtype=np.int32)
        self.owners = np.zeros((config.capacity, config.n_owner_words), dtype=np.uint64)
        self.n_owners = np.zeros(config.capacity, dtype=np.int32)
        self.live = np.zeros(config.max_seqs, dtype=bool)
        self.lengths = np.zeros(config.max_seqs, dtype=np.int64)
        self._cells = [_NO_CELLS] * config.max_seqs
        self.read_len = 0
        self.used_cells = 0
        self._no_hole_below = 0
        self._touched: list[np.ndarray] = []

    # -- queries ---------------------------------------------------------------

    def length(self, seq: int) -> int:
        """pos(seq): the positions `seq` holds, which is the position of its next token."""
        return int(self.lengths[seq])

    def cells_of(self, seq: int, start: int = 0) -> np.ndarray:
        """[pos(seq) - start] int32, a copy: `seq`'s cells holding positions start ..
        pos(seq)-1, in position order; O(pos(seq) - start)."""
        return self._cells[seq][start : self.length(seq)].copy()

    @property
    def free_cells(self) -> int:
        return self.config.capacity - self.used_cells

    def check_live(self, seq) -> int:
        """`seq` as an int, or SequenceError when it is not a live id."""
        return check_live(seq, self.live)

    def snapshot(self, rows: int) -> Snapshot:
        return Snapshot(
            pos=self.pos[: self.read_len].copy(),
            owners=self.owners[: self.read_len].copy(),
            live=self.live.copy(),
            read_len=self.read_len,
            capacity=self.config.capacity,
            rows=rows,
        )

    def take_touched(self) -> np.ndarray:
        """[n] int32: every cell whose position or owners a verb or `claim` may have changed
        since the last call (repeats allowed); O(cells touched)."""
        touched = np.concatenate([_NO_CELLS, *self._touched])
        self._touched = []
        return touched

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        seq = self._free_id()
        self.live[seq] = True
        return seq

    def seq_clone(self, src, upto=None) -> int:
        """A new id sharing `src`'s cells of positions below `upto`; O(upto)."""
        src = self.check_live(src)
        n = self.length(src)
        upto = n if upto is None else check_position("upto", upto, n, src)
        seq = self._free_id()
        shared = self.cells_of(src)[:upto]
        word, bit = _bit(seq)
        self.owners[shared, word] |= bit
        self.n_owners[shared] += 1
        self.live[seq] = True
        self.lengths[seq] = upto
        self._cells[seq] = shared
        self._touched.append(shared)
        return seq

    def seq_rm(self, seq) -> None:
        """Releases `seq` and every cell it holds; O(pos(seq))."""
        seq = self.check_live(seq)
        self._drop(self.cells_of(seq), seq)
        self.live[seq] = False
        self.lengths[seq] = 0
        self._cells[seq] = _NO_CELLS

    def rewind(self, seq, position) -> None:
        """Drops `seq`'s positions `position` .. pos(seq)-1; O(pos(seq) - position)."""
        seq = self.check_live(seq)
        position = check_position("position", position, self.length(seq), seq)
        self._drop(self.cells_of(seq, position), seq)
        self.lengths[seq] = position

    def clear(self) -> None:
        self._touched.append(np.arange(self.read_len, dtype=np.int32))
        self.pos[:] = -1
        self.owners[:] = 0
        self.n_owners[:] = 0
        self.live[:] = False
        self.lengths[:] = 0
        self._cells = [_NO_CELLS] * self.config.max_seqs
        self.read_len = self.used_cells = self._no_hole_below = 0

    # -- placement -------------------------------------------------------------

    def positions_of(self, seq_ids: np.ndarray) -> np.ndarray:
        """[n] int32: token i of sequence s gets pos(s) + (earlier tokens of s in seq_ids)."""
        order, first, end = _runs(seq_ids)
        earlier = np.arange(len(order)) - np.repeat(first, end - first)
        positions = np.empty(len(seq_ids), dtype=np.int32)
        positions[order] = self.lengths[seq_ids[order]] + earlier
        return positions

    def find_cells(self, n: int) -> np.ndarray:
        """[n] int32: the n lowest free cells, ascending; holes below read_len come first.

        Claims nothing; O(n) when there are no holes, else O(the cells searched). The
        caller has checked that n cells are free.
        """
        holes = np.zeros(0, dtype=np.int64)
        if n and self.used_cells < self.read_len:
            start = self._no_hole_below
            holes = start + np.flatnonzero(self.pos[start : self.read_len] < 0)[:n]
            self._no_hole_below = int(holes[0])  # a cache of where the search starts
        fresh = np.arange(self.read_len, self.read_len + n - len(holes))
        return np.concatenate([holes, fresh]).astype(np.int32)

    def claim(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Writes position and owner bit of each placed token into its (free, distinct) cell;
        each sequence then holds one past its last placed position. O(len(cells))."""
        if len(cells) == 0:
            return
        words, bits = _bits(seq_ids)
        self.pos[cells] = positions
        self.owners[cells, words] |= bits
        self.n_owners[cells] = 1
        order, first, end = _runs(seq_ids)
        for lo, hi in zip(first.tolist(), end.tolist(), strict=True):  # one pass per sequence
            mine = order[lo:hi]
            at = positions[mine]
            self._cells_to_hold(int(seq_ids[mine[0]]), int(at.max()) + 1)[at] = cells[mine]
        np.maximum.at(self.lengths, seq_ids, positions.astype(np.int64) + 1)
        self.used_cells += len(cells)
        self.read_len = max(self.read_len, int(cells.max()) + 1)
        self._touched.append(np.asarray(cells, dtype=np.int32))

    # -- invariants ------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raises AssertionError naming the first invariant of docs/contract.md §2 that does
        not hold, or the first piece of bookkeeping that disagrees with the cells.

        Each live sequence holds exactly the positions 0 .. pos-1, once each; a cell has a
        position exactly when it has an owner, and every owner is live; every occupied cell
        lies below read_len, and the cell just below it is occupied; used + free = capacity.
        """
        occupied = self.pos >= 0
        owned = self.owners.any(axis=1)
        _require(np.array_equal(occupied, owned), "a cell's position and owners disagree")
        _require(not occupied[self.read_len :].any(), "an occupied cell at or past read_len")
        _require(self.read_len == 0 or occupied[self.read_len - 1], "read_len is not trimmed")
        _require(int(occupied.sum()) == self.used_cells, "used_cells is not kept")
        _require(occupied[: self._no_hole_below].all(), "a free cell below _no_hole_below")
        counts = np.zeros(self.config.capacity, dtype=np.int32)
        for seq in range(self.config.max_seqs):
            word, bit = _bit(seq)
            held = np.flatnonzero(self.owners[:, word] & bit)
            counts[held] += 1
            if not self.live[seq]:
                _require(len(held) == 0, f"sequence {seq} owns cells but is not live")
            _require(
                np.array_equal(np.sort(self.pos[held]), np.arange(len(held))),
                f"sequence {seq} does not hold positions 0..{len(held) - 1} once each",
            )
            _require(self.lengths[seq] == len(held), f"sequence {seq}'s length is not kept")
            in_order = held[np.argsort(self.pos[held])]
            _require(
                np.array_equal(self.cells_of(seq), in_order), f"sequence {seq}'s cells are not kept"
            )
        _require(np.array_equal(counts, self.n_owners), "a cell's owner count is not kept")

    # -- helpers ---------------------------------------------------------------

    def _free_id(self) -> int:
        free_ids = np.flatnonzero(~self.live)
        if len(free_ids) == 0:
            raise CapacityError(
                f"all {self.config.max_seqs} sequence ids are live; seq_rm() one or raise max_seqs"
            )
        return int(free_ids[0])

    def _cells_to_hold(self, seq: int, n: int) -> np.ndarray:
        """`seq`'s cell list, grown (by doubling, contents kept) to hold n positions."""
        cells = self._cells[seq]
        if len(cells) < n:
            grown = np.empty(max(n, 2 * len(cells)), dtype=np.int32)
            grown[: len(cells)] = cells
            self._cells[seq] = cells = grown
        return cells

    def _drop(self, cells: np.ndarray, seq: int) -> None:
        """Clears `seq`'s bit on `cells` ([n] int32), frees those left unowned, trims."""
        word, bit = _bit(seq)
        self.owners[cells, word] &= ~bit
        self.n_owners[cells] -= 1
        freed = cells[self.n_owners[cells] == 0]
        self.pos[freed] = -1
        self.used_cells -= len(freed)
        if len(freed):
            self._no_hole_below = min(self._no_hole_below, int(freed.min()))
        self._touched.append(cells)
        self._trim()

    def _trim(self) -> None:
        """Lowers read_len past the free cells at its end; O(the cells it passes)."""
        span = 64
        while self.read_len > 0 and self.pos[self.read_len - 1] < 0:
            low = max(0, self.read_len - span)
            occupied = np.flatnonzero(self.pos[low : self.read_len] >= 0)
            self.read_len = low + int(occupied[-1]) + 1 if len(occupied) else low
            span *= 2
        self._no_hole_below = min(self._no_hole_below, self.read_len)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"cell table invariant broken: {what}")


def _bit(seq: int) -> tuple[int, np.uint64]:
    """(word, mask) of sequence `seq` in an owner bitset."""
    return seq // 64, np.uint64(1) << np.uint64(seq % 64)


def _bits(seq_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([n] int64 words, [n] uint64 masks) of each id in `seq_ids`."""
    seq_ids = np.asarray(seq_ids, dtype=np.int64)
    return seq_ids // 64, np.uint64(1) << (seq_ids % 64).astype(np.uint64)


def _runs(seq_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, first, end): `seq_ids[order]` lists each id's tokens together, in their
    order; run r of one id is order[first[r]:end[r]]."""
    order = np.argsort(seq_ids, kind="stable")
    if len(order) == 0:
        return order, order, order
    ids = seq_ids[order]
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return order, first, np.r_[first[1:], len(ids)]


_NO_CELLS = np.zeros(0, dtype=np.int32)
