"""numba.cuda kernels, one module per purpose; every kernel is registered for the PTX check.

`kernel(signatures)` jit-compiles a function lazily (decorated without a signature, which
needs no GPU at import) and records it with the signatures it must compile for, so the
test suite can compile every kernel to PTX for every supported dtype.
"""

import functools
import importlib
from collections.abc import Callable

import numpy as np

from numbakv.device import IS_SIMULATOR, cuda

# name -> (python function, [signature, ...], jit options)
REGISTRY: dict[str, tuple[Callable, list, dict]] = {}


def kernel(signatures: list, **options) -> Callable:
    """Registers `fn` with the signatures it must compile for and returns `cuda.jit(fn)`."""

    def register(fn: Callable):
        REGISTRY[f"{fn.__module__}.{fn.__qualname__}"] = (fn, signatures, options)
        if IS_SIMULATOR:  # the simulator's jit takes none of the compiler options
            return cuda.jit(fn)
        return cuda.jit(**options)(fn)

    return register


def device_function(fn: Callable) -> Callable:
    """A helper kernels call; inlined, which compiles with or without a GPU."""
    if IS_SIMULATOR:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, inline="always")(fn)


# every kernel module, imported by `load_all()` so that REGISTRY holds every kernel
MODULES = ("placement", "verbs", "masks", "seq_cells", "attention")

SIM_THREADS = 32  # one simulated block: each simulated thread costs ~0.2 ms per launch
THREADS = 256  # threads per block on a GPU
BLOCKS_PER_SM = 8  # enough resident blocks to hide latency on a GPU; grid-stride covers the rest
MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y


def load_all() -> dict[str, tuple[Callable, list, dict]]:
    """Imports every module of MODULES, so that REGISTRY holds every kernel; returns REGISTRY."""
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
    return REGISTRY


@functools.cache
def _n_sms() -> int:
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def launch_dims(n_items: int, n_rows: int = 1) -> tuple[tuple[int, int], int]:
    """((blocks_x, blocks_y), threads per block) for grid-stride loops over `n_items` (> 0).

    x strides over the items, y over `n_rows` independent rows (1 for a flat loop). In the
    simulator: one block of at most SIM_THREADS threads, since every simulated thread is a
    Python thread. On a GPU: THREADS per block, one block row per row up to 65535, and as
    many x blocks as the items need, up to BLOCKS_PER_SM per multiprocessor in all.
    """
    if IS_SIMULATOR:
        return (1, 1), min(SIM_THREADS, n_items)
    blocks_y = min(n_rows, MAX_GRID_Y)
    blocks_x = min(-(-n_items // THREADS), max(1, BLOCKS_PER_SM * _n_sms() // blocks_y))
    return (blocks_x, blocks_y), THREADS


def check_extent(name: str, n: int, *sizes: int) -> None:
    """Raises ValueError unless 0 <= n <= every size: a launch must stay inside its arrays."""
    if not 0 <= n <= min(sizes):
        raise ValueError(f"{name}={n} is outside [0, {min(sizes)}], what its arrays hold")


@device_function
def owner_bit(seq):
    """uint64 mask of sequence `seq` (>= 0) in its owner word, which is word `seq >> 6`."""
    # explicit uint64 on both sides: uint64 << int32 raises in the simulator and mixing
    # signed and unsigned promotes to float64 on a GPU
    return np.uint64(1) << np.uint64(seq & 63)
