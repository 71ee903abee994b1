"""The storage formats of docs/contract.md §4.1, in NumPy: how a written value is stored, how
it is read.

K and V arrive as float32 (other float dtypes are rounded to float32 first) and are kept as
float32, float16 (IEEE round to nearest even), bfloat16, or quantized (`quant`: q8_0, q4_0,
fp8_e4m3). bfloat16 is the top half of a float32; its arrays hold the 16-bit patterns as
uint16 (NumPy has no bfloat16 type).
"""

import numpy as np

from . import quant

QUIET_NAN = np.uint32(0x7FC0)  # the one NaN a bfloat16 pool holds (with the input's sign)
SIGN = np.uint32(0x8000)


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """[...] uint16: float32 values rounded to the nearest bfloat16, ties to even, as bit
    patterns; a NaN becomes the quiet NaN 0x7FC0 with its sign (as ml_dtypes), ±inf stays."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    upper = bits >> np.uint32(16)
    rounded = (bits + np.uint32(0x7FFF) + (upper & np.uint32(1))) >> np.uint32(16)
    return np.where(np.isnan(x), (upper & SIGN) | QUIET_NAN, rounded).astype(np.uint16)


def bfloat16_values(bits: np.ndarray) -> np.ndarray:
    """[...] float32: the values of bfloat16 bit patterns (exact: each is a float32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_storage(x: np.ndarray, dtype: str, scales: np.ndarray | None = None) -> np.ndarray:
    """Values [n, n_kv_heads, head_dim] float32 as a pool of format `dtype` stores them,
    [n, n_kv_heads, row_width] (`numbakv.core.formats`); scales: fp8's [n_kv_heads] float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        return bfloat16_bits(x)
    if dtype == "q8_0":
        return quant.q8_0_bytes(x)
    if dtype == "q4_0":
        return quant.q4_0_bytes(x)
    if dtype == "fp8_e4m3":
        return quant.fp8_bytes(x, scales)
    return x.astype(dtype)


def to_float32(stored: np.ndarray, dtype: str, scales: np.ndarray | None = None) -> np.ndarray:
    """The float32 values [n, n_kv_heads, head_dim] of a pool's entries of format `dtype`:
    what attention reads."""
    if dtype == "bfloat16":
        return bfloat16_values(stored)
    if dtype == "q8_0":
        return quant.q8_0_values(stored)
    if dtype == "q4_0":
        return quant.q4_0_values(stored)
    if dtype == "fp8_e4m3":
        return quant.fp8_values(stored, scales)
    return stored.astype(np.float32)
