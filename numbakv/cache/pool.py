"""`DevicePool`: every layer's K and V on the device, growing by docs/contract.md §4's rule,
transactionally."""

from collections.abc import Callable

import numpy as np

from numbakv.cache.cuda import DRIVER_ERRORS, cuda
from numbakv.cache.kernels import storage
from numbakv.core.config import CacheConfig
from numbakv.core.errors import AllocationError

Allocator = Callable[[tuple[int, ...], np.dtype], object]  # (shape, dtype) -> device array
ALLOCATION_ERRORS = (MemoryError, AllocationError, *DRIVER_ERRORS)


def device_allocator(shape: tuple[int, ...], dtype: np.dtype):
    """The default allocator: uninitialised device memory (unwritten rows hold garbage)."""
    return cuda.device_array(shape, dtype=dtype)


class DevicePool:
    """K and V of every layer, cell-major: `k[layer]`, `v[layer]` are device arrays
    [rows, n_kv_heads, row_width] in the layer's K and V formats (docs/contract.md §4.1).

    rows       : cells allocated, 0 until the first step
    generation : changes exactly when storage moves (the first allocation and each growth)
    allocator  : (shape, dtype) -> device array; raising MemoryError, AllocationError or the
                 driver's out-of-memory error refuses the growth
    kinds      : per layer (K kind, V kind) of `storage.KINDS`: which kernels read it
    scales     : per layer a [2, n_kv_heads] float32 device array, fp8's K and V scales
                 (views of one array uploaded when the cache is made; ones for other formats)
    """

    def __init__(self, config: CacheConfig, allocator: Allocator = device_allocator):
        self.config = config
        self.allocator = allocator
        self.k: list = [None] * config.n_layers
        self.v: list = [None] * config.n_layers
        self.rows = 0
        self.generation = 0
        self.growth_count = 0
        self.kinds = [(storage.kind(k), storage.kind(v)) for k, v in config.formats]
        every = np.stack([[config.fp8_scale(i, 0), config.fp8_scale(i, 1)]
                          for i in range(config.n_layers)])  # fmt: skip
        self._scales = cuda.to_device(np.ascontiguousarray(every, np.float32))
        self.scales = [self._scales[i] for i in range(config.n_layers)]

    @property
    def allocated_bytes(self) -> int:
        """Bytes of K and V storage over all layers."""
        return self.rows * self.config.cell_bytes

    def grow_to(self, required: int, read_len: int, stream=None) -> None:
        """Makes rows >= required, keeping rows [0, read_len) bit-exact (copied on `stream`).

        Rows grow to max(initial_cells, required) the first time, later to
        min(capacity, max(required, 2 * rows)). Every new array is allocated before any row
        is copied (device to device) or any old array dropped, so a refused allocation
        (AllocationError) leaves the pool as it was.
        """
        if required <= self.rows:
            return
        if self.rows == 0:
            rows = max(self.config.initial_cells, required)
        else:
            rows = min(self.config.capacity, max(required, 2 * self.rows))
        cfg, n = self.config, self.config.n_layers
        try:
            fresh = [
                self.allocator(cfg.pool_shape(i, which, rows), cfg.pool_dtype(i, which))
                for which in (0, 1)
                for i in range(n)
            ]
        except ALLOCATION_ERRORS as error:
            n_bytes = rows * self.config.cell_bytes
            raise AllocationError(
                f"could not allocate {rows} rows of K/V ({n_bytes} bytes) on the device to "
                f"grow from {self.rows}; free sequences or lower capacity, then retry the step"
            ) from error
        if self.rows and read_len:
            stream = cuda.default_stream() if stream is None else stream
            for new, old in zip(fresh, self.k + self.v, strict=True):
                new[:read_len].copy_to_device(old[:read_len], stream=stream)
            # the old arrays go once the copies have read them (an allocator's memory may be
            # reused at once on another stream); growth is rare, so waiting costs little
            stream.synchronize()
        self.k, self.v = fresh[:n], fresh[n:]
        if self.rows:
            self.growth_count += 1
        self.rows = rows
        self.generation += 1
