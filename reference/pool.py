"""The KV pool of docs/contract.md §4: per layer one K and one V array that grow, never shrink."""

from collections.abc import Callable

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import AllocationError
from numbakv.core.formats import ARRAY_DTYPES

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
    """K and V of every layer, cell-major: `k[layer]`, `v[layer]` are [rows, n_kv_heads,
    row_width] in the layer's K and V formats (`config.formats`, docs/contract.md §4.1).

    rows starts at 0 and grows by `grow_to`; `allocator(shape, dtype)` makes every array
    and may raise MemoryError or AllocationError to refuse (tests inject one that does).
    """

    def __init__(self, config: CacheConfig, allocator: Allocator = numpy_allocator):
        self.config = config
        self.allocator = allocator
        layers = range(config.n_layers)
        self.k, self.v = ([self._array(i, which, 0, np.zeros) for i in layers] for which in (0, 1))
        self.rows = 0
        self.generation = 0
        self.growth_count = 0

    @property
    def allocated_bytes(self) -> int:
        """Bytes of K and V storage over all layers."""
        return self.rows * self.config.cell_bytes

    def grow_to(self, required: int, read_len: int) -> None:
        """Makes rows >= required, keeping rows [0, read_len) bit-exact.

        Transactional: every new array is allocated before any is copied, so an
        AllocationError leaves the pool as it was.
        """
        if required <= self.rows:
            return
        rows = grown_rows(self.config, self.rows, required)
        n = self.config.n_layers
        try:
            fresh = [self._array(layer, which, rows, self.allocator)
                     for which in (0, 1) for layer in range(n)]  # fmt: skip
        except (MemoryError, AllocationError) as error:
            n_bytes = rows * self.config.cell_bytes
            raise AllocationError(
                f"could not allocate {rows} rows of K/V ({n_bytes} bytes) to grow from "
                f"{self.rows}; free sequences or lower capacity, then retry the step"
            ) from error
        for new, old in zip(fresh, self.k + self.v, strict=True):
            new[:read_len] = old[:read_len]
        self.k, self.v = fresh[:n], fresh[n:]
        if self.rows:
            self.growth_count += 1
        self.rows = rows
        self.generation += 1

    def _array(self, layer: int, which: int, rows: int, allocator) -> np.ndarray:
        """A new K (which 0) or V (1) array of `layer` with `rows` rows, by `allocator`."""
        fmt = self.config.formats[layer][which]
        return allocator(self.config.pool_shape(layer, which, rows), ARRAY_DTYPES[fmt])

    def scales(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """fp8's (K scales, V scales) of `layer`, each [n_kv_heads] float32."""
        return self.config.fp8_scale(layer, 0), self.config.fp8_scale(layer, 1)

    def write(self, layer: int, cells: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Stores k, v ([n, n_kv_heads, head_dim] float32) into rows `cells` ([n] int) of
        `layer`, in the layer's formats."""
        (k_dtype, v_dtype), (k_scales, v_scales) = self.config.formats[layer], self.scales(layer)
        self.k[layer][cells] = to_storage(k, k_dtype, k_scales)
        self.v[layer][cells] = to_storage(v, v_dtype, v_scales)
