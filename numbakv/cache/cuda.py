"""The one module that imports `numba.cuda`: every other module takes `cuda` from here.

The device is chosen first (`numbakv.cache.device`, which sets numba's simulator flag
from NUMBAKV_DEVICE before numba is imported), so a move to another CUDA binding for
Python is a change to this file. Here too: `device_info`, the driver's out-of-memory
error the pool turns into `AllocationError`, a device array over a DLPack export
(`wrap_export`), the two cuda.core calls a CUDA graph needs,
and, on the simulator, the fixes of `numbakv.cache.simulator`, installed at import.
"""

import numpy as np

from numbakv.cache.device import IS_SIMULATOR, MODE
from numbakv.dlpack import Exported, host_view, storage_dtype

from numba import cuda  # isort: skip  (only after the device module set NUMBA_ENABLE_CUDASIM)

if IS_SIMULATOR:
    from numba.cuda.simulator.api import stream as STREAM_TYPE  # the class of its streams

    from numbakv.cache import simulator

    simulator.install()
    DRIVER_ERRORS: tuple[type[BaseException], ...] = ()

    # the simulator has no libdevice (its functions return None): NumPy's view is the same cast
    def float_as_int(x):
        """The bits of float32 x as an int32."""
        return np.float32(x).view(np.int32)

    def int_as_float(bits):
        """The float32 whose bits are int32 `bits`."""
        return np.int32(bits).view(np.float32)

    def mul_rn(x, y):
        """x * y in float32, rounded once (never fused into an fma on a GPU)."""
        return np.float32(np.float32(x) * np.float32(y))

    def add_rn(x, y):
        """x + y in float32, rounded once (never fused into an fma on a GPU)."""
        return np.float32(np.float32(x) + np.float32(y))

else:  # out of device memory comes as the driver's API error
    from numba.cuda.cudadrv.driver import CudaAPIError
    from numba.cuda.cudadrv.driver import Stream as STREAM_TYPE  # noqa: F401
    from numba.cuda.libdevice import fadd_rn as add_rn  # noqa: F401
    from numba.cuda.libdevice import float_as_int, int_as_float  # noqa: F401
    from numba.cuda.libdevice import fmul_rn as mul_rn  # noqa: F401

    DRIVER_ERRORS = (CudaAPIError,)


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


def cuda_versions() -> dict[str, object]:
    """{"driver": ..., "runtime": ...}: the CUDA driver's and runtime's (NVRTC's) versions
    as numba reports them (a GPU, or compile mode with the toolkit's libraries)."""
    from numba.cuda.cudadrv import driver, runtime

    return {"driver": driver.driver.get_version(), "runtime": runtime.runtime.get_version()}


def ordering_event():
    """A CUDA event without timing, for ordering work (the simulator's takes no options)."""
    return cuda.event() if IS_SIMULATOR else cuda.event(timing=False)


def is_done(event) -> bool:
    """Whether the work before `event` has finished, without waiting (the simulator's work
    always has: it runs each launch and copy to completion before returning)."""
    return IS_SIMULATOR or event.query()


def wrap_export(exported: Exported):
    """A numba device array over a DLPack export's memory, no copy (bfloat16 as its uint16
    patterns); it holds the exporter alive. The simulator's device memory is host memory, so
    there the export's address is read as a host buffer (`dlpack.host_view`)."""
    if IS_SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(host_view(exported))
    interface = {
        "shape": exported.shape,
        "strides": exported.strides,
        "typestr": storage_dtype(exported.dtype).str,
        "data": (exported.address, False),
        "version": 3,
    }
    return cuda.from_cuda_array_interface(interface, owner=exported.owner, sync=False)


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
