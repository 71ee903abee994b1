"""What `write` and `attend` of the device cache take: any real float array on the host, or a
device array (anything with `__cuda_array_interface__`) of a dtype the kernels read, taken
in place without a synchronization and read through its strides (a view of a fused QKV
projection, a split or a chunk: only the last axis must be contiguous); and the `out=`
array `attend` writes into, float32 or float16, strided alike."""

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.checks import check_shape, host_floats
from numbakv.errors import StepError

KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # what the scatter kernels read
Q_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # what attention reads and writes


def is_device_array(x) -> bool:
    return hasattr(x, "copy_to_host") or hasattr(x, "__cuda_array_interface__")


def floats(name: str, x, dtypes: tuple[np.dtype, ...]):
    """x checked: a device array kept as it is (its last axis contiguous, one of `dtypes`),
    or a host array as NumPy (`checks.host_floats`), not yet uploaded."""
    if not is_device_array(x):
        return host_floats(name, x)
    if not hasattr(x, "copy_to_host"):
        x = _numba_view(name, x)
    try:
        dtype = np.dtype(x.dtype)
    except Exception as error:
        raise StepError(f"{name}: {type(x).__name__} has no readable dtype ({error!r})") from error
    if dtype not in dtypes:
        raise StepError(
            f"{name} is a device array of {x.dtype}; give one of {[d.name for d in dtypes]} "
            "(host arrays of any float dtype are converted)"
        )
    shape, strides = tuple(x.shape), tuple(x.strides)  # the simulator's take no index -1
    if shape and shape[-1] > 1 and strides[-1] != dtype.itemsize:
        raise StepError(
            f"{name} is a device array with strides {x.strides}: its last axis (head_dim) "
            "must be contiguous, the others may stride; give a view of such an array or "
            "a contiguous copy (.contiguous() in torch, cupy.ascontiguousarray)"
        )
    return x


def _numba_view(name: str, x):
    """A numba view of a foreign device array (`__cuda_array_interface__`), or StepError."""
    if IS_SIMULATOR:
        raise StepError(
            f"{name}: {type(x).__name__} is a foreign device array, which the CUDA simulator "
            "cannot read; pass a NumPy array or a numba device array (cuda.to_device)"
        )
    try:  # sync=False: numba would wait for the exporter's stream; the caller orders its work
        return cuda.as_cuda_array(x, sync=False)
    except Exception as error:
        raise StepError(
            f"{name}: cannot read {type(x).__name__}'s __cuda_array_interface__ ({error!r})"
        ) from error


def on_device(xs: list, dtypes: tuple[np.dtype, ...], stream, capturing: bool = False) -> list:
    """The checked arrays `xs` (from `floats`) on the device, in one dtype: that of the device
    arrays among them, else the host arrays' shared dtype when it is one of `dtypes`, else
    float32 (host arrays are converted to it and copied on `stream`; refused while a step is
    captured, where the copy would not be part of the graph)."""
    if capturing and any(isinstance(x, np.ndarray) for x in xs):
        raise StepError(
            "a step being captured takes device arrays only: a host array's copy would run "
            "once now and never on replay; copy it into a device array before capture()"
        )
    on_gpu = {np.dtype(x.dtype) for x in xs if not isinstance(x, np.ndarray)}
    if len(on_gpu) > 1:
        raise StepError(
            f"device arrays of {sorted(d.name for d in on_gpu)} in one call; give them one dtype"
        )
    on_host = {x.dtype for x in xs if isinstance(x, np.ndarray)}
    if on_gpu:
        common = on_gpu.pop()
    elif len(on_host) == 1 and next(iter(on_host)) in dtypes:
        common = on_host.pop()
    else:
        common = np.dtype(np.float32)
    return [
        cuda.to_device(np.ascontiguousarray(x, dtype=common), stream=stream)
        if isinstance(x, np.ndarray)
        else x
        for x in xs
    ]


def output(out, shape: tuple[int, ...], stream, capturing: bool = False):
    """The device array `attend` writes: `out` checked (a float32 or float16 device array
    of `shape`, its last axis contiguous), or a new float32 one allocated on `stream` (not
    while capturing)."""
    if out is None and capturing:
        raise StepError(
            f"attend() in a captured step needs out= (a float32 device array {list(shape)}): "
            "an allocation would happen once and its array be reused by every replay"
        )
    if out is None:
        return cuda.device_array(shape, np.float32, stream=stream)
    if not is_device_array(out):
        raise StepError(
            f"out is a {type(out).__name__}; give a float32 or float16 device array of shape "
            f"{shape} (cuda.device_array) or None"
        )
    out = floats("out", out, Q_DTYPES)
    check_shape("out", out.shape, shape)
    return out
