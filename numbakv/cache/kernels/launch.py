"""The one launch path and its geometry, one system for every kernel.

`launch(kernel, grid, threads, stream, *args)` is how every numbakv kernel (the cache's and
the device model's) is launched. Eagerly it is `kernel[grid, threads, stream](*args)`; while
a `Recorder` is active in the thread (`recording`), the recorder takes the launch instead:
it runs it and keeps it to re-issue (the simulator), or sends it into a CUDA graph being
captured on the step's stream (a GPU). So a captured step holds exactly what was launched.

Every kernel loops grid-stride over its items, so any grid covers any size: on a GPU the
grid is sized to fill the multiprocessors; in the simulator, where each thread is a Python
thread (~0.2 ms per simulated thread per launch), grids and blocks stay tiny.
"""

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Protocol

from numbakv.cache.cuda import IS_SIMULATOR, cuda

THREADS = 256  # threads per block of the element-wise kernels on a GPU
SIM_THREADS = 32  # ... in the simulator
ATTN_THREADS = 128  # threads per block of the attention kernels on a GPU
SIM_ATTN_THREADS = 16  # ... in the simulator
SIM_BLOCKS = 2  # blocks per grid dimension of the attention kernels in the simulator
BLOCKS_PER_SM = 8  # resident blocks that hide latency on a GPU; grid-stride covers the rest
MAX_GRID_X = 2**31 - 1  # CUDA's limit on gridDim.x
MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z


class Recorder(Protocol):
    """What takes the launches of a thread while it records (`numbakv.cache.graph`)."""

    def launch(self, kernel, grid, threads, stream, args: tuple) -> None: ...


_active = threading.local()  # .recorder: the Recorder of this thread, or absent


def launch(kernel, grid, threads, stream, *args) -> None:
    """Launches `kernel` over `grid` blocks of `threads` on `stream` with `args`, or hands the
    launch to the thread's active recorder."""
    recorder = getattr(_active, "recorder", None)
    if recorder is None:
        kernel[grid, threads, stream](*args)
    else:
        recorder.launch(kernel, grid, threads, stream, args)


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Every `launch` of this thread goes to `recorder` inside the block (not nested)."""
    if getattr(_active, "recorder", None) is not None:
        raise RuntimeError("a recording is already active in this thread")
    _active.recorder = recorder
    try:
        yield recorder
    finally:
        _active.recorder = None


def is_recording() -> bool:
    """Whether this thread's launches go to a recorder now."""
    return getattr(_active, "recorder", None) is not None


@functools.cache
def n_sms() -> int:
    """Multiprocessors of the device; 1 in the simulator."""
    if IS_SIMULATOR:
        return 1
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


def launch_dims(n_items: int, n_rows: int = 1) -> tuple[tuple[int, int], int]:
    """((blocks_x, blocks_y), threads per block) of an element-wise kernel over `n_items` (> 0).

    x strides over the items, y over `n_rows` independent rows (1 for a flat loop). In the
    simulator: one block of at most SIM_THREADS threads. On a GPU: THREADS per block, one
    block row per row up to MAX_GRID_YZ, and as many x blocks as the items need, up to
    BLOCKS_PER_SM per multiprocessor in all.
    """
    if IS_SIMULATOR:
        return (1, 1), min(SIM_THREADS, n_items)
    blocks_y = min(n_rows, MAX_GRID_YZ)
    blocks_x = min(-(-n_items // THREADS), max(1, BLOCKS_PER_SM * n_sms() // blocks_y))
    return (blocks_x, blocks_y), THREADS


def attention_grid(*sizes: int) -> tuple[tuple[int, ...], int]:
    """(grid, threads per block) of an attention kernel covering `sizes` (x, y, z) blocks:
    each capped by CUDA's limits on a GPU, at SIM_BLOCKS in the simulator (the kernels
    grid-stride over the rest)."""
    if IS_SIMULATOR:
        return tuple(min(SIM_BLOCKS, max(1, n)) for n in sizes), SIM_ATTN_THREADS
    x, *rest = sizes
    grid = (max(1, min(x, MAX_GRID_X)), *(max(1, min(n, MAX_GRID_YZ)) for n in rest))
    return grid, ATTN_THREADS


def check_extent(name: str, n: int, *sizes: int) -> None:
    """Raises ValueError unless 0 <= n <= every size: a launch must stay inside its arrays."""
    if not 0 <= n <= min(sizes):
        raise ValueError(f"{name}={n} is outside [0, {min(sizes)}], what its arrays hold")
