"""Which device numbakv runs on, decided once and before numba is imported.

numba reads `NUMBA_ENABLE_CUDASIM` once, at `import numba`, so this module sets it from
`NUMBAKV_DEVICE` without importing numba; every module of the device cache that imports
numba (the njit host table, `cuda`) imports this one first. `NUMBAKV_DEVICE` picks:

    auto     a GPU when the CUDA driver reports one, the numba CUDA simulator otherwise
    gpu      a GPU, or ConfigError when there is none
    sim      the numba CUDA simulator (kernels run as Python threads on the CPU)
    compile  real numba.cuda without a GPU: kernels compile (`cuda.compile_ptx`) but
             cannot launch; what the PTX checks use
"""

import ctypes
import os
import sys

from numbakv.core.errors import ConfigError

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
    numba = sys.modules.get("numba")
    if numba is not None and bool(numba.config.ENABLE_CUDASIM) != simulate:
        raise ConfigError(
            f"numba was imported before numbakv with NUMBA_ENABLE_CUDASIM="
            f"{int(numba.config.ENABLE_CUDASIM)}, which contradicts NUMBAKV_DEVICE "
            f"mode {wanted!r}; import numbakv first or set the variables to agree"
        )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if simulate else "0"
    return wanted


MODE = _choose_mode()
IS_SIMULATOR = MODE == "sim"
