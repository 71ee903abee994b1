"""Which cells a token sees: the one place where masked and gathered attention differ.

A view is a tuple of the arrays and scalars a mode reads beside the step buffer
(`step_buffer`), and device functions over it. The decode kernels walk one token's cells
(`CELL_VIEWS`):

    token(view, step, t) -> (key, lo, hi)
                                      token t reads sweep indices [lo, hi) of sweep `key`
                                      (lo == hi: it sees nothing, e.g. a padded row)
    cell(view, t, key, j, rows) -> c  the cell token t sees at sweep index j, -1 for none

The prefill kernel sweeps a block of tokens over tiles of sweep indices (`PREFILL_VIEWS`):

    token                             as above
    flags(view, tok_s, first, n_tok, key, j, rows) -> uint32
                                      bit k set where token k of the block (k = first,
                                      first + FLAG_STRIDE, ... < n_tok; its step row, key and
                                      range in the token table tok_s) sees sweep index j
    tile_cell(view, key, j, rows) -> c
                                      the cell at sweep index j of `key`, read only once
                                      `flags` said some token sees j; -1 for an id outside
                                      [0, rows)

masked   view (mask,): every token sweeps the cells [0, read_len) as key 0 and sees cell c
         where mask[t, c] == 1; the mask is read at rows < width, columns < read_len.
gathered view (seq_cells, window): token t of sequence s at position p
         sweeps the positions [max(0, p - W + 1), p + 1) of key s (0 for W = 0) and sees
         cell seq_cells[s, j] (read only inside that range); a cell id outside [0, rows) is
         seen by no one.
"""

import numpy as np

from numbakv.cache.kernels import device_function, wide
from numbakv.cache.kernels.attention.tiles import FLAG_STRIDE, FLAG_TOKENS, HI, KEY, LO, T
from numbakv.cache.kernels.step_buffer import POSITIONS, READ_LEN, SCALARS, SEQ_IDS

MASKED_VIEW = "Tuple((uint8[:, ::1],))"  # mask [max_width, capacity]
GATHERED_VIEW = "Tuple((int32[:, ::1], int32))"  # seq_cells [max_seqs, max_seq_len], window
ONE_BIT = np.uint32(1)


@device_function
def masked_token(view, step, t):
    """Every token sweeps [0, read_len) of key 0 (never past the mask's columns)."""
    (mask,) = view
    return np.int32(0), np.int32(0), min(step[SCALARS, READ_LEN], np.int32(mask.shape[1]))


@device_function
def masked_flags(view, tok_s, first, n_tok, key, j, rows):
    """Bit k: token k (first, first + FLAG_STRIDE, ...) sees cell j inside its [LO, HI),
    below `rows`, where its mask bit is set (the mask read only there)."""
    # mask: [max_width, capacity] uint8  tok_s: [TOKEN_ROWS, tokens] int32
    (mask,) = view
    bits = np.uint32(0)
    for u in range(FLAG_TOKENS):  # a constant count: unrolled
        k = np.int32(first + u * FLAG_STRIDE)
        is_inside = k < n_tok and tok_s[LO, k] <= j and j < tok_s[HI, k] and j < rows
        if is_inside and wide.item(mask, tok_s[T, k], j) != 0:
            bits = np.uint32(bits | (ONE_BIT << np.uint32(k)))
    return bits


@device_function
def masked_tile_cell(view, key, j, rows):
    """Cell j itself (`masked_flags` saw j < rows)."""
    return np.int32(j)


@device_function
def gathered_token(view, step, t):
    """Token t of sequence s at position p sweeps [window start, p + 1) of key s."""
    _, window = view
    seq, p = step[SEQ_IDS, t], step[POSITIONS, t]
    zero, one = np.int32(0), np.int32(1)
    if seq < zero:  # padding: an empty range, output 0
        return zero, zero, zero
    lo = max(zero, p - window + one) if window > zero else zero
    return seq, lo, p + one


@device_function
def gathered_flags(view, tok_s, first, n_tok, key, j, rows):
    """Bit k: token k (first, first + FLAG_STRIDE, ...) of sequence `key` sees position j
    inside its [LO, HI) (whether its cell is inside the pool, `gathered_tile_cell` says)."""
    # tok_s: [TOKEN_ROWS, tokens] int32
    bits = np.uint32(0)
    for u in range(FLAG_TOKENS):
        k = np.int32(first + u * FLAG_STRIDE)
        if k >= n_tok:  # no load follows: an early exit costs the GPU nothing
            break
        if tok_s[KEY, k] == key and tok_s[LO, k] <= j and j < tok_s[HI, k]:
            bits = np.uint32(bits | (ONE_BIT << np.uint32(k)))
    return bits


@device_function
def masked_cell(view, t, key, j, rows):
    """Cell j if token t's mask row allows it (j < rows), else -1."""
    (mask,) = view
    return j if j < rows and wide.item(mask, t, j) != 0 else np.int32(-1)


@device_function
def gathered_cell(view, t, key, j, rows):
    """The cell at position j of sequence `key`, -1 for an id outside [0, rows)."""
    seq_cells, _ = view
    c = wide.item(seq_cells, key, j)
    return c if np.int32(0) <= c < rows else np.int32(-1)


@device_function
def gathered_tile_cell(view, key, j, rows):
    """The cell at position j of sequence `key`, -1 for an id outside [0, rows)."""
    return gathered_cell(view, np.int32(0), key, j, rows)


# mode -> (view signature, token, cell): what a kernel that walks one token's cells reads
CELL_VIEWS = {
    "masked": (MASKED_VIEW, masked_token, masked_cell),
    "gathered": (GATHERED_VIEW, gathered_token, gathered_cell),
}
# mode -> (view signature, token, flags, tile_cell): what the prefill kernel reads
PREFILL_VIEWS = {
    "masked": (MASKED_VIEW, masked_token, masked_flags, masked_tile_cell),
    "gathered": (GATHERED_VIEW, gathered_token, gathered_flags, gathered_tile_cell),
}
