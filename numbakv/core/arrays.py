"""Adopting a caller's arrays: what `write` and `attend` of both caches take, and what they
give back (docs/contract.md §5, §5.1). One straight path for a query:

    host arrays   anything NumPy converts to a real float array (lists, any strides, torch
                  CPU tensors, those that require grad included), and host tensors NumPy
                  cannot convert but DLPack exports (a torch CPU bfloat16 tensor: widened to
                  float32, exactly): `host_floats`
    device arrays numba device arrays, exports of device memory through DLPack (`export`:
                  plain ctypes over the legacy `dltensor` capsule, DLPack 0.8's
                  DLManagedTensor, which names bfloat16 where `__cuda_array_interface__`
                  and NumPy cannot), and `__cuda_array_interface__`: recognised and checked
                  here (`is_device_array`, `check_device_floats`); the device cache wraps
                  their memory (`numbakv.cache.inputs`)
    results       in the caller's kind: torch tensors in, a torch tensor out
                  (`host_result`, `check_host_out`, `write_into`, `returned`)

No numba and no torch are imported here: a caller who passes a torch tensor has imported it
(`sys.modules`), so numbakv needs torch only where its caller has it.
"""

import ctypes
import sys
from dataclasses import dataclass

import numpy as np

from numbakv.core.errors import StepError
from numbakv.core.values import check_shape

# -- host arrays -------------------------------------------------------------------------

FLOAT_NAMES = ("bfloat16",)  # float dtypes NumPy knows only through ml_dtypes


def as_host(x) -> np.ndarray:
    """A NumPy view of x; device arrays (with `copy_to_host`) are copied over."""
    if hasattr(x, "copy_to_host"):
        x = x.copy_to_host()
    return np.asarray(x)


def host_floats(name: str, x) -> np.ndarray:
    """x as a NumPy array of a real float dtype (float16/32/64, ml_dtypes' bfloat16), or
    StepError. Takes what NumPy converts (lists, any strides or order, torch CPU tensors,
    those that require grad included), host bfloat16 tensors through DLPack (widened to
    float32, exactly) and device arrays with `copy_to_host`; refuses integer, bool, complex,
    object and string arrays, which no cast makes into K/V."""
    if not hasattr(x, "copy_to_host") and is_foreign_device_array(x):
        raise StepError(
            f"{name}: {type(x).__name__} is a foreign device array; the reference reads host "
            "arrays and numba device arrays: copy it to the host first (.get(), .cpu())"
        )
    try:
        if hasattr(x, "detach"):  # a torch tensor that requires grad refuses __array__
            x = x.detach()
        array, error = as_host(x), None
    except Exception as raised:  # whatever the object's conversion raises
        array, error = None, raised
    is_float = array is not None and (array.dtype.kind == "f" or array.dtype.name in FLOAT_NAMES)
    if not is_float and not isinstance(x, np.ndarray) and has_dlpack(x):
        return _exported_floats(name, x)  # what NumPy cannot read: a bfloat16 tensor
    if array is None:
        raise StepError(
            f"{name}: cannot convert {type(x).__name__} to a NumPy array ({error!r}); pass "
            "an array of float32, float16 or bfloat16, or a tensor that has __dlpack__"
        ) from error
    if not is_float:
        raise StepError(
            f"{name} has dtype {array.dtype}; K, V and q are real floats: give float32, "
            "float16, float64 or bfloat16 values"
        )
    return array


# -- device arrays -----------------------------------------------------------------------

BFLOAT16 = np.dtype(np.uint16)  # the view of an exported bfloat16 tensor: its bit patterns


def is_device_array(x) -> bool:
    """Whether x is a device tensor: a numba device array, device memory exported through
    DLPack, or `__cuda_array_interface__`."""
    return hasattr(x, "copy_to_host") or is_foreign_device_array(x)


def check_device_floats(name: str, x, dtypes: tuple[np.dtype, ...]):
    """`x` (a numba device array, or a numba view of another library's) when its dtype is one
    of `dtypes` and its last axis is contiguous (the other axes may stride), else StepError."""
    try:
        dtype = np.dtype(x.dtype)
    except Exception as error:
        raise StepError(f"{name}: {type(x).__name__} has no readable dtype ({error!r})") from error
    if dtype not in dtypes:
        raise StepError(
            f"{name} is a device array of {x.dtype}; give one of "
            f"{[d.name for d in dtypes if d != BFLOAT16]} or a bfloat16 tensor through DLPack "
            "(host arrays of any float dtype are converted)"
        )
    shape, strides = tuple(x.shape), tuple(x.strides)  # the simulator's take no index -1
    if shape and shape[-1] > 1 and strides[-1] != dtype.itemsize:
        raise StepError(
            f"{name} is a device array with strides {strides}: its last axis (head_dim) "
            "must be contiguous, the others may stride; give a view of such an array or "
            "a contiguous copy (.contiguous() in torch, cupy.ascontiguousarray)"
        )
    return x


