"""A tensor exported through DLPack (`__dlpack__`), read without a copy: where its data lives,
its shape, strides and dtype, bfloat16 included, which `__cuda_array_interface__` and
NumPy cannot name. Plain ctypes over the legacy `dltensor` capsule (DLPack 0.8's
DLManagedTensor), no numba: the device cache wraps the memory it describes
(`numbakv.cache.inputs`), and host bfloat16 tensors are widened from it (`checks`).
"""

import ctypes
from dataclasses import dataclass

import numpy as np

from numbakv.errors import StepError

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


def host_floats(name: str, x) -> np.ndarray:
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
