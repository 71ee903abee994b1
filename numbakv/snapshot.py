"""`Snapshot`: a host copy of the cell table, the same from either implementation."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The cell table at one moment.

    pos      : [capacity] int32, the position each cell holds, -1 = free
    owners   : [capacity, ceil(max_seqs / 64)] uint64, owner bitset of each cell
    live     : [max_seqs] bool, which sequence ids are live
    read_len : every occupied cell lies in [0, read_len)
    capacity : cells the pool may grow to
    rows     : cells the pool has allocated now
    """

    pos: np.ndarray
    owners: np.ndarray
    live: np.ndarray
    read_len: int
    capacity: int
    rows: int

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return (
            (self.read_len, self.capacity, self.rows)
            == (other.read_len, other.capacity, other.rows)
            and np.array_equal(self.pos, other.pos)
            and np.array_equal(self.owners, other.owners)
            and np.array_equal(self.live, other.live)
        )

    __hash__ = None

    @property
    def live_ids(self) -> np.ndarray:
        """[n_live] int64, the live sequence ids in ascending order."""
        return np.flatnonzero(self.live)

    @property
    def n_owners(self) -> np.ndarray:
        """[capacity] int, how many sequences own each cell (0 = free, > 1 = shared)."""
        counts = np.zeros(self.capacity, dtype=np.int64)
        for word in range(self.owners.shape[1]):
            bits = np.unpackbits(self.owners[:, word].view(np.uint8).reshape(-1, 8), axis=1)
            counts += bits.sum(axis=1)
        return counts

    def owners_of(self, cell: int) -> list[int]:
        """The sequence ids owning `cell`, ascending (empty when free)."""
        ids = []
        for w, word in enumerate(self.owners[cell].tolist()):
            ids += [w * 64 + b for b in range(64) if (word >> b) & 1]
        return ids