# -- DLPack: an export read without a copy, plain ctypes over the legacy `dltensor` capsule

CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13  # DLDeviceType codes numbakv reads
DEVICE_MEMORY = (CUDA, CUDA_MANAGED)  # what a kernel may read in place
# (DLDataTypeCode, bits) -> dtype name: 2 = kDLFloat, 4 = kDLBfloat
DTYPES = {(2, 32): "float32", (2, 16): "float16", (2, 64): "float64", (4, 16): "bfloat16"}
CODE_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}
CAPSULE = b"dltensor"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class ManagedTensor(ctypes.Structure):
    """DLManagedTensor: the tensor, the producer's context and its deleter."""

    _fields_ = [
        ("dl_tensor", _Tensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class Exported:
    """One tensor's memory as its DLPack capsule describes it.

    address : int, where element [0, ..., 0] lives (data + byte_offset)
    shape   : tuple of ints
    strides : tuple of ints, in bytes (C order when the producer gave none)
    dtype   : "float32", "float16", "float64" or "bfloat16"
    device  : DLDeviceType code (CPU, CUDA, CUDA_MANAGED, ...)
    owner   : (tensor, capsule): keeps the memory alive while a view of it lives; the
              capsule stays unconsumed, so its destructor frees it as the producer decides
    """

    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    device: int
    owner: tuple


def has_dlpack(x) -> bool:
    """Whether x exports DLPack (NumPy arrays do too: callers test those first)."""
    return hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")


def exports_device_memory(x) -> bool:
    """Whether x exports device memory through DLPack (a failing `__dlpack_device__` counts
    as one, which `export` then names)."""
    if isinstance(x, np.ndarray) or not has_dlpack(x):
        return False
    try:
        return int(x.__dlpack_device__()[0]) in DEVICE_MEMORY
    except Exception:
        return True


def has_interface(x) -> bool:
    """Whether x has `__cuda_array_interface__` (a property that raises, as torch's does for
    bfloat16, counts as one: it names device memory all the same)."""
    try:
        return getattr(x, "__cuda_array_interface__", None) is not None
    except Exception:
        return True


def is_foreign_device_array(x) -> bool:
    """Whether x is device memory that NumPy cannot read (not a NumPy array)."""
    return not isinstance(x, np.ndarray) and (has_interface(x) or exports_device_memory(x))


def device_type(name: str, x) -> int:
    """The DLDeviceType of x's memory (`__dlpack_device__`), or StepError."""
    try:
        return int(x.__dlpack_device__()[0])
    except Exception as error:
        raise StepError(
            f"{name}: {type(x).__name__}.__dlpack_device__() failed ({error!r})"
        ) from error


def export(name: str, x) -> Exported:
    """x's memory through `x.__dlpack__`, asked for no synchronization (stream -1: the caller
    orders x's producer before the reader, as for `__cuda_array_interface__`); StepError
    naming what is wrong when the capsule is not one numbakv reads (a dtype other than a
    real float, vector lanes)."""
    device = device_type(name, x)
    try:
        capsule = x.__dlpack__(stream=-1) if device in DEVICE_MEMORY else x.__dlpack__()
    except Exception as error:
        raise StepError(f"{name}: {type(x).__name__}.__dlpack__() failed ({error!r})") from error
    if not _is_valid(capsule, CAPSULE):
        raise StepError(
            f"{name}: {type(x).__name__}.__dlpack__() gave no unused 'dltensor' capsule"
        )
    tensor = ManagedTensor.from_address(_get_pointer(capsule, CAPSULE)).dl_tensor
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    dtype = DTYPES.get((code, bits))
    if dtype is None or lanes != 1:
        kind = f"{CODE_NAMES.get(code, f'type code {code} of ')}{bits}"
        raise StepError(
            f"{name}: a DLPack tensor of {kind}{f' in vectors of {lanes} lanes' * (lanes != 1)}; "
            "give float32, float16 or bfloat16 values (float64 too on the host), one per element"
        )
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    itemsize = storage_dtype(dtype).itemsize
    if tensor.strides:
        strides = tuple(tensor.strides[i] * itemsize for i in range(tensor.ndim))
    else:
        strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) * itemsize
                        for i in range(len(shape)))  # fmt: skip
    address = (tensor.data or 0) + tensor.byte_offset
    return Exported(address, shape, strides, dtype, int(tensor.device.device_type), (x, capsule))


