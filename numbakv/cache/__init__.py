"""numbakv.cache: the device cell cache — the njit host table, the pool, the fixed buffers and
the numba.cuda kernels — behind `CellCache`.

Its public classes are `numbakv`'s names (`numbakv.CellCache`, `Step`, `Bindings`,
`StepGraph`, `device_info`). Importing this package imports nothing: `StepBuffers`,
`DevicePool`, `device_allocator`, `HostTable` and `device_address` are resolved on first use
(which picks the device and imports numba.cuda), and `numbakv.cache.table` is the host table
alone, with numba's njit but no numba.cuda. It never imports `numbakv.reference` or `numbakv.serve`.
"""

from importlib import import_module

_EXPORTS = {
    "StepBuffers": "numbakv.cache.buffers",
    "DevicePool": "numbakv.cache.pool",
    "device_allocator": "numbakv.cache.pool",
    "HostTable": "numbakv.cache.table",
    "device_address": "numbakv.cache.cuda",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'numbakv.cache' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
