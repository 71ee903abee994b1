"""The quantized formats in kernels (docs/contract.md §4.1): the same bytes as the reference's
`quant`, by integer and float32 arithmetic that runs alike on the simulator and on a GPU.

float16 scales and e4m3 bytes are built and read by bit arithmetic (a uint8 pool holds
them); every product or sum whose rounding decides a code goes through `mul_rn` / `add_rn`,
which the compiler may not fuse into an fma (ggml's codes are those of separate roundings).
"""

import math

import numpy as np

from numbakv.cache.cuda import add_rn, float_as_int, int_as_float, mul_rn
from numbakv.cache.kernels import device_function
from numbakv.core.formats import BLOCK

FLOAT, BFLOAT16, Q8_0, Q4_0, FP8 = 0, 1, 2, 3, 4  # the storage kinds' codes in kernels
Q8_BYTES, Q4_BYTES = 2 + BLOCK, 2 + BLOCK // 2
HALF_NAN = np.int32(0x7E00)
HALF = np.float32(0.5)
FP8_SATURATED = np.int32(0x7E)  # 448
FP8_NAN = np.int32(0x7F)
SHIFT = np.int32(16)  # a bfloat16 pattern's place in a float32


@device_function
def half_bits(x):
    """float32 x as float16 bits (int32 in [0, 0xFFFF]), to nearest even; NaN is 0x7E00."""
    bits = float_as_int(np.float32(x))
    sign = (bits >> np.int32(16)) & np.int32(0x8000)
    a = bits & np.int32(0x7FFFFFFF)
    if a > np.int32(0x7F800000):
        return HALF_NAN
    if a >= np.int32(0x477FF000):  # rounds to 65536 or more: inf
        return sign | np.int32(0x7C00)
    if a >= np.int32(0x38800000):  # a normal float16: drop 13 mantissa bits, nearest even
        lsb = (a >> np.int32(13)) & np.int32(1)
        return sign | ((a - np.int32(0x38000000) + np.int32(0xFFF) + lsb) >> np.int32(13))
    # a subnormal float16: a multiple of 2^-24, exact in float32 (1024 is the smallest normal)
    return sign | rint(int_as_float(a) * np.float32(16777216.0))


@device_function
def half_value(bits):
    """The float32 value of float16 bits (an int32 in [0, 0xFFFF])."""
    sign = (bits & np.int32(0x8000)) << np.int32(16)
    exponent = (bits >> np.int32(10)) & np.int32(0x1F)
    mantissa = bits & np.int32(0x3FF)
    if exponent == 0:  # zero or subnormal: mantissa * 2^-24, exact
        value = np.float32(mantissa) * np.float32(5.9604645e-08)
        return -value if sign != 0 else value
    if exponent == 31:
        return int_as_float(sign | np.int32(0x7F800000) | (mantissa << np.int32(13)))
    return int_as_float(
        sign | ((exponent + np.int32(112)) << np.int32(23)) | (mantissa << np.int32(13))
    )


@device_function
def widen_bfloat16(bits):
    """The float32 value of a bfloat16 bit pattern (exact: the pattern is its top half)."""
    return int_as_float(np.int32(np.int32(bits) << SHIFT))


@device_function
def read(src, t, h, d, in_code):
    """src[t, h, d] as float32: a float cast, or a bfloat16 pattern widened (in_code)."""
    if in_code == BFLOAT16:
        return widen_bfloat16(src[t, h, d])
    return np.float32(src[t, h, d])


@device_function
def rint(y):
    """A non-negative float32 y (< 2^23) to the nearest int32, ties to even."""
    n = np.int32(y)
    rest = y - np.float32(n)
    if rest > HALF or (rest == HALF and (n & np.int32(1)) != 0):
        n += np.int32(1)
    return n


@device_function
def roundf(y):
    """C's roundf of a float32 |y| < 2^23 as int32: halves away from zero."""
    n = np.int32(y)
    rest = y - np.float32(n)
    if rest >= HALF:
        n += np.int32(1)
    elif rest <= -HALF:
        n -= np.int32(1)
    return n


@device_function
def e4m3_bits(x):
    """float32 x as an e4m3fn byte (int32), to nearest even, saturating at ±448; NaN 0x7F."""
    if x != x:
        return FP8_NAN
    bits = float_as_int(np.float32(x))
    sign = (bits >> np.int32(24)) & np.int32(0x80)
    a = bits & np.int32(0x7FFFFFFF)
    if a >= np.int32(0x43E00000):  # 448 or more (inf too)
        return sign | FP8_SATURATED
    if a < np.int32(0x3C800000):  # below 2^-6: a multiple of 2^-9 (8 is the smallest normal)
        return sign | rint(int_as_float(a) * np.float32(512.0))
    lsb = (a >> np.int32(20)) & np.int32(1)
    code = ((a + np.int32(0x7FFFF) + lsb) >> np.int32(20)) - np.int32(960)  # (127 - 7) << 3
    return sign | min(code, FP8_SATURATED)


