"""Two fixes to numba's CUDA simulator (numba-cuda 0.30) and the warp primitives it lacks,
applied process-wide to numba's simulator classes by `install` (which `numbakv.cache.cuda`
calls at import when numbakv runs on the simulator); `uninstall` puts numba's own back.
docs/simulator.md is the report on both bugs: reproducers, measurements and the patches
suggested upstream.

- Shared arrays (`FakeCUDAShared.array`): numba keys each `cuda.shared.array` by its
  caller's file and line, looks the key up and, when it is missing, creates the array and
  inserts it. The look-up and the insert are not one atomic step, so two threads of a
  block that both find the key missing each create their own array, and each then writes
  and reads its own copy of what should be the block's one array. Here the look-up and
  the insert hold one lock.
- The block runner (`BlockManager.run`): numba's polls every thread of a block in a loop
  that never blocks, holding the GIL while the threads it waits for need it. Here it waits
  up to POLL_S for one live thread to finish (`join`, which releases the GIL) between two
  looks at the threads. The simulator's rules are kept: when every live thread waits in
  `syncthreads` all of them are released; a thread's exception aborts every thread of the
  block and is raised in the launching thread.
- Warp primitives (`numbakv.cache.simulator_warp`, whose docstring gives their semantics):
  `cuda.shfl_sync`, `shfl_up_sync`, `shfl_down_sync`, `shfl_xor_sync`, `ballot_sync`,
  `all_sync`, `any_sync`, `eq_sync`, `match_any_sync`, `match_all_sync`, `syncwarp`,
  `activemask` and `lanemask_lt` are set on numba's `FakeCUDAModule` (numba's have none:
  AttributeError), and its `popc` counts a negative value's bits as a GPU does. The block
  runner keeps the block's warp meetings (`Warps`): it tells them of each thread that
  returns, and raises RuntimeError naming the primitive and the lanes when every live
  thread waits while a meeting lacks a lane, instead of hanging.
- While installed, the interpreter switches threads every SWITCH_INTERVAL_S instead of
  Python's 5 ms, so a simulated block's threads take turns finely.
"""

import sys
import threading

import numpy as np

from numbakv.cache import simulator_warp
from numbakv.cache.device import IS_SIMULATOR

POLL_S = 1e-4  # the block runner's longest wait between two looks at its threads, seconds
SWITCH_INTERVAL_S = 5e-4  # sys.setswitchinterval while installed, seconds
_originals: dict = {}  # (owner, attribute) -> numba's own value, while installed
_MISSING = object()  # numba's own value of an attribute numba does not have


def install() -> None:
    """Applies both fixes, the warp primitives and the switch interval; a second call
    changes nothing.

    Raises RuntimeError unless numbakv runs on numba's CUDA simulator."""
    if not IS_SIMULATOR:
        raise RuntimeError("the simulator fixes apply to numba's CUDA simulator only")
    if _originals:
        return
    from numba.cuda.simulator.kernel import BlockManager
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, FakeCUDAShared

    _originals[FakeCUDAShared, "array"] = FakeCUDAShared.array
    _originals[BlockManager, "run"] = BlockManager.run
    _originals[sys, "switchinterval"] = sys.getswitchinterval()
    FakeCUDAShared.array = _locked_shared_array(FakeCUDAShared.array)
    BlockManager.run = _waiting_block_run
    for name, function in simulator_warp.PATCHES.items():
        _originals[FakeCUDAModule, name] = FakeCUDAModule.__dict__.get(name, _MISSING)
        setattr(FakeCUDAModule, name, function)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def uninstall() -> None:
    """Puts numba's own shared arrays, block runner, `popc` and switch interval back and
    takes the warp primitives off; without the fixes installed it changes nothing."""
    for (owner, name), original in _originals.items():
        if owner is sys:
            sys.setswitchinterval(original)
        elif original is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _originals.clear()


def is_installed() -> bool:
    """Whether the fixes are in place (between `install` and `uninstall`)."""
    return bool(_originals)


def _locked_shared_array(numbas_array):
    """`FakeCUDAShared.array` whose look-up and insert are one step under a lock.

    Dynamic shared memory (shape 0) and the refusal of an alignment stay numba's own
    (`numbas_array`); the key is numba's, the caller's (file, line), read off its frame:
    numba's `traceback.extract_stack` gives the same pair but also reads the source line."""
    from numba.core.types import Type
    from numba.np.numpy_support import as_dtype

    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return numbas_array(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            if caller not in self._allocations:
                numpy_dtype = as_dtype(dtype) if isinstance(dtype, Type) else dtype
                self._allocations[caller] = np.empty(shape, numpy_dtype)
            return self._allocations[caller]

    return array


def _waiting_block_run(self, grid_point: tuple, *args) -> None:
    """`BlockManager.run` (one block at `grid_point`) that waits for its threads instead of
    polling them: up to POLL_S on the last live one between two looks. The block's warp
    meetings (`self.warps`) hear of each thread that returns; when not every live thread
    waits in syncthreads, they are asked whether the block is stuck."""
    from numba.cuda.simulator.kernel import BlockThread

    def target():
        self._f(*args)
        warps.returned(threading.current_thread())

    threads = [
        BlockThread(target, self, grid_point, thread_point, self._debug)
        for thread_point in np.ndindex(*self._block_dim)
    ]
    warps = self.warps = simulator_warp.Warps(threads)
    for thread in threads:
        thread.start()
    live = threads
    while live:
        live[-1].join(POLL_S)
        _raise_first(threads, warps)
        live = [t for t in live if t.is_alive()]
        if live and all(t.syncthreads_blocked for t in live):
            for t in live:
                t.syncthreads_blocked = False
                t.syncthreads_event.set()
        elif live and (stuck := warps.stuck(live)):
            _abort(threads, warps, stuck)
            raise RuntimeError(f"warp primitives deadlocked: {stuck}")
    _raise_first(threads, warps)


def _raise_first(threads: list, warps) -> None:
    """When a thread of the block has failed: aborts every thread (each raises at its next
    `syncthreads` or warp primitive) and raises the first failure, in thread order, with
    its traceback."""
    failed = next((t for t in threads if t.exception), None)
    if failed is None:
        return
    error, trace = failed.exception
    _abort(threads, warps, str(error))
    raise error.with_traceback(trace)


def _abort(threads: list, warps, why: str) -> None:
    """Wakes every thread of the block waiting in syncthreads or at a warp primitive to
    raise RuntimeError."""
    for t in threads:
        t.abort = True
        t.syncthreads_blocked = False
        t.syncthreads_event.set()
    warps.abort(why)
