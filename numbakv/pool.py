"""The KV pool on the device (SPEC §4): the reference pool's growth rule and transactions,
with device arrays and device-to-device copies."""

import numpy as np

from numbakv.device import IS_SIMULATOR, cuda
from numbakv.reference.pool import KVPool

if IS_SIMULATOR:
    DRIVER_ERRORS: tuple[type[BaseException], ...] = ()
else:  # out of device memory comes as the driver's API error
    from numba.cuda.cudadrv.driver import CudaAPIError

    DRIVER_ERRORS = (CudaAPIError,)


def device_allocator(shape: tuple[int, ...], dtype: np.dtype):
    """The default allocator: uninitialised device memory (unwritten rows hold garbage)."""
    return cuda.device_array(shape, dtype=dtype)


class DevicePool(KVPool):
    """K and V of every layer on the device, cell-major: [rows, n_kv_heads, head_dim].

    Growth allocates every new array first, then copies rows [0, read_len) device to
    device, then swaps: an allocation failure (the driver's out-of-memory error too)
    leaves the pool as it was.
    """

    allocation_errors = (*KVPool.allocation_errors, *DRIVER_ERRORS)

    def __init__(self, config, allocator=device_allocator):
        super().__init__(config, allocator)

    @staticmethod
    def _copy_rows(new, old, n: int) -> None:
        if n:
            new[:n].copy_to_device(old[:n])
