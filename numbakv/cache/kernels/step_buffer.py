"""The step buffer: one fixed [4, columns] int32 device array holding all of a step's inputs.

    step[CELLS, t], step[POSITIONS, t], step[SEQ_IDS, t]   token t's cell, position and
                                                          sequence (-1 for padding), t < width
    step[SCALARS, WIDTH], step[SCALARS, READ_LEN]         the step's width and read_len

One array, so a step's inputs cross the bus as one copy and a launch passes one argument
for all of them (each array argument costs a numba launch ~1.4 µs); and the kernels read
width and read_len from it, never from launch arguments, so a launch recorded for one
step serves every later step of the same width. Each kernel caps the width (and read_len)
at its arrays' extents: a GPU checks no bounds, and a stale recorded launch must not write
past them. `columns` = max(max_width, 2); columns past the width hold whatever an earlier
step left there and are never read.
"""

import numpy as np

CELLS, POSITIONS, SEQ_IDS, SCALARS = 0, 1, 2, 3  # rows
WIDTH, READ_LEN = 0, 1  # columns of the SCALARS row
ROWS = 4
STEP = "int32[:, ::1]"  # its kernel signature


def columns(max_width: int) -> int:
    """Columns of the step buffer of a cache of `max_width`: room for the tokens and scalars."""
    return max(max_width, 2)


def host_step(cells, positions, seq_ids, read_len: int = 0, max_width: int | None = None):
    """[4, columns] int32 on the host: the step buffer of tokens `cells`, `positions`,
    `seq_ids` ([width] ints each, -1 for padding), width = len(cells), and `read_len`;
    columns past the width hold -1. For launching a kernel outside a cache."""
    width = len(cells)
    step = np.full((ROWS, columns(max(width, max_width or 0))), -1, np.int32)
    for row, values in ((CELLS, cells), (POSITIONS, positions), (SEQ_IDS, seq_ids)):
        step[row, :width] = values
    step[SCALARS, :2] = (width, read_len)
    return step
