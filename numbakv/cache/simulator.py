"""Two fixes to numba's CUDA simulator, installed process-wide by `numbakv.cache.cuda` when
numbakv's device cache runs on the simulator (`install`; `uninstall` puts numba's own back).

- Shared arrays: `cuda.shared.array` keys each array by its caller's file and line and
  creates it with an unlocked check-then-insert, so two threads of a block can get
  different arrays; here the check and the insert hold one lock.
- The block runner: it polls every thread of a block in a loop holding the GIL, so the
  threads it waits for run only in the gaps; here it joins one of them for POLL_S (the
  GIL released) between two looks. The rules are the simulator's: when every live thread
  waits in syncthreads all are released; a thread's exception aborts the others and is
  raised.
"""

import sys
import threading
import traceback

import numpy as np

from numbakv.cache.device import IS_SIMULATOR

POLL_S = 1e-4  # the block runner's wait between two looks at its threads
SWITCH_INTERVAL_S = 5e-4  # threads switch often: a simulated block's threads take turns finely
_originals: dict = {}  # (class, attribute) -> numba's own, while the fixes are installed


def install() -> None:
    """Installs both fixes and a finer thread switch interval (once; again is a no-op)."""
    if not IS_SIMULATOR:
        raise RuntimeError("the simulator fixes apply to numba's CUDA simulator only")
    if _originals:
        return
    from numba.cuda.simulator.kernel import BlockManager
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    _originals[FakeCUDAShared, "array"] = FakeCUDAShared.array
    _originals[BlockManager, "run"] = BlockManager.run
    _originals[sys, "switchinterval"] = sys.getswitchinterval()
    FakeCUDAShared.array = _locked_shared_array(FakeCUDAShared.array)
    BlockManager.run = _waiting_block_run
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def uninstall() -> None:
    """Puts numba's own shared arrays, block runner and switch interval back."""
    for (owner, name), original in _originals.items():
        if owner is sys:
            sys.setswitchinterval(original)
        else:
            setattr(owner, name, original)
    _originals.clear()


def is_installed() -> bool:
    return bool(_originals)


def _locked_shared_array(dynamic_or_checked):
    """`FakeCUDAShared.array` with its check-then-insert under one lock."""
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return dynamic_or_checked(self, shape, dtype, alignment)
        caller = traceback.extract_stack(sys._getframe(1), limit=1)[0][0:2]
        with lock:
            if caller not in self._allocations:
                self._allocations[caller] = np.empty(shape, _numpy_dtype(dtype))
            return self._allocations[caller]

    return array


def _numpy_dtype(dtype):
    from numba.np.numpy_support import as_dtype

    return np.dtype(dtype) if isinstance(dtype, (np.dtype, type, str)) else as_dtype(dtype)


def _waiting_block_run(self, grid_point, *args):
    """`BlockManager.run` that waits for its threads instead of spinning on them."""
    from numba.cuda.simulator.kernel import BlockThread

    threads = []
    for thread_point in np.ndindex(*self._block_dim):
        thread = BlockThread(lambda: self._f(*args), self, grid_point, thread_point,
                             self._debug)  # fmt: skip
        thread.start()
        threads.append(thread)
    live = threads
    while live:
        live[-1].join(POLL_S)
        _raise_first(threads)
        live = [t for t in live if t.is_alive()]
        if live and all(t.syncthreads_blocked for t in live):
            for t in live:
                t.syncthreads_blocked = False
                t.syncthreads_event.set()
    _raise_first(threads)


def _raise_first(threads) -> None:
    """Aborts every thread of the block and raises the first exception one of them hit."""
    failed = next((t for t in threads if t.exception), None)
    if failed is None:
        return
    for t in threads:
        t.abort = True
        t.syncthreads_blocked = False
        t.syncthreads_event.set()
    error, trace = failed.exception
    raise error.with_traceback(trace)
