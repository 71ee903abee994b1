"""Which cells a token sees: the one place where masked and gathered attention differ.

A view is a tuple of the arrays and scalars a mode reads beside the step buffer
(`step_buffer`), and two device functions:

    token(view, step, t) -> (key, lo, hi)
                                      token t reads sweep indices [lo, hi) of sweep `key`
                                      (lo == hi: it sees nothing, e.g. a padded row)
    flags(view, ok_s, cell_s, tok_s, n_tok, key, j0, rows) -> any
                                      for the tile of sweep indices j0 + jj: ok_s[k, jj] = 1
                                      where token k of the block sees index j0 + jj, cell_s[jj]
                                      its cell if any token sees it, else -1; returns whether
                                      any token of the block sees any cell of the tile

masked   view (mask,): every token sweeps the cells [0, read_len) as key 0 and sees cell c
         where mask[t, c] == 1; the mask is read at rows < width, columns < read_len.
gathered view (seq_cells, window): token t of sequence s at position p
         sweeps the positions [max(0, p - W + 1), p + 1) of key s (0 for W = 0) and sees
         cell seq_cells[s, j] (read only inside that range); a cell id outside [0, rows) is
         seen by no one.
"""

from collections.abc import Callable

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import device_function, kernel, wide
from numbakv.cache.kernels.attention.tiles import (
    HI,
    KEY,
    LO,
    T,
    io_signature,
    make_load_tile,
    make_start_rows,
    make_write_rows,
)
from numbakv.cache.kernels.placement import PAIRS, io_name, kind_name
from numbakv.cache.kernels.step_buffer import POSITIONS, READ_LEN, SCALARS, SEQ_IDS
from numbakv.cache.kernels.storage import pool_dtypes

MASKED_VIEW = "Tuple((uint8[:, ::1],))"  # mask [max_width, capacity]
GATHERED_VIEW = "Tuple((int32[:, ::1], int32))"  # seq_cells [max_seqs, max_seq_len], window


@device_function
def masked_token(view, step, t):
    """Every token sweeps [0, read_len) of key 0 (never past the mask's columns)."""
    (mask,) = view
    return np.int32(0), np.int32(0), min(step[SCALARS, READ_LEN], np.int32(mask.shape[1]))


@device_function
def masked_flags(view, ok_s, cell_s, tok_s, n_tok, key, j0, rows):
    """Token k sees cell c = j0 + jj inside its [LO, HI) where its mask bit is set."""
    # mask: [max_width, capacity] uint8  ok_s: [tokens, tile] uint8  cell_s: [tile] int32
    (mask,) = view
    tile = cell_s.shape[0]
    is_any = np.int32(0)  # an int32 predicate: what syncthreads_or takes
    for jj in range(cuda.threadIdx.x, tile, cuda.blockDim.x):
        c = j0 + jj
        is_needed = False
        for k in range(n_tok):
            sees = tok_s[LO, k] <= c and c < tok_s[HI, k] and c < rows and mask[tok_s[T, k], c] != 0
            ok_s[k, jj] = 1 if sees else 0
            is_needed = is_needed or sees
        cell_s[jj] = c if is_needed else -1
        if is_needed:
            is_any = np.int32(1)
    return cuda.syncthreads_or(is_any)


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
def gathered_flags(view, ok_s, cell_s, tok_s, n_tok, key, j0, rows):
    """Token k of sequence `key` sees position j = j0 + jj inside its [LO, HI), in cell
    seq_cells[key, j], which is read only when some token needs it."""
    # seq_cells: [max_seqs, max_seq_len] int32  ok_s: [tokens, tile] uint8
    seq_cells, _ = view
    tile = cell_s.shape[0]
    is_any = np.int32(0)  # an int32 predicate: what syncthreads_or takes
    for jj in range(cuda.threadIdx.x, tile, cuda.blockDim.x):
        j = j0 + jj
        is_needed = False
        for k in range(n_tok):
            sees = tok_s[KEY, k] == key and tok_s[LO, k] <= j and j < tok_s[HI, k]
            is_needed = is_needed or sees
        c = seq_cells[key, j] if is_needed else -1
        if c >= rows:
            c = -1
        for k in range(n_tok):
            sees = c >= 0 and tok_s[KEY, k] == key and tok_s[LO, k] <= j and j < tok_s[HI, k]
            ok_s[k, jj] = 1 if sees else 0
        cell_s[jj] = c
        if c >= 0:
            is_any = np.int32(1)
    return cuda.syncthreads_or(is_any)


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


# mode -> (view signature, token, cell): what a kernel that walks one token's cells reads
CELL_VIEWS = {
    "masked": (MASKED_VIEW, masked_token, masked_cell),
    "gathered": (GATHERED_VIEW, gathered_token, gathered_cell),
}


def build(make: Callable, signatures: Callable, shape: str, io: tuple[str, str]) -> Callable:
    """`kernels(mode, k_kind, v_kind, q_kind="float", out_kind="float")` of one shape
    ("decode" or "prefill"): `make(token, flags, load_tile, start_rows, write_rows)` over the
    mode's view for pools of (k_kind, v_kind) and q and out of (q_kind, out_kind)
    (`storage.IO_KINDS`), made on first use and registered as
    attend_{mode}_{shape}{placement.kind_name}{placement.io_name}. Made at import, so that
    the suite compiles them to PTX: the pairs of `placement.PAIRS` with float q and out, and
    float pools with q and out of `io` (float32 pools only: the io code is one branch)."""
    views = {
        "masked": (MASKED_VIEW, masked_token, masked_flags),
        "gathered": (GATHERED_VIEW, gathered_token, gathered_flags),
    }
    built = {}

    def kernels(mode: str, k_kind: str, v_kind: str, q_kind: str = "float",
                out_kind: str = "float"):  # fmt: skip
        key = (mode, k_kind, v_kind, q_kind, out_kind)
        if key not in built:
            view, token, flags = views[mode]
            name = f"attend_{mode}_{shape}{kind_name(k_kind, v_kind)}{io_name(q_kind, out_kind)}"
            pools = pool_dtypes(k_kind, v_kind)
            if (q_kind, out_kind) != ("float", "float"):
                pools = pools[:1]
            sigs = signatures(view, pools, io_signature(q_kind), io_signature(out_kind))
            rows = make_start_rows(q_kind), make_write_rows(out_kind)
            built[key] = kernel(sigs, name=name)(
                make(token, flags, make_load_tile(k_kind, v_kind), *rows)
            )
        return built[key]

    for mode in views:
        for pair in PAIRS:
            kernels(mode, *pair)
    kernels("gathered", "float", "float", *io)
    return kernels
