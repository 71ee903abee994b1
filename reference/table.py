"""The cell table of docs/contract.md §2 as the contract states it: per cell a position and
an owner bitset, per id a live flag and the positions it holds."""

import numpy as np

from numbakv.core.calls import check_live, check_position
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError
from numbakv.core.snapshot import Snapshot


class CellTable:
    """Which cell holds which position of which sequences.

    pos      : [capacity] int32, -1 = free
    owners   : [capacity, n_owner_words] uint64, bit `s % 64` of word `s // 64` = sequence s
    live     : [max_seqs] bool
    lengths  : [max_seqs] int64, pos(seq): the positions each sequence holds, kept by the
               verbs and `claim` so that a step need not count owner bits per sequence
               (docs/contract.md §7)
    read_len : int, one past the highest occupied cell (0 when none is)

    Everything else (a sequence's cells, used and free cells, the holes) is read off `pos`
    and `owners` when asked, over cells [0, read_len): every cell past is free.
    """

    def __init__(self, config: CacheConfig):
        self.config = config
        self.pos = np.full(config.capacity, -1, dtype=np.int32)
        self.owners = np.zeros((config.capacity, config.n_owner_words), dtype=np.uint64)
        self.live = np.zeros(config.max_seqs, dtype=bool)
        self.lengths = np.zeros(config.max_seqs, dtype=np.int64)
        self.read_len = 0
        self._touched: list[np.ndarray] = []  # cells changed since `take_touched`

    # -- queries ---------------------------------------------------------------

    def length(self, seq: int) -> int:
        """pos(seq): the positions `seq` holds, which is the position of its next token."""
        return int(self.lengths[seq])

    def holds(self, seq: int) -> np.ndarray:
        """[read_len] bool: which cells carry `seq`'s owner bit."""
        word, bit = _bit(seq)
        return (self.owners[: self.read_len, word] & bit) != 0

    def cells_of(self, seq: int) -> np.ndarray:
        """[pos(seq)] int32: `seq`'s cells in position order (entry i holds position i)."""
        held = np.flatnonzero(self.holds(seq))
        cells = np.empty(len(held), dtype=np.int32)
        cells[self.pos[held]] = held
        return cells

    @property
    def used_cells(self) -> int:
        return int(np.count_nonzero(self.pos[: self.read_len] >= 0))

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
        """[n] int32: every cell whose position or owners changed since the last call
        (repeats allowed), the cells docs/contract.md §7.1 says a verb touched."""
        touched = np.concatenate([np.zeros(0, np.int32), *self._touched], dtype=np.int32)
        self._touched = []
        return touched

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        seq = self._free_id()
        self.live[seq] = True
        return seq

    def seq_clone(self, src, upto=None) -> int:
        """A new id whose bit is set on every cell of `src` with pos < upto."""
        src = self.check_live(src)
        n = self.length(src)
        upto = n if upto is None else check_position("upto", upto, n, src)
        seq = self._free_id()
        shared = np.flatnonzero(self.holds(src) & (self.pos[: self.read_len] < upto))
        word, bit = _bit(seq)
        self.owners[shared, word] |= bit
        self.live[seq] = True
        self.lengths[seq] = upto
        self._touched.append(shared)
        return seq

    def seq_rm(self, seq) -> None:
        """Clears `seq`'s bit everywhere, frees the cells left unowned, releases the id."""
        seq = self.check_live(seq)
        self._drop(seq, 0)
        self.live[seq] = False

    def rewind(self, seq, position) -> None:
        """Drops `seq`'s cells with pos >= position; the id stays live."""
        seq = self.check_live(seq)
        self._drop(seq, check_position("position", position, self.length(seq), seq))

    def clear(self) -> None:
        self._touched.append(np.arange(self.read_len))
        self.pos[:] = -1
        self.owners[:] = 0
        self.live[:] = False
        self.lengths[:] = 0
        self.read_len = 0

    # -- placement -------------------------------------------------------------

    def positions_of(self, seq_ids: np.ndarray) -> np.ndarray:
        """[n] int32: token i of sequence s = seq_ids[i] ([n] int32) gets pos(s) + (earlier
        tokens of s in seq_ids)."""
        order = np.argsort(seq_ids, kind="stable")  # each id's tokens together, in order
        grouped = seq_ids[order]
        earlier = np.empty(len(seq_ids), dtype=np.int64)
        earlier[order] = np.arange(len(order)) - np.searchsorted(grouped, grouped)
        return (self.lengths[seq_ids] + earlier).astype(np.int32)

    def find_cells(self, n: int) -> np.ndarray:
        """[n] int32: the n lowest free cells, ascending: the holes below read_len, then
        fresh cells from read_len on. Claims nothing; the caller has checked that n cells
        are free."""
        holes = np.flatnonzero(self.pos[: self.read_len] < 0)[:n]
        fresh = np.arange(self.read_len, self.read_len + n - len(holes))
        return np.concatenate([holes, fresh]).astype(np.int32)

    def claim(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Writes position and owner bit of each placed token into its (free, distinct)
        cell; each sequence then holds one past its last placed position.

        cells, positions, seq_ids : [n] int32, token i in cells[i] at positions[i]
        """
        words, bits = _bits(seq_ids)
        self.pos[cells] = positions
        self.owners[cells, words] |= bits
        np.maximum.at(self.lengths, seq_ids, positions.astype(np.int64) + 1)
        self.read_len = max(self.read_len, int(cells.max(initial=-1)) + 1)
        self._touched.append(cells)

    # -- invariants ------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raises AssertionError naming the first invariant of docs/contract.md §2 that does
        not hold; recomputes `lengths` and `read_len` from `pos` and `owners`.

        Each live sequence holds exactly the positions 0 .. pos-1, once each; a cell has a
        position exactly when it has an owner, and every owner is live; every occupied cell
        lies below read_len, and the cell just below it is occupied.
        """
        occupied = self.pos >= 0
        owned = self.owners.any(axis=1)
        _require(np.array_equal(occupied, owned), "a cell's position and owners disagree")
        _require(not occupied[self.read_len :].any(), "an occupied cell at or past read_len")
        _require(self.read_len == 0 or occupied[self.read_len - 1], "read_len is not trimmed")
        for seq in range(self.config.max_seqs):
            word, bit = _bit(seq)
            held = self.pos[(self.owners[:, word] & bit) != 0]
            if not self.live[seq]:
                _require(len(held) == 0, f"sequence {seq} owns cells but is not live")
            _require(
                np.array_equal(np.sort(held), np.arange(len(held))),
                f"sequence {seq} does not hold positions 0..{len(held) - 1} once each",
            )
            _require(self.lengths[seq] == len(held), f"sequence {seq}'s length is not kept")

    # -- helpers ---------------------------------------------------------------

    def _free_id(self) -> int:
        free_ids = np.flatnonzero(~self.live)
        if len(free_ids) == 0:
            raise CapacityError(
                f"all {self.config.max_seqs} sequence ids are live; seq_rm() one or raise max_seqs"
            )
        return int(free_ids[0])

    def _drop(self, seq: int, position: int) -> None:
        """Clears `seq`'s bit on its cells with pos >= position, frees the cells left
        without an owner and trims read_len past the free cells at its end."""
        cells = np.flatnonzero(self.holds(seq) & (self.pos[: self.read_len] >= position))
        word, bit = _bit(seq)
        self.owners[cells, word] &= ~bit
        self.pos[cells[~self.owners[cells].any(axis=1)]] = -1
        self.lengths[seq] = position
        occupied = np.flatnonzero(self.pos[: self.read_len] >= 0)
        self.read_len = int(occupied[-1]) + 1 if len(occupied) else 0
        self._touched.append(cells)


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
