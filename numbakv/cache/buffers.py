"""`StepBuffers`: the step buffer, the masks and the table mirror on the device, allocated once,
and the pinned host staging the step buffer is uploaded from."""

import numpy as np

from numbakv.cache.cuda import cuda, is_done, ordering_event
from numbakv.cache.kernels.step_buffer import CELLS, POSITIONS, ROWS, SCALARS, SEQ_IDS, columns
from numbakv.core.config import CacheConfig

N_STAGES = 2  # pinned staging slots: a step is staged while the last one's upload may still run


class StepBuffers:
    """The fixed device buffers of a cache, at full size from the start.

    step        : [4, columns] int32, the step buffer (`kernels.step_buffer`): the tokens'
                  cells, positions and sequences (-1 for padding rows) and width, read_len
    cells, positions, seq_ids : [max_width] int32 views of its rows
    mask_stack  : [n_windows, max_width, capacity] uint8, 1 = attend, one per distinct window
    masks       : window -> [max_width, capacity] uint8, its view of the stack
    windows     : [n_windows] int32, the distinct windows, in the stack's order
    cell_pos    : [capacity] int32, mirror of the table's positions (-1 = free)
    cell_owners : [capacity, n_owner_words] uint64, mirror of the owner bitsets
    seq_cells   : [max_seqs, max_seq_len] int32, each sequence's cells by position
    seq_len     : [max_seqs] int32, positions each sequence holds

    Their device addresses are the same before and after any growth and any step, so a
    recorded launch stays valid until the pool's storage moves. A step reaches the device
    as one asynchronous copy of `step` from a pinned host slot (`stage`, `upload`).
    """

    def __init__(self, config: CacheConfig):
        width, cap = config.max_width, config.capacity
        host = np.full((ROWS, columns(width)), -1, np.int32)
        host[SCALARS] = 0
        self.step = cuda.to_device(host)
        self.cells, self.positions, self.seq_ids = (
            self.step[row, :width] for row in (CELLS, POSITIONS, SEQ_IDS)
        )
        windows = config.distinct_windows
        self.mask_stack = cuda.to_device(np.zeros((len(windows), width, cap), np.uint8))
        self.masks = {w: self.mask_stack[i] for i, w in enumerate(windows)}
        self.windows = cuda.to_device(np.array(windows, np.int32))
        self.cell_pos = cuda.to_device(np.full(cap, -1, np.int32))
        self.cell_owners = cuda.to_device(np.zeros((cap, config.n_owner_words), np.uint64))
        self.seq_cells = cuda.to_device(
            np.full((config.max_seqs, config.max_seq_len), -1, np.int32)
        )
        self.seq_len = cuda.to_device(np.zeros(config.max_seqs, np.int32))
        self._staging = cuda.pinned_array((N_STAGES, *host.shape), np.int32)
        self._staging[:] = host
        self._uploaded = [ordering_event() for _ in range(N_STAGES)]
        self._is_recorded = [False] * N_STAGES
        self._next = 0

    def all(self) -> dict[str, object]:
        """Every buffer by name."""
        return {
            "step": self.step,
            "masks": self.mask_stack,
            "windows": self.windows,
            "cell_pos": self.cell_pos,
            "cell_owners": self.cell_owners,
            "seq_cells": self.seq_cells,
            "seq_len": self.seq_len,
        }

    def stage(self) -> np.ndarray:
        """The pinned [4, columns] int32 slot the next step is written into. Waits for the
        upload that last used it only if it has not finished (it was two steps back: in a
        running loop it has)."""
        slot = self._next
        if self._is_recorded[slot] and not is_done(self._uploaded[slot]):
            self._uploaded[slot].synchronize()
        return self._staging[slot]

    def upload(self, stream) -> None:
        """Copies the staged slot into `step` on `stream` (asynchronous: the slot is pinned)
        and moves on to the other slot."""
        slot = self._next
        self.step.copy_to_device(self._staging[slot], stream=stream)
        self._uploaded[slot].record(stream)
        self._is_recorded[slot] = True
        self._next = (slot + 1) % N_STAGES
