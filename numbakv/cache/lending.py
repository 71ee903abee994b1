"""`Lender`: the device arrays a call makes for its caller, taken back once the caller drops
them, so that steps without `out=` or with host inputs allocate nothing once warm
(docs/contract.md §8.1).

`attend` without `out=` returns a lent array, and `write`/`attend` upload host arrays into
lent arrays. A lent array is a view of a block the lender keeps: blocks are kept per
(stream, dtype, row shape, rows), the rows of a request rounded up to a power of two (at
most `max_rows`), so any width finds one of a few sizes. A block goes back to its free list
when the array lent from it and every view of that array are gone (`cuda.lend`), and is
lent again only on the same stream, whose order puts the next call's work after the last
one's. Up to KEEP free blocks of a kind are kept; more are freed.

This is a caching allocator's contract, as torch's is: what is lent is the caller's until
they drop it, and a caller reading it on another stream keeps it until that read is done.
"""

import numpy as np

from numbakv.cache.cuda import cuda, lend, stream_handle

KEEP = 4  # free blocks kept per kind: a layer's result held while the next is made, and more


def rows_for(width: int, max_rows: int) -> int:
    """The rows of the block that serves `width` rows: the power of two at or above it,
    at most max_rows (and at least width)."""
    rows = 1
    while rows < width:
        rows *= 2
    return max(width, min(rows, max_rows))


class Lender:
    """Lends device arrays `[rows, *row_shape]` of blocks it keeps (module docstring)."""

    def __init__(self, max_rows: int):
        """max_rows: the most rows any request has (the cache's max_width)."""
        self.max_rows = max_rows
        self._free: dict[tuple, list] = {}
        self.blocks_made = 0

    def empty(self, shape: tuple[int, ...], dtype, stream):
        """A lent C-contiguous device array of `shape` and `dtype` on `stream`, uninitialised;
        an allocation only when no free block of its kind is kept."""
        rows = rows_for(shape[0], self.max_rows)
        kind = (stream_handle(stream), np.dtype(dtype).str, rows, tuple(shape[1:]))
        free = self._free.setdefault(kind, [])
        if free:
            block = free.pop()
        else:
            block = cuda.device_array((rows, *shape[1:]), dtype, stream=stream)
            self.blocks_made += 1
        return lend(block, tuple(shape), stream, lambda: self._returned(kind, block))

    def upload(self, host: np.ndarray, stream):
        """`host` (C-contiguous) copied into a lent device array on `stream`."""
        array = self.empty(host.shape, host.dtype, stream)
        array.copy_to_device(host, stream=stream)
        return array

    def _returned(self, kind: tuple, block) -> None:
        free = self._free.setdefault(kind, [])
        if len(free) < KEEP:
            free.append(block)

    def free_blocks(self) -> int:
        """How many blocks are kept free now."""
        return sum(len(free) for free in self._free.values())
