"""The quantized formats of docs/contract.md §4.1 in NumPy: q8_0 and q4_0 as ggml's reference
quantizer (`ggml-quants.c`) computes them, fp8_e4m3 as OCP e4m3fn, round to nearest even.

Every function takes or gives values `[..., head_dim]` float32 and stores
`[..., row_width]` uint8, each row of one token and one KV head. Arithmetic is float32, one
rounding per operation, as ggml's C without contraction.

Non-finite input (which ggml leaves undefined): a q8_0 / q4_0 block holding a NaN or an
infinity is stored as a NaN block (scale 0x7E00, every code 0 or 8), read back as 32 NaNs;
fp8 stores NaN as 0x7F and ±inf as ±448.
"""

import numpy as np

from numbakv.core.formats import BLOCK, FP8_MAX

HALF_NAN = np.uint16(0x7E00)  # the float16 NaN a NaN block's scale holds
FP8_NAN = np.uint8(0x7F)
F32 = np.float32


def half_bits(d: np.ndarray) -> np.ndarray:
    """[...] uint16: float32 d rounded to float16 (nearest even), NaN as 0x7E00."""
    d = np.asarray(d, F32)
    with np.errstate(over="ignore", invalid="ignore"):  # past 65504: inf, as float16 rounds
        return np.where(np.isnan(d), HALF_NAN, d.astype(np.float16).view(np.uint16))


def half_values(bits: np.ndarray) -> np.ndarray:
    """[...] float32: the values of float16 bit patterns."""
    return np.asarray(bits, np.uint16).view(np.float16).astype(F32)


def roundf(y: np.ndarray) -> np.ndarray:
    """C's roundf: to nearest, halves away from zero (NumPy's round goes to even)."""
    t = np.trunc(y)
    return t + np.where(np.abs(y - t) >= F32(0.5), np.sign(y), F32(0))


