"""The step of docs/contract.md §3: the placed tokens of one forward and a mask per window,
each mask computed when it is first read."""

import numpy as np

from numbakv.core.calls import check_window
from numbakv.core.errors import StepError


def window_mask(
    cell_pos: np.ndarray,
    cell_owners: np.ndarray,
    seq_ids: np.ndarray,
    positions: np.ndarray,
    window: int,
) -> np.ndarray:
    """[width, read_len] uint8: 1 where token t may attend cell c (the mask rule of
    docs/contract.md §3).

    cell_pos    : [read_len] int32, position held by each cell, -1 = free
    cell_owners : [read_len, n_owner_words] uint64, owner bitset of each cell
    seq_ids     : [width] int32, sequence of each token, -1 = padding
    positions   : [width] int32, position of each token

    t attends c iff c is occupied, owned by t's sequence, pos[c] <= p and, for a
    window W > 0, pos[c] > p - W. Padding rows are all zero.
    """
    is_real = seq_ids >= 0
    seq = np.where(is_real, seq_ids, 0)
    words = cell_owners[:, seq // 64].T  # [width, read_len]
    is_owner = ((words >> (seq % 64).astype(np.uint64)[:, None]) & np.uint64(1)) == 1
    p = positions[:, None]
    sees = is_owner & (cell_pos[None, :] >= 0) & (cell_pos[None, :] <= p)
    if window > 0:
        sees &= cell_pos[None, :] > p - window
    return (sees & is_real[:, None]).astype(np.uint8)


class Step:
    """One prepared forward: host copies of the step buffers.

    cells     : [width] int32, cell of each token, -1 for padding rows
    positions : [width] int32, position of each token in its sequence, -1 for padding
    seq_ids   : [width] int32, sequence of each token, -1 for padding
    width     : rows of the step, padding included
    n_tokens  : declared tokens (rows [0, n_tokens) are real)
    read_len  : the extent attention sweeps, cells [0, read_len)
    windows   : the distinct windows with a mask

    A Step is valid until the next verb other than `seq_new`; after that every accessor
    raises StepError (`is_stale` tells without raising). While it is valid the table's
    cells are as the step placed them, so a mask is computed from them when first read
    (`window_mask` of `cell_pos`, `cell_owners`) and kept for the step.
    """

    def __init__(self, cells, positions, seq_ids, read_len, cell_pos, cell_owners, windows):
        self._is_stale = False
        self._cells = cells
        self._positions = positions
        self._seq_ids = seq_ids
        self._read_len = read_len
        self._table = cell_pos, cell_owners  # [read_len] views of the table, as placed
        self._windows = tuple(windows)
        self._masks: dict[int, np.ndarray] = {}
        self._n_tokens = int(np.count_nonzero(seq_ids >= 0))

    @property
    def is_stale(self) -> bool:
        """True once a later verb has changed the cache."""
        return self._is_stale

    def expire(self) -> None:
        """Called by the cache when a verb runs after this step was prepared."""
        self._is_stale = True

    def _check(self) -> None:
        if self._is_stale:
            raise StepError(
                "this Step is stale: a verb ran after prepare_step(); "
                "declare and prepare a new step"
            )

    @property
    def cells(self) -> np.ndarray:
        self._check()
        return self._cells.copy()

    @property
    def positions(self) -> np.ndarray:
        self._check()
        return self._positions.copy()

    @property
    def seq_ids(self) -> np.ndarray:
        self._check()
        return self._seq_ids.copy()

    @property
    def width(self) -> int:
        self._check()
        return len(self._cells)

    @property
    def read_len(self) -> int:
        self._check()
        return self._read_len

    @property
    def n_tokens(self) -> int:
        self._check()
        return self._n_tokens

    @property
    def windows(self) -> tuple[int, ...]:
        self._check()
        return self._windows

    def mask(self, window: int) -> np.ndarray:
        """[width, read_len] uint8 copy of the mask of `window` (1 = attend)."""
        window = check_window(window, self.windows)
        if window not in self._masks:
            cell_pos, cell_owners = self._table
            self._masks[window] = window_mask(
                cell_pos, cell_owners, self._seq_ids, self._positions, window
            )
        return self._masks[window].copy()
