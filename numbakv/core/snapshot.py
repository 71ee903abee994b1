"""`Snapshot`: a host copy of the cell table, the same from either implementation."""

from dataclasses import dataclass

import numpy as np

FREE, SHARED = -1, -2


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The cell table at one moment, cells [0, read_len) only: every cell past is free.

    pos      : [read_len] int32, the position each cell holds, -1 = free
    owners   : [read_len, ceil(max_seqs / 64)] uint64, owner bitset of each cell
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
    def live_seqs(self) -> np.ndarray:
        """[n_live] int64, the live sequence ids in ascending order (a cache's `live_seqs`)."""
        return np.flatnonzero(self.live)

    @property
    def n_owners(self) -> np.ndarray:
        """[read_len] int, how many sequences own each cell (0 = free, > 1 = shared)."""
        return np.bitwise_count(self.owners).sum(axis=1, dtype=np.int64)

    @property
    def codes(self) -> np.ndarray:
        """[read_len] int32: the owning id of each cell, FREE (-1) or SHARED (-2)."""
        return owner_codes(self.owners)

    def owners_of(self, cell: int) -> list[int]:
        """The sequence ids owning `cell`, ascending (empty when free)."""
        if cell >= self.read_len:
            return []
        ids = []
        for w, word in enumerate(self.owners[cell].tolist()):
            ids += [w * 64 + b for b in range(64) if (word >> b) & 1]
        return ids


def owner_codes(owners: np.ndarray) -> np.ndarray:
    """[n] int32 from owner bitsets [n, words] uint64: the single owner's id, FREE or SHARED.
    Summed word column by word column: numpy's reductions along a row's few words cost
    several times as much (the recorder codes every frame's changed cells here)."""
    bits = np.bitwise_count(owners)
    total = bits[:, 0].astype(np.int32)
    word = np.zeros(len(owners), dtype=np.int32)  # a one-bit row's word
    for k in range(1, owners.shape[1]):
        total += bits[:, k]
        word += bits[:, k] * np.int32(k)
    codes = np.where(total > 1, SHARED, FREE).astype(np.int32)
    one = np.flatnonzero(total == 1)
    lowest = owners[one, word[one]] - np.uint64(1)  # its bit's ones below it
    codes[one] = 64 * word[one] + np.bitwise_count(lowest).astype(np.int32)
    return codes
