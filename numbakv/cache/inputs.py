"""What `write` and `attend` of the device cache take: any real float array on the host, or a
device tensor of a dtype the kernels read, taken in place without a synchronization and read
through its strides (a view of a fused QKV projection, a split or a chunk: only the last
axis must be contiguous); and the `out=` array `attend` writes into, strided alike.

Device tensors arrive three ways, tried in this order: a numba device array (float32 or
float16) as it is; an object exporting DLPack from device memory (torch, CuPy, JAX; float32,
float16 or bfloat16, which `__cuda_array_interface__` cannot carry; `numbakv.core.arrays`), read
as a numba view of its memory, bfloat16 as uint16 bit patterns (`storage.IO_KINDS`); else
`__cuda_array_interface__` (float32 or float16). A uint16 numba array is never taken as
bfloat16: only an export says a tensor holds bfloat16.
"""

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda, wrap_export
from numbakv.cache.lending import Lender
from numbakv.core import arrays
from numbakv.core.errors import StepError
from numbakv.core.values import check_shape

KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # numba arrays the kernels read
Q_DTYPES = KV_DTYPES  # ... and write as out


def floats(name: str, x, dtypes: tuple[np.dtype, ...]):
    """x checked: a device tensor as a numba device array (its last axis contiguous, one of
    `dtypes`, or an exported bfloat16 tensor's uint16 view), or a host array as NumPy
    (`arrays.host_floats`), not yet uploaded."""
    if not arrays.is_device_array(x):
        return arrays.host_floats(name, x)
    allowed = dtypes
    if hasattr(x, "copy_to_host"):
        pass  # a numba device array, read as it is
    elif arrays.exports_device_memory(x):
        x, allowed = _exported_view(name, x, dtypes), (*dtypes, arrays.BFLOAT16)
    else:
        x = _numba_view(name, x)
    return arrays.check_device_floats(name, x, allowed)


def _exported_view(name: str, x, dtypes: tuple[np.dtype, ...]):
    """A numba view of the device memory x exports through DLPack (bfloat16 as uint16). On
    the simulator, only exports of host memory (no `__cuda_array_interface__`: a real GPU
    tensor has one, or raises for it) are read."""
    if IS_SIMULATOR and arrays.has_interface(x):
        _numba_view(name, x)  # raises: the simulator cannot read a GPU's memory
    exported = arrays.export(name, x)
    names = [d.name for d in dtypes] + ["bfloat16"]
    if exported.dtype not in names:
        raise StepError(
            f"{name} is a DLPack tensor of {exported.dtype}; give one of {names} (host arrays "
            "of any float dtype are converted)"
        )
    return wrap_export(exported)


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


def on_device(
    xs: list, dtypes: tuple[np.dtype, ...], stream, lender: Lender, capturing: bool = False
) -> list:
    """The checked arrays `xs` (from `floats`) on the device, in one dtype: that of the device
    arrays among them, else the host arrays' shared dtype when it is one of `dtypes`, else
    float32 (host arrays are converted to it and copied on `stream` into arrays `lender`
    lends; refused while a step is captured, where the copy would not be part of the
    graph)."""
    if capturing and any(isinstance(x, np.ndarray) for x in xs):
        raise StepError(
            "a step being captured takes device arrays only: a host array's copy would run "
            "once now and never on replay; copy it into a device array before capture()"
        )
    on_gpu = {np.dtype(x.dtype) for x in xs if not isinstance(x, np.ndarray)}
    if len(on_gpu) > 1:
        names = sorted("bfloat16" if d == arrays.BFLOAT16 else d.name for d in on_gpu)
        raise StepError(f"device arrays of {names} in one call; give them one dtype")
    on_host = {x.dtype for x in xs if isinstance(x, np.ndarray)}
    if on_host and on_gpu == {arrays.BFLOAT16}:
        raise StepError(
            "a host array beside a bfloat16 device tensor: give both on the device, or both "
            "on the host"
        )
    if on_gpu:
        common = on_gpu.pop()
    elif len(on_host) == 1 and next(iter(on_host)) in dtypes:
        common = on_host.pop()
    else:
        common = np.dtype(np.float32)
    return [
        lender.upload(np.ascontiguousarray(x, dtype=common), stream)
        if isinstance(x, np.ndarray)
        else x
        for x in xs
    ]


def output(out, shape: tuple[int, ...], stream, lender: Lender, capturing: bool = False):
    """The device array `attend` writes: `out` checked (a float32, float16 or bfloat16
    (DLPack) device tensor of `shape`, its last axis contiguous), or a float32 one `lender`
    lends on `stream` (not while capturing)."""
    if out is None and capturing:
        raise StepError(
            f"attend() in a captured step needs out= (a float32 device array {list(shape)}): "
            "an allocation would happen once and its array be reused by every replay"
        )
    if out is None:
        return lender.empty(shape, np.float32, stream)
    if not arrays.is_device_array(out):
        raise StepError(
            f"out is a {type(out).__name__}; give a float32, float16 or bfloat16 device "
            f"tensor of shape {shape} (cuda.device_array, a torch or CuPy tensor) or None"
        )
    out = floats("out", out, Q_DTYPES)
    check_shape("out", out.shape, shape)
    return out