def storage_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype that holds elements of `dtype`: bfloat16 as its uint16 bit patterns."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def host_view(exported: Exported) -> np.ndarray:
    """A NumPy view (no copy) of an export's memory read as host memory, bfloat16 as uint16
    patterns; the view's base holds the exporter alive."""
    dtype = storage_dtype(exported.dtype)
    if 0 in exported.shape:
        return np.zeros(exported.shape, dtype)
    return np.asarray(_Memory(exported, dtype))


class _Memory:
    """An export as `__array_interface__`, which NumPy keeps as its view's base."""

    def __init__(self, exported: Exported, dtype: np.dtype):
        self.owner = exported.owner
        self.__array_interface__ = {
            "data": (exported.address, False),
            "shape": exported.shape,
            "strides": exported.strides,
            "typestr": dtype.str,
            "version": 3,
        }


def _exported_floats(name: str, x) -> np.ndarray:
    """A host tensor that NumPy cannot convert (a torch CPU bfloat16 tensor), read through
    DLPack: bfloat16 widened to float32 (exact: the pattern is the float32's top half),
    float32/16/64 copied as they are."""
    exported = export(name, x)
    if exported.device not in (CPU, CUDA_HOST):
        raise StepError(
            f"{name}: a DLPack tensor on device type {exported.device}, which the host "
            "cannot read; copy it to the host (or to a CUDA device) first"
        )
    view = host_view(exported)
    if exported.dtype != "bfloat16":
        return np.array(view)
    return (view.astype(np.uint32) << np.uint32(16)).view(np.float32)


# -- results in the caller's kind ---------------------------------------------------------


def is_torch(x) -> bool:
    """Whether x is a torch tensor, a subclass's included (without importing torch: with
    no torch imported, nothing is one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda_tensor(x) -> bool:
    """Whether x is a torch tensor in CUDA memory."""
    return is_torch(x) and bool(getattr(x, "is_cuda", False))


def _torch():
    return sys.modules["torch"]  # imported: the caller passed one of its tensors


def host_result(q, result: np.ndarray):
    """`result` ([width, n_heads, head_dim] float32 NumPy) as the caller gave q: a CPU torch
    tensor sharing its memory when q is a float32 one, a new one in q's dtype (float16,
    bfloat16: rounded to nearest even by torch) when q is of another; else `result`."""
    if not is_torch(q):
        return result
    tensor = _torch().from_dlpack(result)
    return tensor if tensor.dtype == q.dtype else tensor.to(q.dtype)


def check_host_out(out, shape: tuple[int, ...]):
    """`out` checked as a host array `attend` can write a float32 result into: a writable
    NumPy float array or a CPU torch float tensor of `shape`, or StepError."""
    if is_torch(out):
        if out.device.type != "cpu" or not out.is_floating_point() or out.requires_grad:
            raise StepError(
                f"out is a torch tensor of {out.dtype} on {out.device} (requires_grad="
                f"{out.requires_grad}); the reference writes a CPU float tensor of shape "
                f"{shape} that requires no grad"
            )
        check_shape("out", tuple(out.shape), shape)
        if any(st == 0 and n > 1 for st, n in zip(out.stride(), out.shape, strict=True)):
            raise StepError(f"out has strides {out.stride()}: its elements overlap (expand)")
        return out
    if not isinstance(out, np.ndarray) or out.dtype.kind != "f" or not out.flags.writeable:
        raise StepError(
            f"out is a {type(out).__name__}; give a writable NumPy float array or a CPU torch "
            f"float tensor of shape {shape}, or None"
        )
    check_shape("out", out.shape, shape)
    return out


def write_into(out, result: np.ndarray):
    """`out` (checked by `check_host_out`) holding `result`, cast to its dtype; returns out."""
    if is_torch(out):
        out.copy_(_torch().from_dlpack(result))  # torch casts, bfloat16 to nearest even
    else:
        np.copyto(out, result, casting="unsafe")
    return out


def returned(caller, given, out, stream):
    """What `attend` returns (docs/contract.md §5.1), `out` being the device array it wrote:
    `given` (the caller's `out`, or the torch tensor made for a CUDA torch q) when it is a
    torch tensor, else `out` when there was one (the numba array or the numba view of
    another library's export); for a CPU torch q and no `out`, `out` copied to the host as
    a torch tensor in q's dtype; else `out`."""
    if given is not None:
        return given if is_torch(given) else out
    if is_torch(caller):
        host = out.copy_to_host(stream=stream)
        stream.synchronize()  # the copy into pageable memory is done before it is read
        return host_result(caller, host)
    return out
