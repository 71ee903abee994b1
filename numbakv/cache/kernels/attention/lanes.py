"""A lane's part of a K/V row, per storage kind: the loads of the decode kernel.

A lane owns VEC = 8 consecutive elements [d0, d0 + 8) of a head's row (`lane_dims`). Its
loader returns them as float32, unscaled, with the one scale that multiplies all eight:
ggml's block scale d for q8_0 and q4_0 (a block of 32 holds four lanes' parts), the
layer's per-head scale for fp8_e4m3, 1 for float pools. The kernel folds that scale into
the score (q·k · d) and into the weight of the V row (p · d), so a quantized element costs
its decode and no multiply (docs/contract.md §5). The values are bit for bit the
reference's codes: code · d is exact in float32 either way.

A wide loader reads with `wide`'s primitives and needs the alignment `ALIGNMENT` states of
the pool's address and strides; a narrow one reads element by element (any head_dim, any
alignment) and returns scaled values with scale 1.
"""

import numpy as np

from numbakv.cache.cuda import int_as_float
from numbakv.cache.kernels import device_function, quant, wide
from numbakv.formats import BLOCK

VEC = wide.VEC
ONE = np.float32(1.0)
ZERO = np.float32(0.0)
NAN = np.float32(np.nan)
E4M3_BIAS = np.float32(2.0**120)  # 2^(127 - 7): an e4m3 byte's bits placed in a float32
# bytes of alignment a wide loader needs of the pool's address and strides, per kind
ALIGNMENT = {"float": 16, "bfloat16": 16, "fp8_e4m3": 8, "q8_0": 2, "q4_0": 2}


def lane_dims(head_dim: int) -> tuple[int, int]:
    """(lanes of a row, rows of a warp): ceil(head_dim / 8) lanes rounded up to a power of
    two, so that a row's lanes reduce with xor shuffles; 32 // lanes rows per warp."""
    lanes = 1
    while lanes * VEC < head_dim:
        lanes *= 2
    if lanes > 32:
        raise ValueError(f"head_dim={head_dim} needs more than 32 lanes of {VEC}")
    return lanes, 32 // lanes


def is_wide(kind: str, head_dim: int, address: int, strides: tuple) -> bool:
    """Whether a pool of `kind` at `address` with byte `strides` takes the wide loaders."""
    align = ALIGNMENT[kind]
    return (head_dim % VEC == 0 and address % align == 0
            and all(s % align == 0 for s in strides[:2]))  # fmt: skip


@device_function
def _byte(words, i):
    """Byte i (0..7) of 4 words that hold 2 bytes each (`wide.u16x4`), as an int32."""
    return (words[i >> 1] >> ((i & np.int32(1)) * np.int32(8))) & np.int32(0xFF)


@device_function
def _e4m3(x):
    """The float32 value of an e4m3fn byte x (an int32 in [0, 255]; 0x7F and 0xFF are NaN):
    its bits placed in a float32 and scaled by 2^120, exact for subnormals too."""
    bits = ((x & np.int32(0x80)) << np.int32(24)) | ((x & np.int32(0x7F)) << np.int32(20))
    value = int_as_float(bits) * E4M3_BIAS
    return NAN if (x & np.int32(0x7F)) == np.int32(0x7F) else value  # a select, no branch


