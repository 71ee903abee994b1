"""A DLPack producer for tests: NumPy memory exported as a legacy `dltensor` capsule that
says what the test wants (device type, float32 / float16 / bfloat16, strides), as a torch,
CuPy or JAX tensor would. On the simulator a "CUDA" export of host memory is what a GPU
tensor is to a GPU: the device cache reads it in place."""

import ctypes

import ml_dtypes
import numpy as np

from numbakv.core.arrays import CPU, CUDA, ManagedTensor

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

CODES = {"float32": (2, 32), "float16": (2, 16), "bfloat16": (4, 16), "int32": (0, 32)}


class Tensor:
    """`values` (a NumPy array, any strides) exported through DLPack as `dtype`, from
    `device` (a DLDeviceType code). bfloat16 values are ml_dtypes' bfloat16; `streams`
    records the stream each `__dlpack__` call asked for."""

    def __init__(self, values: np.ndarray, device: int = CUDA, dtype: str | None = None,
                 lanes: int = 1):  # fmt: skip
        self.values = values
        self.device = device
        self.dtype = dtype or np.dtype(values.dtype).name
        self.lanes = lanes
        self.streams: list = []
        self._kept: list = []  # the structs every capsule points into

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device, 0

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        if self.device == CPU and stream is not None:
            raise BufferError("a CPU tensor takes stream=None")
        ndim = self.values.ndim
        shape = (ctypes.c_int64 * ndim)(*self.values.shape)
        itemsize = self.values.dtype.itemsize
        strides = (ctypes.c_int64 * ndim)(*(s // itemsize for s in self.values.strides))
        managed = ManagedTensor()
        tensor = managed.dl_tensor
        tensor.data = self.values.__array_interface__["data"][0]
        tensor.device.device_type, tensor.device.device_id = self.device, 0
        tensor.ndim = ndim
        tensor.dtype.code, tensor.dtype.bits = CODES[self.dtype]
        tensor.dtype.lanes = self.lanes
        tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        tensor.byte_offset = 0
        self._kept.append((managed, shape, strides))
        return _new_capsule(ctypes.addressof(managed), b"dltensor", None)


def bfloat16_tensor(x: np.ndarray, device: int = CUDA) -> Tensor:
    """x rounded to bfloat16 (ml_dtypes, to nearest even), exported as a bfloat16 tensor."""
    return Tensor(np.asarray(x, np.float32).astype(ml_dtypes.bfloat16), device, "bfloat16")


def as_float32(tensor: Tensor) -> np.ndarray:
    """The exported values as float32 (bfloat16 widened exactly)."""
    return np.asarray(tensor.values).astype(np.float32)
