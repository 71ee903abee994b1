"""The one module that imports `numba.cuda`: every other module takes `cuda` from here.

The device is chosen first (`numbakv.cache.device`, which sets numba's simulator flag
from NUMBAKV_DEVICE before numba is imported), so a move to another CUDA binding for
Python is a change to this file. Here too: the simulator's fixes, `device_info`, and the
driver's out-of-memory error the pool turns into `AllocationError`.
"""

import sys

import numpy as np

# MODES and gpu_count: numbakv.device of 0.1 held them, and that old path now leads here
from numbakv.cache.device import IS_SIMULATOR, MODE, MODES, gpu_count  # noqa: F401

from numba import cuda  # isort: skip  (only after the device module set NUMBA_ENABLE_CUDASIM)

if IS_SIMULATOR:
    from numba.cuda.simulator.api import stream as STREAM_TYPE  # the class of its streams

    DRIVER_ERRORS: tuple[type[BaseException], ...] = ()

    # the simulator has no libdevice (its functions return None): NumPy's view is the same cast
    def float_as_int(x):
        """The bits of float32 x as an int32."""
        return np.float32(x).view(np.int32)

    def int_as_float(bits):
        """The float32 whose bits are int32 `bits`."""
        return np.int32(bits).view(np.float32)

else:  # out of device memory comes as the driver's API error
    from numba.cuda.cudadrv.driver import CudaAPIError
    from numba.cuda.cudadrv.driver import Stream as STREAM_TYPE  # noqa: F401
    from numba.cuda.libdevice import float_as_int, int_as_float  # noqa: F401

    DRIVER_ERRORS = (CudaAPIError,)


def _lock_simulated_shared_arrays() -> None:
    """Makes the simulator's `cuda.shared.array` thread-safe.

    It keys each shared array by its caller's file and line and creates it with an
    unlocked check-then-insert, so two threads of a block can get different arrays
    (seen as wrong results in about 1 of 10 fresh runs of a shared-memory kernel).
    """
    import threading
    import traceback

    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    dynamic_or_checked = FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return dynamic_or_checked(self, shape, dtype, alignment)
        caller = traceback.extract_stack(sys._getframe(1), limit=1)[0][0:2]
        with lock:
            if caller not in self._allocations:
                self._allocations[caller] = np.empty(shape, _numpy_dtype(dtype))
            return self._allocations[caller]

    FakeCUDAShared.array = array


def _numpy_dtype(dtype):
    from numba.np.numpy_support import as_dtype

    return np.dtype(dtype) if isinstance(dtype, (np.dtype, type, str)) else as_dtype(dtype)


def _wait_for_simulated_threads() -> None:
    """Makes the simulator's block runner wait for its threads instead of spinning.

    It polls every thread of a block in a loop holding the GIL, so the threads it waits for
    run in the gaps; here it joins one of them for POLL_S (the GIL released) between two
    looks. The rules are the simulator's: when every live thread waits in syncthreads,
    all are released; a thread's exception aborts the others and is raised.
    """
    from numba.cuda.simulator.kernel import BlockManager, BlockThread

    def run(self, grid_point, *args):
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

    BlockManager.run = run


POLL_S = 1e-4  # the block runner's wait between two looks at its threads


def _raise_first(threads) -> None:
    """Aborts every thread of the block and raises the first exception one of them hit."""
    failed = next((t for t in threads if t.exception), None)
    if failed is None:
        return
    for t in threads:
        t.abort = True
        t.syncthreads_blocked = False
        t.syncthreads_event.set()
    error, traceback = failed.exception
    raise error.with_traceback(traceback)


if IS_SIMULATOR:
    # threads switch often: a simulated block's threads take turns at a fine grain
    sys.setswitchinterval(5e-4)
    _lock_simulated_shared_arrays()
    _wait_for_simulated_threads()


def device_info() -> dict:
    """Which device is in use: {"mode": ..., "name": ..., "compute_capability": (major, minor)}."""
    if MODE == "gpu":
        device = cuda.get_current_device()
        return {
            "mode": MODE,
            "name": device.name.decode() if isinstance(device.name, bytes) else device.name,
            "compute_capability": device.compute_capability,
        }
    name = "numba CUDA simulator" if IS_SIMULATOR else "compile only (no GPU)"
    return {"mode": MODE, "name": name, "compute_capability": None}


def ordering_event():
    """A CUDA event without timing, for ordering work (the simulator's takes no options)."""
    return cuda.event() if IS_SIMULATOR else cuda.event(timing=False)


def is_done(event) -> bool:
    """Whether the work before `event` has finished, without waiting (the simulator's work
    always has: it runs each launch and copy to completion before returning)."""
    return IS_SIMULATOR or event.query()


def device_address(array) -> int:
    """Where `array`'s data lives: its device pointer, or in the simulator its host buffer."""
    if IS_SIMULATOR:
        return array._ary.__array_interface__["data"][0]
    return array.__cuda_array_interface__["data"][0]


def stream_handle(stream) -> int:
    """The raw handle of a numba stream (0, 1, 2: the default streams)."""
    return 0 if IS_SIMULATOR else int(stream.__cuda_stream__()[1])


def begin_graph(stream):
    """A cuda.core GraphBuilder capturing `stream` (a numba stream, not a default one), begun
    in thread-local mode: an allocation or synchronous copy in this thread while it builds
    fails the capture instead of running outside the graph."""
    from cuda.core import Device, Stream

    Device(cuda.get_current_device().id).set_current()
    builder = Stream.from_handle(stream_handle(stream)).create_graph_builder()
    return builder.begin_building("thread_local")


def launch_graph(graph, stream) -> None:
    """Launches a completed cuda.core graph on the numba stream `stream`."""
    from cuda.core import Stream

    graph.launch(Stream.from_handle(stream_handle(stream)))
