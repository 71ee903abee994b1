"""What `write` and `attend` of the device cache take: any real float array on the host, or a
device array (anything with `__cuda_array_interface__`) of a dtype the kernels read."""

import numpy as np

from numbakv.cache._cuda import cuda
from numbakv.checks import check_float_dtype, host_floats
from numbakv.errors import StepError

KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # what the scatter kernels read
Q_DTYPES = (np.dtype(np.float32),)  # what the attention kernels read


def is_device_array(x) -> bool:
    return hasattr(x, "copy_to_host") or hasattr(x, "__cuda_array_interface__")


def floats(name: str, x, dtypes: tuple[np.dtype, ...]):
    """x checked: a device array kept as it is (C-contiguous, one of `dtypes`), or a host
    array as NumPy (`checks.host_floats`), not yet uploaded."""
    if not is_device_array(x):
        return host_floats(name, x)
    if not hasattr(x, "copy_to_host"):
        x = cuda.as_cuda_array(x)
    check_float_dtype(name, x.dtype)
    if np.dtype(x.dtype) not in dtypes:
        raise StepError(
            f"{name} is a device array of {x.dtype}; give one of {[d.name for d in dtypes]} "
            "(host arrays of any float dtype are converted)"
        )
    if not x.is_c_contiguous():
        raise StepError(
            f"{name} is a device array with strides {x.strides}; give a C-contiguous one "
            "(.contiguous() in torch, cupy.ascontiguousarray)"
        )
    return x


def on_device(xs: list, dtypes: tuple[np.dtype, ...]) -> list:
    """The checked arrays `xs` (from `floats`) on the device, in one dtype: the dtype they
    share when it is one of `dtypes`, else float32 (host arrays are rounded to it, device
    arrays must already have it)."""
    shared = {np.dtype(x.dtype) for x in xs}
    common = shared.pop() if len(shared) == 1 else np.dtype(np.float32)
    if common not in dtypes:
        common = np.dtype(np.float32)
    placed = []
    for x in xs:
        if isinstance(x, np.ndarray):
            placed.append(cuda.to_device(np.ascontiguousarray(x, dtype=common)))
        elif np.dtype(x.dtype) != common:
            raise StepError(
                f"device arrays of {sorted({str(x.dtype) for x in xs})} in one call; give them "
                "one dtype (host arrays are converted)"
            )
        else:
            placed.append(x)
    return placed
