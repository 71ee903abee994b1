"""`StepBuffers`: the device buffers of SPEC §4 that are allocated once and never move."""

import numpy as np

from numbakv.cache._cuda import cuda
from numbakv.config import CacheConfig


class StepBuffers:
    """The step buffers and the device mirror of the table, at full size from the start.

    cells, positions, seq_ids : [max_width] int32, the step's tokens (-1 past the declared)
    read_len                  : [1] int32
    masks                     : window -> [max_width, capacity] uint8, 1 = attend
    cell_pos                  : [capacity] int32, mirror of the table's positions (-1 = free)
    cell_owners               : [capacity, n_owner_words] uint64, mirror of the owner bitsets
    seq_cells                 : [max_seqs, max_seq_len] int32, each sequence's cells by position
    seq_len                   : [max_seqs] int32, positions each sequence holds

    Their device addresses are the same before and after any growth and any step, so a
    recorded launch stays valid until the pool's storage moves.
    """

    def __init__(self, config: CacheConfig):
        width, cap = config.max_width, config.capacity
        self.cells = cuda.to_device(np.full(width, -1, np.int32))
        self.positions = cuda.to_device(np.full(width, -1, np.int32))
        self.seq_ids = cuda.to_device(np.full(width, -1, np.int32))
        self.read_len = cuda.to_device(np.zeros(1, np.int32))
        self.masks = {
            w: cuda.to_device(np.zeros((width, cap), np.uint8)) for w in config.distinct_windows
        }
        self.cell_pos = cuda.to_device(np.full(cap, -1, np.int32))
        self.cell_owners = cuda.to_device(np.zeros((cap, config.n_owner_words), np.uint64))
        self.seq_cells = cuda.to_device(
            np.full((config.max_seqs, config.max_seq_len), -1, np.int32)
        )
        self.seq_len = cuda.to_device(np.zeros(config.max_seqs, np.int32))

    def all(self) -> dict[str, object]:
        """Every buffer by name (masks as `mask_w{window}`)."""
        named = {
            "cells": self.cells,
            "positions": self.positions,
            "seq_ids": self.seq_ids,
            "read_len": self.read_len,
            "cell_pos": self.cell_pos,
            "cell_owners": self.cell_owners,
            "seq_cells": self.seq_cells,
            "seq_len": self.seq_len,
        }
        named.update({f"mask_w{w}": mask for w, mask in self.masks.items()})
        return named

    def upload(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, read_len: int):
        """Copies one step's [width] arrays and read_len in: nothing sized by capacity."""
        width = len(cells)
        self.cells[:width].copy_to_device(cells)
        self.positions[:width].copy_to_device(positions)
        self.seq_ids[:width].copy_to_device(seq_ids)
        self.read_len.copy_to_device(np.array([read_len], np.int32))
