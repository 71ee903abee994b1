"""`Step`: one prepared forward of the device cache (SPEC §3), and the handle to its buffers."""

import numpy as np

from numbakv.cache.buffers import StepBuffers
from numbakv.checks import check_window
from numbakv.errors import StepError


class Step:
    """One prepared forward: host copies of what was uploaded, and the device buffers.

    cells     : [width] int32, cell of each token, -1 for padding rows
    positions : [width] int32, position of each token in its sequence, -1 for padding
    seq_ids   : [width] int32, sequence of each token, -1 for padding
    width     : rows of the step, padding included
    n_tokens  : declared tokens (rows [0, n_tokens) are real)
    read_len  : the extent masked attention sweeps, cells [0, read_len)
    windows   : the distinct windows with a mask
    buffers   : the fixed device buffers the kernels read

    Valid until the cache's next verb other than `seq_new`; after that every accessor
    raises StepError (`is_stale` tells without raising).
    """

    def __init__(self, cells, positions, seq_ids, read_len: int, buffers: StepBuffers):
        self._cells, self._positions, self._seq_ids = cells, positions, seq_ids
        self._read_len = read_len
        self._buffers = buffers
        self._n_tokens = int(np.count_nonzero(seq_ids >= 0))
        self._is_stale = False

    @property
    def is_stale(self) -> bool:
        """True once a later verb has changed the cache."""
        return self._is_stale

    def expire(self) -> None:
        """Called by the cache when a verb runs after this step was prepared."""
        self._is_stale = True

    @property
    def cells(self) -> np.ndarray:
        return self._valid()._cells.copy()

    @property
    def positions(self) -> np.ndarray:
        return self._valid()._positions.copy()

    @property
    def seq_ids(self) -> np.ndarray:
        return self._valid()._seq_ids.copy()

    @property
    def width(self) -> int:
        return len(self._valid()._cells)

    @property
    def read_len(self) -> int:
        return self._valid()._read_len

    @property
    def n_tokens(self) -> int:
        return self._valid()._n_tokens

    @property
    def windows(self) -> tuple[int, ...]:
        return tuple(self._valid()._buffers.masks)

    @property
    def buffers(self) -> StepBuffers:
        return self._valid()._buffers

    def mask(self, window: int) -> np.ndarray:
        """[width, read_len] uint8, copied back from the device: the mask of `window`."""
        mask = self._valid()._buffers.masks[check_window(window, self.windows)]
        return mask[: len(self._cells)].copy_to_host()[:, : self._read_len]

    def _valid(self) -> "Step":
        if self._is_stale:
            raise StepError(
                "this Step is stale: a verb ran after prepare_step(); "
                "declare and prepare a new step"
            )
        return self
