"""The KV pool of docs/contract.md §4: per layer one K and one V array that grow, never shrink."""

from collections.abc import Callable

import numpy as np

from numbakv.config import CacheConfig
from numbakv.errors import AllocationError

from .storage import to_storage

Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def numpy_allocator(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The default allocator: zeroed host memory."""
    return np.zeros(shape, dtype=dtype)


def grown_rows(config: CacheConfig, rows: int, required: int) -> int:
    """The rows after growing from `rows` (< required) to hold `required` cells: the first
    allocation max(initial_cells, required), later min(capacity, max(required, 2 * rows))."""
    if rows == 0:
        return max(config.initial_cells, required)
    return min(config.capacity, max(required, 2 * rows))


class KVPool:
    """K and V of every layer, cell-major: `k[layer]`, `v[layer]` are [rows, n_kv_heads, head_dim]
    of `config.storage_dtype` (uint16 bit patterns for bfloat16, see `storage`).

    rows starts at 0 and grows by `grow_to`; `allocator(shape, dtype)` makes every array
    and may raise MemoryError or AllocationError to refuse (tests inject one that does).
    """

    def __init__(self, config: CacheConfig, allocator: Allocator = numpy_allocator):
        self.config = config
        self.allocator = allocator
        empty = np.zeros((0, config.n_kv_heads, config.head_dim), dtype=config.storage_dtype)
        self.k = [empty] * config.n_layers
        self.v = [empty] * config.n_layers
        self.rows = 0
        self.generation = 0
        self.growth_count = 0

    @property
    def allocated_bytes(self) -> int:
        """Bytes of K and V storage over all layers."""
        return self.rows * self.config.n_layers * self.config.row_bytes

    def grow_to(self, required: int, read_len: int) -> None:
        """Makes rows >= required, keeping rows [0, read_len) bit-exact.

        Transactional: every new array is allocated before any is copied, so an
        AllocationError leaves the pool as it was.
        """
        if required <= self.rows:
            return
        rows = grown_rows(self.config, self.rows, required)
        shape = (rows, self.config.n_kv_heads, self.config.head_dim)
        try:
            fresh = [
                self.allocator(shape, self.config.storage_dtype)
                for _ in range(2 * self.config.n_layers)
            ]
        except (MemoryError, AllocationError) as error:
            n_bytes = rows * self.config.n_layers * self.config.row_bytes
            raise AllocationError(
                f"could not allocate {rows} rows of K/V ({n_bytes} bytes) to grow from "
                f"{self.rows}; free sequences or lower capacity, then retry the step"
            ) from error
        for new, old in zip(fresh, self.k + self.v, strict=True):
            new[:read_len] = old[:read_len]
        n = self.config.n_layers
        self.k, self.v = fresh[:n], fresh[n:]
        if self.rows:
            self.growth_count += 1
        self.rows = rows
        self.generation += 1

    def write(self, layer: int, cells: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Stores k, v ([n, n_kv_heads, head_dim] float32) into rows `cells` ([n] int) of
        `layer`, rounded to the storage dtype."""
        self.k[layer][cells] = to_storage(k, self.config.dtype)
        self.v[layer][cells] = to_storage(v, self.config.dtype)
