"""The cell table of docs/contract.md §2: per cell a position and an owner bitset, per id a
live flag and the count of positions it holds."""

import numpy as np

from numbakv.checks import check_live, check_position
from numbakv.config import CacheConfig
from numbakv.errors import CapacityError
from numbakv.snapshot import Snapshot


class CellTable:
    """Which cell holds which position of which sequences.

    pos     : [capacity] int32, -1 = free
    owners  : [capacity, n_owner_words] uint64, bit `s % 64` of word `s // 64` = sequence s
    live    : [max_seqs] bool
    lengths : [max_seqs] int64, positions each sequence holds (pos(seq)), kept by the verbs
              and by `claim`, so that a step reads it without scanning the cells

    Invariant: every cell at or past `read_len` is free, so every search below stops
    at `read_len`.
    """

    def __init__(self, config: CacheConfig):
        self.config = config
        self.pos = np.full(config.capacity, -1, dtype=np.int32)
        self.owners = np.zeros((config.capacity, config.n_owner_words), dtype=np.uint64)
        self.live = np.zeros(config.max_seqs, dtype=bool)
        self.lengths = np.zeros(config.max_seqs, dtype=np.int64)
        self.read_len = 0

    # -- queries ---------------------------------------------------------------

    def holds(self, seq: int) -> np.ndarray:
        """[read_len] bool: which cells have `seq`'s owner bit."""
        word, bit = _bit(seq)
        return (self.owners[: self.read_len, word] & bit) != 0

    def length(self, seq: int) -> int:
        """pos(seq): the positions `seq` holds, which is the position of its next token."""
        return int(self.lengths[seq])

    def cells_of(self, seq: int) -> np.ndarray:
        """[pos(seq)] int32: `seq`'s cells in position order (entry i holds position i).

        O(read_len): the cells with `seq`'s owner bit, each put at its position; the
        invariant (positions 0 .. pos(seq)-1, one cell each) fills every entry once.
        """
        held = np.flatnonzero(self.holds(seq))
        cells = np.empty(self.length(seq), dtype=np.int32)
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

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        seq = self._free_id()
        self.live[seq] = True
        return seq

    def seq_clone(self, src, upto=None) -> int:
        src = self.check_live(src)
        n = self.length(src)
        upto = n if upto is None else check_position("upto", upto, n, src)
        seq = self._free_id()
        shared = self.holds(src) & (self.pos[: self.read_len] < upto)
        word, bit = _bit(seq)
        self.owners[: self.read_len, word][shared] |= bit
        self.live[seq] = True
        self.lengths[seq] = upto
        return seq

    def seq_rm(self, seq) -> None:
        seq = self.check_live(seq)
        self._drop(self.holds(seq), seq)
        self.live[seq] = False
        self.lengths[seq] = 0

    def rewind(self, seq, position) -> None:
        seq = self.check_live(seq)
        position = check_position("position", position, self.length(seq), seq)
        self._drop(self.holds(seq) & (self.pos[: self.read_len] >= position), seq)
        self.lengths[seq] = position

    def clear(self) -> None:
        self.pos[:] = -1
        self.owners[:] = 0
        self.live[:] = False
        self.lengths[:] = 0
        self.read_len = 0

    # -- placement -------------------------------------------------------------

    def positions_of(self, seq_ids: np.ndarray) -> np.ndarray:
        """[n] int32: token i of sequence s gets pos(s) + (earlier tokens of s in seq_ids)."""
        positions = np.empty(len(seq_ids), dtype=np.int32)
        next_pos = {}
        for i, seq in enumerate(seq_ids.tolist()):
            if seq not in next_pos:
                next_pos[seq] = self.length(seq)
            positions[i] = next_pos[seq]
            next_pos[seq] += 1
        return positions

    def find_cells(self, n: int) -> np.ndarray:
        """[n] int32: the n lowest free cells, ascending; holes below read_len come first.

        Pure: claims nothing. The caller has checked that n cells are free.
        """
        holes = np.flatnonzero(self.pos[: self.read_len] < 0)
        fresh = np.arange(self.read_len, self.read_len + n)
        return np.concatenate([holes, fresh])[:n].astype(np.int32)

    def claim(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Writes position and owner bit of each placed token into its cell; each sequence
        then holds one past its last placed position."""
        self.pos[cells] = positions
        for cell, seq in zip(cells.tolist(), seq_ids.tolist(), strict=True):
            word, bit = _bit(seq)
            self.owners[cell, word] |= bit
        np.maximum.at(self.lengths, seq_ids, positions.astype(np.int64) + 1)
        self.read_len = max(self.read_len, int(cells.max()) + 1)

    # -- invariants ------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raises AssertionError naming the first invariant of docs/contract.md §2 that does
        not hold.

        Each live sequence holds exactly the positions 0 .. pos-1, once each; a cell has a
        position exactly when it has an owner, and every owner is live; every occupied cell
        lies below read_len, and the cell just below it is occupied; used + free = capacity.
        """
        occupied = self.pos >= 0
        owned = self.owners.any(axis=1)
        _require(np.array_equal(occupied, owned), "a cell's position and owners disagree")
        _require(not occupied[self.read_len :].any(), "an occupied cell at or past read_len")
        _require(self.read_len == 0 or occupied[self.read_len - 1], "read_len is not trimmed")
        n_free = int(np.count_nonzero(~occupied))
        _require(n_free + self.used_cells == self.config.capacity, "free + used != capacity")
        for seq in range(self.config.max_seqs):
            held = self.pos[: self.read_len][self.holds(seq)]
            if not self.live[seq]:
                _require(len(held) == 0, f"sequence {seq} owns cells but is not live")
            expect = np.arange(len(held))
            _require(
                np.array_equal(np.sort(held), expect),
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

    def _drop(self, cells: np.ndarray, seq: int) -> None:
        """Clears `seq`'s bit on `cells` ([read_len] bool), frees cells left unowned, trims."""
        word, bit = _bit(seq)
        self.owners[: self.read_len, word][cells] &= ~bit
        unowned = ~self.owners[: self.read_len].any(axis=1)
        self.pos[: self.read_len][unowned] = -1
        occupied = np.flatnonzero(self.pos[: self.read_len] >= 0)
        self.read_len = int(occupied[-1]) + 1 if len(occupied) else 0


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"cell table invariant broken: {what}")


def _bit(seq: int) -> tuple[int, np.uint64]:
    """(word, mask) of sequence `seq` in an owner bitset."""
    return seq // 64, np.uint64(1) << np.uint64(seq % 64)
