"""The position -> cell table on the device for gathered attention (docs/contract.md §4
`seq_cells`).

`seq_cells[s, p]` is the cell holding position p of sequence s, for p < `seq_len[s]`;
entries past a sequence's length are stale and never read. Placement records each
token's cell (`placement.prepare_tokens`); clone copies a prefix row; rewind and rm only
change a length; clear zeroes every length. Each kernel has a launcher, `launch_<kernel>`.
"""

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel
from numbakv.cache.kernels.launch import check_extent, launch, launch_dims

# seq_cells, seq_len, src, dst, upto
COPY_PREFIX_SIGNATURES = ["void(int32[:, ::1], int32[::1], int32, int32, int32)"]
# seq_len, seq, length
SET_LENGTH_SIGNATURES = ["void(int32[::1], int32, int32)"]
# seq_len
CLEAR_LENGTHS_SIGNATURES = ["void(int32[::1])"]


@kernel(COPY_PREFIX_SIGNATURES)
def copy_prefix(seq_cells, seq_len, src, dst, upto):
    """seq_clone: row dst takes row src's first `upto` cells; seq_len[dst] = upto."""
    # seq_cells: [max_seqs, max_seq_len] int32  seq_len: [max_seqs] int32
    for p in range(cuda.grid(1), upto, cuda.gridsize(1)):
        seq_cells[dst, p] = seq_cells[src, p]
    if cuda.grid(1) == 0:
        seq_len[dst] = upto


@kernel(SET_LENGTH_SIGNATURES)
def set_length(seq_len, seq, length):
    """rewind (length = position) and seq_rm (length = 0): only the length changes."""
    if cuda.grid(1) == 0:
        seq_len[seq] = length


@kernel(CLEAR_LENGTHS_SIGNATURES)
def clear_lengths(seq_len):
    """clear: every sequence's length 0."""
    for s in range(cuda.grid(1), seq_len.shape[0], cuda.gridsize(1)):
        seq_len[s] = 0


def launch_copy_prefix(seq_cells, seq_len, src: int, dst: int, upto: int, stream=0):
    """seq_clone(src, upto) that made `dst`: copies the row prefix and sets the length."""
    check_extent("upto", upto, seq_cells.shape[1])
    grid, threads = launch_dims(max(upto, 1))
    launch(
        copy_prefix,
        grid,
        threads,
        stream,
        seq_cells,
        seq_len,
        np.int32(src),
        np.int32(dst),
        np.int32(upto),
    )


def launch_set_length(seq_len, seq: int, length: int, stream=0):
    """Sets one sequence's length (rewind, seq_rm)."""
    launch(set_length, 1, 1, stream, seq_len, np.int32(seq), np.int32(length))


def launch_clear_lengths(seq_len, stream=0):
    """Every length 0 (clear)."""
    grid, threads = launch_dims(len(seq_len))
    launch(clear_lengths, grid, threads, stream, seq_len)