@device_function
def e4m3_value(byte):
    """The float32 value of an e4m3fn byte (an int32 in [0, 255]); 0x7F and 0xFF are NaN."""
    sign = (byte & np.int32(0x80)) << np.int32(24)
    exponent = (byte >> np.int32(3)) & np.int32(0xF)
    mantissa = byte & np.int32(7)
    if exponent == 15 and mantissa == 7:
        return np.float32(math.nan)
    if exponent == 0:
        value = np.float32(mantissa) * np.float32(0.001953125)
        return -value if sign != 0 else value
    return int_as_float(
        sign | ((exponent + np.int32(120)) << np.int32(23)) | (mantissa << np.int32(20))
    )


@device_function
def store_scale(pool, cell, h, base, d, is_finite):
    """A block's float16 scale d at bytes [base, base + 2) of pool[cell, h] (little-endian;
    0x7E00 for a block that is not finite); returns ggml's 1 / d, 0 where d is 0 or where
    1 / d overflows (a subnormal d), as the reference."""
    bits = half_bits(d) if is_finite else HALF_NAN
    pool[cell, h, base] = np.uint8(bits & np.int32(0xFF))
    pool[cell, h, base + 1] = np.uint8(bits >> np.int32(8))
    inv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    return inv if inv - inv == np.float32(0.0) else np.float32(0.0)


@device_function
def store_q8_0(src, pool, t, cell, h, b, in_code):
    """Block b of src[t, h] (float, or bfloat16 patterns: in_code) as q8_0 into
    pool[cell, h]: d = amax / 127, roundf(x * (1/d))."""
    d0 = b * BLOCK
    base = b * Q8_BYTES
    amax = np.float32(0.0)
    is_finite = True
    for e in range(BLOCK):
        x = read(src, t, h, d0 + e, in_code)
        is_finite = is_finite and x - x == np.float32(0.0)  # NaN and ±inf give NaN
        amax = max(amax, abs(x))
    d = amax / np.float32(127.0)
    inv = store_scale(pool, cell, h, base, d, is_finite)
    for e in range(BLOCK):
        code = roundf(mul_rn(read(src, t, h, d0 + e, in_code), inv)) if is_finite else np.int32(0)
        pool[cell, h, base + 2 + e] = np.uint8(code & np.int32(0xFF))


@device_function
def store_q4_0(src, pool, t, cell, h, b, in_code):
    """Block b of src[t, h] (float, or bfloat16 patterns: in_code) as q4_0 into
    pool[cell, h]: d = (first value of largest magnitude) / -8, codes min(15, trunc(x * (1/d)
    + 8.5)), two per byte."""
    d0 = b * BLOCK
    base = b * Q4_BYTES
    amax = np.float32(0.0)
    largest = np.float32(0.0)
    is_finite = True
    for e in range(BLOCK):
        x = read(src, t, h, d0 + e, in_code)
        is_finite = is_finite and x - x == np.float32(0.0)
        if amax < abs(x):
            amax = abs(x)
            largest = x
    d = largest / np.float32(-8.0)
    inv = store_scale(pool, cell, h, base, d, is_finite)
    for j in range(BLOCK // 2):
        low, high = np.int32(8), np.int32(8)
        if is_finite:
            x0 = add_rn(mul_rn(read(src, t, h, d0 + j, in_code), inv), np.float32(8.5))
            x1 = add_rn(mul_rn(read(src, t, h, d0 + j + 16, in_code), inv), np.float32(8.5))
            low, high = min(np.int32(15), np.int32(x0)), min(np.int32(15), np.int32(x1))
        pool[cell, h, base + 2 + j] = np.uint8(low | (high << np.int32(4)))


@device_function
def load_quantized(pool, c, h, d, code, scale):
    """The float32 value of element d of pool[c, h] in quantized format `code` (Q8_0, Q4_0
    or FP8, whose value is e4m3 * `scale`)."""
    if code == Q8_0:
        b = d // BLOCK
        base = b * Q8_BYTES
        d_bits = np.int32(pool[c, h, base]) | (np.int32(pool[c, h, base + 1]) << np.int32(8))
        q = np.int32(pool[c, h, base + 2 + d - b * BLOCK])
        q = q - np.int32(256) if q >= np.int32(128) else q
        return np.float32(q) * half_value(d_bits)
    if code == Q4_0:
        b = d // BLOCK
        base = b * Q4_BYTES
        d_bits = np.int32(pool[c, h, base]) | (np.int32(pool[c, h, base + 1]) << np.int32(8))
        i = d - b * BLOCK
        byte = np.int32(pool[c, h, base + 2 + (i & np.int32(15))])
        q = (byte >> np.int32(4)) if i >= 16 else (byte & np.int32(15))
        return np.float32(q - np.int32(8)) * half_value(d_bits)
    return e4m3_value(np.int32(pool[c, h, d])) * scale
