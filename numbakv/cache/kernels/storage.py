"""The storage formats in kernels: float32 and float16 cast as NumPy does; bfloat16 kept as
its 16-bit pattern (uint16, the top half of a float32) and widened or rounded by bit
arithmetic, which runs the same on the simulator and on every GPU; q8_0, q4_0 and fp8_e4m3
as bytes (`quant`).

The arrays a step reads and writes (k, v, q, out) come in two kinds, `IO_KINDS`: "float"
(float32 or float16, which numba casts) and "bfloat16" (uint16 bit patterns, as a DLPack
bfloat16 tensor arrives), widened and narrowed like bfloat16 pools.
"""

import numpy as np

from numbakv.cache.cuda import cuda, float_as_int
from numbakv.cache.kernels import device_function, quant

FLOAT_STORAGE = ("float32", "float16")  # pools of real floats: loads and stores cast
BFLOAT16_STORAGE = ("uint16",)  # pools of bfloat16 bit patterns
BYTE_STORAGE = ("uint8",)  # pools of quantized bytes (q8_0, q4_0, fp8_e4m3)
STORAGE = FLOAT_STORAGE + BFLOAT16_STORAGE + BYTE_STORAGE  # every pool dtype of the kernels
QUIET_NAN = np.int32(0x7FC0)  # the one NaN a bfloat16 pool holds (with the input's sign)
SIGN = np.int32(0x8000)
# storage kind -> (its code in kernels, its pool dtypes); the kernels compile once per kind
KINDS = {
    "float": (quant.FLOAT, FLOAT_STORAGE),
    "bfloat16": (quant.BFLOAT16, BFLOAT16_STORAGE),
    "q8_0": (quant.Q8_0, BYTE_STORAGE),
    "q4_0": (quant.Q4_0, BYTE_STORAGE),
    "fp8_e4m3": (quant.FP8, BYTE_STORAGE),
}


# kind of a step's k, v, q or out -> (its code in kernels, its array dtypes)
IO_KINDS = {"float": (quant.FLOAT, FLOAT_STORAGE), "bfloat16": (quant.BFLOAT16, BFLOAT16_STORAGE)}


def io_kind(dtype) -> str:
    """The kind of a step's k, v, q or out array of `dtype`: uint16 holds bfloat16 patterns."""
    return "bfloat16" if np.dtype(dtype).name in BFLOAT16_STORAGE else "float"


def pool_dtypes(k_kind: str, v_kind: str) -> list[tuple[str, str]]:
    """The (K pool dtype, V pool dtype) pairs a kernel of (k_kind, v_kind) compiles for:
    float32 with float32 and float16 with float16 where both are float pools."""
    return list(zip(KINDS[k_kind][1], KINDS[v_kind][1] * 2, strict=False))


def unit_scales(n_kv_heads: int, stream):
    """A [2, n_kv_heads] float32 device array of ones: the fp8 scales a launcher passes
    when none are given (only fp8 pools read them)."""
    return cuda.to_device(np.ones((2, n_kv_heads), np.float32), stream=stream)


def kind(fmt: str) -> str:
    """Which kernels a pool of format `fmt` (numbakv.core.formats) takes: "float" for float32
    and float16, else the format itself."""
    return "float" if fmt in FLOAT_STORAGE else fmt


def kind_of_dtype(pool_dtype) -> str:
    """The kind of a float or bfloat16 pool from its dtype; ValueError for uint8 pools,
    whose format the dtype does not say."""
    name = np.dtype(pool_dtype).name
    if name in BYTE_STORAGE:
        raise ValueError("a uint8 pool is q8_0, q4_0 or fp8_e4m3: pass kinds=(k, v)")
    return "bfloat16" if name in BFLOAT16_STORAGE else "float"


@device_function
def narrow_bfloat16(x):
    """float32 x rounded to the nearest bfloat16, ties to even, as a uint16 bit pattern; a
    NaN becomes the quiet NaN 0x7FC0 with its sign: the reference's `storage.bfloat16_bits`."""
    x = np.float32(x)
    bits = float_as_int(x)
    upper = np.int32(bits >> np.int32(16))
    if x != x:
        return np.uint16((upper & SIGN) | QUIET_NAN)
    rounded = (bits + np.int32(0x7FFF) + (upper & np.int32(1))) >> np.int32(16)  # no overflow
    return np.uint16(rounded & np.int32(0xFFFF))
