"""Saved sequences on the device (docs/contract.md §13): whole pool rows gathered into a
staging buffer, and scattered back, as words.

A pool row of a layer is a cell's K (or V) over every KV head, in the layer's storage
format: `row_bytes` bytes. Both kernels copy rows as they are stored, never reading a value,
so one kernel serves every format: the pools and the staging rows are viewed as words of
the widest size dividing both rows' bytes (`word_dtype`), so that a thread moves 8 bytes
where it can, not 1.
"""

import math

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel
from numbakv.cache.kernels.launch import check_extent, launch, launch_dims

WORDS = ("uint64", "uint32", "uint16", "uint8")  # widest first
# gather: k_pool, v_pool, cells, k_rows, v_rows; scatter: k_rows, v_rows, cells, k_pool, v_pool
SIGNATURES = [f"void({w}[:, ::1], {w}[:, ::1], int32[::1], {w}[:, ::1], {w}[:, ::1])"
              for w in WORDS]  # fmt: skip


def word_dtype(*n_bytes: int) -> np.dtype:
    """The widest unsigned word whose size divides every entry of `n_bytes`."""
    for name in WORDS:
        dtype = np.dtype(name)
        if all(n % dtype.itemsize == 0 for n in n_bytes):
            return dtype
    raise AssertionError("uint8 divides every size")


def make_copy_rows(gather: bool):
    """The kernel that copies whole rows between a pool and a staging buffer: gathering
    (pool rows cells[t] into staging row t) or scattering (staging row t into pool row
    cells[t]). A closure constant picks the direction."""

    def copy_rows(k_from, v_from, cells, k_to, v_to):
        # gather: k_from [rows, k_words] pool, k_to [n, k_words] staging; scatter: the other
        # way round; v alike; cells: [>= n] int32 distinct pool rows; one item per word
        k_rows = k_to if gather else k_from
        n, kw = k_rows.shape[0], k_rows.shape[1]
        row = kw + v_to.shape[1]
        for i in range(cuda.grid(1), n * row, cuda.gridsize(1)):
            t = i // row
            j = i - t * row
            src = cells[t] if gather else t
            dst = t if gather else cells[t]
            if j < kw:
                k_to[dst, j] = k_from[src, j]
            else:
                v_to[dst, j - kw] = v_from[src, j - kw]

    return copy_rows


gather_rows = kernel(SIGNATURES, name="gather_rows")(make_copy_rows(gather=True))
scatter_rows = kernel(SIGNATURES, name="scatter_rows")(make_copy_rows(gather=False))


def as_words(array, dtype: np.dtype):
    """A C-contiguous device array [rows, ...] viewed as [rows, row bytes / word] of `dtype`
    (the word's size divides the row's bytes)."""
    shape = tuple(array.shape)
    return array.reshape(shape[0], math.prod(shape[1:])).view(dtype)


def launch_gather_rows(k_pool, v_pool, cells, k_rows, v_rows, stream=0) -> None:
    """Copies rows `cells` of k_pool and v_pool into k_rows and v_rows.

    k_pool, v_pool : device arrays [rows, k_words], [rows, v_words] of one word dtype
    cells          : device array [>= n] int32, each in [0, rows)
    k_rows, v_rows : device arrays [n, k_words], [n, v_words] of that dtype
    """
    _launch(gather_rows, (k_pool, v_pool, cells, k_rows, v_rows), k_rows, v_rows, stream)


def launch_scatter_rows(k_rows, v_rows, cells, k_pool, v_pool, stream=0) -> None:
    """Copies k_rows and v_rows into rows `cells` (distinct) of k_pool and v_pool; shapes
    as `launch_gather_rows`'."""
    _launch(scatter_rows, (k_rows, v_rows, cells, k_pool, v_pool), k_rows, v_rows, stream)


def _launch(fn, args: tuple, k_rows, v_rows, stream) -> None:
    """Launches `fn` over every word of the staged rows k_rows and v_rows ([n, words])."""
    n = k_rows.shape[0]
    check_extent("n", n, len(args[2]), v_rows.shape[0])
    n_items = n * (k_rows.shape[1] + v_rows.shape[1])
    if n_items:
        grid, threads = launch_dims(n_items)
        launch(fn, grid, threads, stream, *args)