def _blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., head_dim] as [..., n_blocks, 32] float32, and where a block is not finite."""
    x = np.asarray(x, F32)
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    return blocks, ~np.isfinite(blocks).all(axis=-1)


def _inverse(d: np.ndarray) -> np.ndarray:
    """1 / d in float32, 0 where d is 0 or 1 / d overflows (ggml's `id`)."""
    with np.errstate(divide="ignore", over="ignore"):
        inverse = (F32(1) / np.where(d == 0, F32(1), d)).astype(F32)
    # a subnormal d's inverse overflows (ggml leaves its codes undefined): 0, as for d = 0
    return np.where((d == 0) | ~np.isfinite(inverse), F32(0), inverse).astype(F32)


def _pack(d_bits: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """[..., n_blocks, 2 + n] uint8 -> [..., n_blocks * (2 + n)]: each block's scale
    (little-endian) then its code bytes."""
    scale = np.stack([d_bits & 0xFF, d_bits >> 8], axis=-1).astype(np.uint8)
    packed = np.concatenate([scale, codes.astype(np.uint8)], axis=-1)
    return packed.reshape(*packed.shape[:-2], packed.shape[-2] * packed.shape[-1])


def _unpack(stored: np.ndarray, block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """[..., row_width] uint8 -> (scales [..., n_blocks] float32, code bytes [..., n_blocks, n])."""
    stored = np.asarray(stored, np.uint8)
    blocks = stored.reshape(*stored.shape[:-1], stored.shape[-1] // block_bytes, block_bytes)
    bits = blocks[..., 0].astype(np.uint16) | (blocks[..., 1].astype(np.uint16) << 8)
    return half_values(bits), blocks[..., 2:]


def q8_0_bytes(x: np.ndarray) -> np.ndarray:
    """q8_0 blocks of x: d = amax / 127, codes roundf(x * (1 / d)), int8."""
    blocks, bad = _blocks(x)
    d = (np.abs(blocks).max(axis=-1) / F32(127)).astype(F32)
    with np.errstate(invalid="ignore"):  # inf * 0 in a block that is stored as NaN
        codes = roundf((blocks * _inverse(d)[..., None]).astype(F32))
    codes = np.where(bad[..., None], 0, codes).astype(np.int8).view(np.uint8)
    return _pack(np.where(bad, HALF_NAN, half_bits(d)), codes)


def q8_0_values(stored: np.ndarray) -> np.ndarray:
    """[..., head_dim] float32 of q8_0 blocks: code * float(fp16 d)."""
    d, codes = _unpack(stored, 2 + BLOCK)
    with np.errstate(invalid="ignore"):  # 0 * inf: a NaN block, or an overflowed scale
        values = codes.view(np.int8).astype(F32) * d[..., None]
    return values.reshape(*values.shape[:-2], values.shape[-2] * values.shape[-1])


def q4_0_bytes(x: np.ndarray) -> np.ndarray:
    """q4_0 blocks of x: d = (the value of largest magnitude, first of ties) / -8, codes
    min(15, trunc(x * (1 / d) + 8.5)); byte j = code j | code (j + 16) << 4."""
    blocks, bad = _blocks(x)
    first_max = np.abs(blocks).argmax(axis=-1)[..., None]
    largest = np.take_along_axis(blocks, first_max, axis=-1)[..., 0]
    largest = np.where(largest == 0, F32(0), largest)  # ggml starts from +0: -0 never wins
    d = (largest / F32(-8)).astype(F32)
    with np.errstate(invalid="ignore"):  # inf * 0 in a block that is stored as NaN
        shifted = ((blocks * _inverse(d)[..., None]).astype(F32) + F32(8.5)).astype(F32)
        shifted = np.where(bad[..., None], F32(8), shifted)
    codes = np.minimum(15, np.trunc(shifted)).astype(np.uint8)
    half = BLOCK // 2
    packed = codes[..., :half] | (codes[..., half:] << np.uint8(4))
    return _pack(np.where(bad, HALF_NAN, half_bits(d)), packed)


def q4_0_values(stored: np.ndarray) -> np.ndarray:
    """[..., head_dim] float32 of q4_0 blocks: (code - 8) * float(fp16 d)."""
    d, packed = _unpack(stored, 2 + BLOCK // 2)
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(F32) - F32(8)
    with np.errstate(invalid="ignore"):  # 0 * inf: a NaN block, or an overflowed scale
        values = codes * d[..., None]
    return values.reshape(*values.shape[:-2], values.shape[-2] * values.shape[-1])


def e4m3_bits(x: np.ndarray) -> np.ndarray:
    """[...] uint8: float32 x as OCP e4m3fn, to nearest even, saturating at ±448 (±inf
    too); NaN is 0x7F."""
    x = np.asarray(x, F32)
    a = np.abs(x)
    bits = a.view(np.uint32)
    # normal results (a >= 2^-6): keep 3 mantissa bits of the float32, to nearest even
    rounded = (bits + np.uint32(0x7FFFF) + ((bits >> np.uint32(20)) & np.uint32(1))) >> 20
    normal = rounded.astype(np.int64) - ((127 - 7) << 3)
    # subnormal results: multiples of 2^-9, to nearest even (8 is the smallest normal)
    with np.errstate(invalid="ignore"):  # NaN and inf take the other branches
        small = np.rint(np.where(a < F32(1), a, F32(0)) * F32(512)).astype(np.int64)
    code = np.where(a < F32(2.0**-6), small, normal)
    code = np.where(a >= F32(FP8_MAX), 0x7E, np.minimum(code, 0x7E))
    sign = np.signbit(x).astype(np.int64) << 7
    return np.where(np.isnan(x), FP8_NAN, code | sign).astype(np.uint8)


def e4m3_values(bits: np.ndarray) -> np.ndarray:
    """[...] float32: the values of e4m3fn bytes (0x7F and 0xFF are NaN)."""
    bits = np.asarray(bits, np.uint8).astype(np.int64)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 7
    normal = (F32(1) + mantissa.astype(F32) / F32(8)) * np.exp2(exponent - 7).astype(F32)
    value = np.where(exponent == 0, mantissa.astype(F32) * F32(2.0**-9), normal).astype(F32)
    value = np.where(bits & 0x80, -value, value)
    return np.where((bits & 0x7F) == 0x7F, F32(np.nan), value).astype(F32)


def fp8_bytes(x: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """x [..., n_kv_heads, head_dim] as e4m3(x / scale[head])."""
    return e4m3_bits((np.asarray(x, F32) / np.asarray(scales, F32)[:, None]).astype(F32))


def fp8_values(stored: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., n_kv_heads, head_dim] float32: e4m3(byte) * scale[head]."""
    return (e4m3_values(stored) * np.asarray(scales, F32)[:, None]).astype(F32)
