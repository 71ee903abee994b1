"""The storage dtypes in kernels: float32 and float16 cast as NumPy does; bfloat16 kept as
its 16-bit pattern (uint16, the top half of a float32) and widened or rounded by bit
arithmetic, which runs the same on the simulator and on every GPU.
"""

import numpy as np

from numbakv.cache.cuda import float_as_int
from numbakv.cache.kernels import device_function

FLOAT_STORAGE = ("float32", "float16")  # pools of real floats: loads and stores cast
BFLOAT16_STORAGE = ("uint16",)  # pools of bfloat16 bit patterns
STORAGE = FLOAT_STORAGE + BFLOAT16_STORAGE  # every pool dtype the kernels compile for
QUIET_NAN = np.int32(0x7FC0)  # the one NaN a bfloat16 pool holds (with the input's sign)
SIGN = np.int32(0x8000)


def kind(pool_dtype) -> str:
    """Which kernels a pool takes: "bfloat16" for bit patterns (uint16), else "float"."""
    return "bfloat16" if np.dtype(pool_dtype).name in BFLOAT16_STORAGE else "float"


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
