"""numba.cuda kernels of the device cache, one module per purpose, each registered for PTX.

`kernel(signatures)` jit-compiles a function lazily (decorated without a signature, which
needs no GPU at import) and records it with the signatures it must compile for, so that
the test suite can compile every kernel to PTX for every supported dtype. Launch geometry
lives in `launch`. Kernels know nothing of `CellCache`: they take device arrays and ints.
"""

import importlib
from collections.abc import Callable

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda

# name -> (python function, [signature, ...], jit options)
REGISTRY: dict[str, tuple[Callable, list, dict]] = {}

# every kernel module, imported by `load_all()` so that REGISTRY holds every kernel
MODULES = (
    "placement",
    "verbs",
    "masks",
    "seq_cells",
    "rows",
    "attention.decode",
    "attention.prefill",
    "attention.merge",
)


def kernel(signatures: list, name: str | None = None, **options) -> Callable:
    """Registers `fn` with the signatures it must compile for and returns `cuda.jit(fn)`.

    name : the registry key, default `module.qualname` (give one for kernels a factory makes)
    """

    def register(fn: Callable):
        if name is not None:  # a profiler shows the kernel by this name, not the factory's
            fn.__name__ = fn.__qualname__ = name
        key = f"{fn.__module__}.{fn.__qualname__}"
        REGISTRY[key] = (fn, signatures, options)
        if IS_SIMULATOR:  # the simulator's jit takes none of the compiler options
            return cuda.jit(fn)
        return cuda.jit(**options)(fn)

    return register


def device_function(fn: Callable) -> Callable:
    """A helper kernels call; inlined, which compiles with or without a GPU. In the simulator
    a helper that never names `cuda` stays a plain function: numba's device functions swap
    their module's `cuda` for the simulated one on every call, which costs a scan of the
    module's globals whenever no other call holds the swap."""
    if IS_SIMULATOR:
        return fn if "cuda" not in fn.__code__.co_names else cuda.jit(device=True)(fn)
    return cuda.jit(device=True, inline="always")(fn)


def load_all() -> dict[str, tuple[Callable, list, dict]]:
    """Imports every module of MODULES, so that REGISTRY holds every kernel; returns REGISTRY."""
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return REGISTRY


@device_function
def owner_bit(seq):
    """uint64 mask of sequence `seq` (>= 0) in its owner word, which is word `seq >> 6`."""
    # explicit uint64 on both sides: uint64 << int32 raises in the simulator and mixing
    # signed and unsigned promotes to float64 on a GPU
    return np.uint64(1) << np.uint64(seq & 63)