def make_loader(kind: str, head_dim: int, is_wide_pool: bool) -> tuple:
    """(load, value) of a pool of `kind`: `load(pool, c, at, d0, kv_scale) -> (raw, scale)`
    reads a lane's elements [d0, d0 + 8) of pool[c] as loaded (packed: 4 words of float16,
    bfloat16 or q8_0/q4_0 bytes, 2 words of fp8, or 8 float32) and their scale, or zeros
    (and a finite scale) without reading anything where c < 0; `value(raw, i) -> float32`
    widens element i (0 past head_dim). at = the KV head * the pool's head stride
    (elements); d0 is a multiple of 8 below head_dim; kv_scale is the head's fp8 scale."""
    code = {"float": quant.FLOAT, "bfloat16": quant.BFLOAT16, "q8_0": quant.Q8_0,
            "q4_0": quant.Q4_0, "fp8_e4m3": quant.FP8}[kind]  # fmt: skip
    dim = np.int32(head_dim)
    q8_bytes, q4_bytes, block = np.int32(quant.Q8_BYTES), np.int32(quant.Q4_BYTES), np.int32(BLOCK)
    zero, one, two, four, eight = np.int32(0), np.int32(1), np.int32(2), np.int32(4), np.int32(8)
    sixteen, fifteen = np.int32(16), np.int32(15)
    high = np.int32(-65536)  # 0xFFFF0000: the high bfloat16 of a word, in place
    is_bfloat16 = code == quant.BFLOAT16

    if not is_wide_pool:  # element by element: any head_dim, any alignment; values scaled
        is_float, is_quantized = code == quant.FLOAT, code not in (quant.FLOAT, quant.BFLOAT16)

        @device_function
        def element(pool, c, at, d, kv_scale):
            # closure constants in the conditions: numba compiles the kind's branch only
            if d >= dim or c < zero:
                return ZERO
            if is_quantized:
                h = wide.div(at, wide.div(np.int32(pool.strides[1]), np.int32(pool.itemsize)))
                return quant.load_quantized(pool, c, h, d, code, kv_scale)
            if is_float:
                return np.float32(wide.item(pool, c, at + d))
            return quant.widen_bfloat16(wide.item(pool, c, at + d))

        def load(pool, c, at, d0, kv_scale):
            s = kv_scale
            values = (element(pool, c, at, d0, s), element(pool, c, at, d0 + one, s),
                      element(pool, c, at, d0 + two, s), element(pool, c, at, d0 + np.int32(3), s),
                      element(pool, c, at, d0 + four, s), element(pool, c, at, d0 + np.int32(5), s),
                      element(pool, c, at, d0 + np.int32(6), s),
                      element(pool, c, at, d0 + np.int32(7), s))  # fmt: skip
            return values, ONE

        def value(raw, i):
            return raw[i]

    elif code in (quant.FLOAT, quant.BFLOAT16):

        def load(pool, c, at, d0, kv_scale):
            return wide.row(pool, max(c, zero), at + d0, c >= zero), ONE

        def value(raw, i):
            if len(raw) == 8:  # a float32 row (a constant condition: one branch is compiled)
                return np.float32(raw[i])
            w = raw[i >> one]
            if is_bfloat16:  # the pattern is the top half of the float32
                return int_as_float(w << sixteen) if (i & one) == 0 else int_as_float(w & high)
            return wide.half_lo(w) if (i & one) == 0 else wide.half_hi(w)

    elif code == quant.Q8_0:

        def load(pool, c, at, d0, kv_scale):
            b = d0 // block
            base = at + b * q8_bytes
            cell, ok = max(c, zero), c >= zero
            words = wide.u16x4(pool, cell, base + two + d0 - b * block, ok)
            return words, wide.half(pool, cell, base, ok)[0]

        def value(raw, i):
            return np.float32((_byte(raw, i) << np.int32(24)) >> np.int32(24))  # int8

    elif code == quant.Q4_0:

        def load(pool, c, at, d0, kv_scale):
            b = d0 // block
            i = d0 - b * block
            base = at + b * q4_bytes
            cell, ok = max(c, zero), c >= zero
            w = wide.u16x4(pool, cell, base + two + (i & fifteen), ok)
            shift = (i >> two) & four  # values 16..31 are the high nibbles: shifted down
            w = (w[0] >> shift, w[1] >> shift, w[2] >> shift, w[3] >> shift)
            return w, wide.half(pool, cell, base, ok)[0]

        def value(raw, i):
            return np.float32((_byte(raw, i) & fifteen) - eight)

    else:

        def load(pool, c, at, d0, kv_scale):
            return wide.u32x2(pool, max(c, zero), at + d0, c >= zero), kv_scale

        def value(raw, i):
            return _e4m3((raw[i >> two] >> ((i & np.int32(3)) * eight)) & np.int32(0xFF))

    return device_function(load), device_function(value)
