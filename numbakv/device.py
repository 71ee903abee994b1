"""The device numbakv runs on, chosen once before numba is imported; the one owner of `cuda`.

Every other module takes `cuda` from here (`from numbakv.device import cuda`), so the
choice is made in one place. `NUMBAKV_DEVICE` picks:

    auto     a GPU when the CUDA driver reports one, the numba CUDA simulator otherwise
    gpu      a GPU, or DeviceError when there is none
    sim      the numba CUDA simulator (kernels run as Python threads on the CPU)
    compile  real numba.cuda without a GPU: kernels compile (`cuda.compile_ptx`) but
             cannot launch; what the PTX checks use
"""

import ctypes
import os
import sys

import numpy as np

from numbakv.errors import ConfigError

MODES = ("auto", "gpu", "sim", "compile")


def gpu_count() -> int:
    """GPUs the CUDA driver reports, asked through libcuda without importing numba."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    except OSError:
        return 0


def _choose_mode() -> str:
    wanted = os.environ.get("NUMBAKV_DEVICE", "auto").strip().lower() or "auto"
    if wanted not in MODES:
        raise ConfigError(f"NUMBAKV_DEVICE={wanted!r} is not one of {MODES}")
    if wanted == "auto":
        wanted = "gpu" if gpu_count() > 0 else "sim"
    elif wanted == "gpu" and gpu_count() == 0:
        raise ConfigError(
            "NUMBAKV_DEVICE=gpu but the CUDA driver reports no GPU; "
            "unset it (auto) or set NUMBAKV_DEVICE=sim to use the simulator"
        )
    simulate = wanted == "sim"
    if "numba" in sys.modules:
        import numba

        if bool(numba.config.ENABLE_CUDASIM) != simulate:
            raise ConfigError(
                f"numba was imported before numbakv with NUMBA_ENABLE_CUDASIM="
                f"{int(numba.config.ENABLE_CUDASIM)}, which contradicts NUMBAKV_DEVICE "
                f"mode {wanted!r}; import numbakv first or set the variables to agree"
            )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if simulate else "0"
    return wanted


MODE = _choose_mode()

from numba import cuda  # noqa: E402  (only after NUMBA_ENABLE_CUDASIM is set)

IS_SIMULATOR = MODE == "sim"


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


if IS_SIMULATOR:
    # the simulator busy-polls its threads holding the GIL; switching often is ~5x faster
    sys.setswitchinterval(5e-4)
    _lock_simulated_shared_arrays()


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


def device_address(array) -> int:
    """Where `array`'s data lives: its device pointer, or in the simulator its host buffer."""
    if IS_SIMULATOR:
        return array.copy_to_host.__self__._ary.__array_interface__["data"][0]
    return array.__cuda_array_interface__["data"][0]
