"""`Step`: one prepared forward of the device cache (docs/contract.md §3), and the handle to
its buffers; `Progress`: the cache's prepared step and what of it has run."""

from collections.abc import Callable

import numpy as np

from numbakv.cache.buffers import StepBuffers
from numbakv.cache.kernels.step_buffer import CELLS, POSITIONS, SEQ_IDS
from numbakv.core.calls import check_window
from numbakv.core.errors import StepError


class Step:
    """One prepared forward: host copies of what was uploaded, the device buffers, the stream.

    cells     : [width] int32, cell of each token, -1 for padding rows
    positions : [width] int32, position of each token in its sequence, -1 for padding
    seq_ids   : [width] int32, sequence of each token, -1 for padding
    width     : rows of the step, padding included
    n_tokens  : declared tokens (rows [0, n_tokens) are real)
    read_len  : the extent masked attention sweeps, cells [0, read_len)
    windows   : the distinct windows with a mask
    buffers   : the fixed device buffers the kernels read
    stream    : the numba stream every device operation of the step runs on

    Valid until the cache's next verb other than `seq_new`; after that every accessor
    raises StepError (`is_stale` tells without raising).
    """

    def __init__(self, staged: np.ndarray, width: int, n_tokens: int, read_len: int,
                 buffers: StepBuffers, stream, read_mask: Callable[[int], np.ndarray]):  # fmt: skip
        # staged: the pinned [4, columns] slot this step was uploaded from; the cache reuses
        # it two steps later, when this step is long stale
        self._staged, self._width, self._n_tokens = staged, width, n_tokens
        self._read_len = read_len
        self._buffers, self._stream, self._read_mask = buffers, stream, read_mask
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
        return self._row(CELLS)

    @property
    def positions(self) -> np.ndarray:
        return self._row(POSITIONS)

    @property
    def seq_ids(self) -> np.ndarray:
        return self._row(SEQ_IDS)

    @property
    def width(self) -> int:
        return self._valid()._width

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

    @property
    def stream(self):
        return self._valid()._stream

    def mask(self, window: int) -> np.ndarray:
        """[width, read_len] uint8, copied back from the device: the mask of `window` (the
        step's masks are written first, once, if nothing in the step has yet)."""
        return self._read_mask(check_window(window, self.windows))

    def _row(self, row: int) -> np.ndarray:
        return self._valid()._staged[row, : self._width].copy()

    def _valid(self) -> "Step":
        if self._is_stale:
            raise StepError(
                "this Step is stale: a verb ran after prepare_step(); "
                "declare and prepare a new step"
            )
        return self


class Progress:
    """The prepared step (None before the first and after any verb) and what of it has run:
    the layers written, whether its masks are. Owns that and reads nothing: the `Stepper`
    starts and expires steps in it and marks writes and masks, `Captures` reads it to
    capture a fresh step and marks what a replay ran."""

    def __init__(self) -> None:
        self.step: Step | None = None
        self.written: set[int] = set()
        self.masked = False

    def current(self) -> Step:
        """The prepared step; StepError when there is none."""
        if self.step is None:
            raise StepError("no prepared step; call declare_step() and prepare_step() first")
        return self.step

    def restart(self, step: Step | None = None) -> None:
        """The step prepared so far expires; `step` (or none) is prepared, nothing of it run."""
        if self.step is not None:
            self.step.expire()
        self.step, self.written, self.masked = step, set(), False
