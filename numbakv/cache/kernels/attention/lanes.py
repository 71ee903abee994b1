"""A lane's part of a K/V row, per storage kind: the loads of the decode kernel.

A lane owns VEC = 8 consecutive elements [d0, d0 + 8) of a head's row (`lane_dims`). Its
loader returns them as float32, unscaled, with the one scale that multiplies all eight:
ggml's block scale d for q8_0, d / 16 for q4_0 (a block of 32 holds four lanes' parts),
the layer's per-head scale * 256 for fp8_e4m3, 1 for float pools. The kernel folds that
scale into the score (q·k · d) and into the weight of the V row (p · d), so a quantized
element costs its decode and no multiply (docs/contract.md §5). Each element is one
instruction wide, as a float16 one is: a q8_0 code is converted in place from its byte
(`wide.s8`), a q4_0 code as the signed byte 16 (code - 8) (its nibble moved up, the bias
flipped: 2 instructions per 4 codes), an e4m3 byte placed as the float16 of value * 2^-8
(2.5 instructions per byte, NaN kept) and widened. code · scale is the reference's value
bit for bit: the powers of two come out exactly (fp8 scales up to 2^120, ≈ 1.3e36).

A wide loader reads with `wide`'s primitives and needs the alignment `ALIGNMENT` states of
the pool's address and strides; a narrow one reads element by element (any head_dim, any
alignment) and returns scaled values with scale 1.
"""

import numpy as np

from numbakv.cache.cuda import int_as_float
from numbakv.cache.kernels import device_function, quant, wide
from numbakv.core.formats import BLOCK

VEC = wide.VEC
ONE = np.float32(1.0)
ZERO = np.float32(0.0)
SIXTEENTH = np.float32(1.0 / 16)  # a q4_0 code is read as 16 x (code - 8)
E4M3_UNIT = np.float32(256.0)  # an e4m3 byte is read as a float16 of value * 2^-8
SIGNS = np.int32(-0x7F7F7F80)  # 0x80808080: the sign bit of each byte
MAGNITUDES = np.int32(0x3F803F80)  # bits 7..13 of each half: where an e4m3 magnitude goes
HALF_ULPS = np.int32(0x00800080)  # 1 at bit 7 of each half
HALF_CARRIES = np.int32(0x40004000)  # bit 14 of each half
NIBBLES = np.int32(-0x0F0F0F10)  # 0xF0F0F0F0: the high nibble of each byte
ROTATE_BYTE = np.int32(0x2107)  # a `wide.prmt` selector: bytes (3, 0, 1, 2), rotl 8
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
def _e4m3_halves(w):
    """A word of 4 e4m3fn bytes (an int32, element k in byte k) as 2 words of float16 pairs:
    (elements 0 and 2, elements 1 and 3), each its value * 2^-8 exactly (subnormals too) and
    NaN where the byte is 0x7F or 0xFF."""
    sign = w & SIGNS
    # the 7 magnitude bits to half bits 7..13, the sign to bit 15 (the signs of bytes 0
    # and 2 rotated up a byte: a shift the compiler would redo from w, one op more)
    even = wide.select(MAGNITUDES, w << np.int32(7), wide.prmt(sign, sign, ROTATE_BYTE))
    odd = wide.select(MAGNITUDES, w >> np.int32(1), sign)
    # magnitude 0x7F carries into bit 14: exponent 31 with a nonzero mantissa, a NaN
    even |= (even + HALF_ULPS) & HALF_CARRIES
    odd |= (odd + HALF_ULPS) & HALF_CARRIES
    return even, odd


def make_loader(kind: str, head_dim: int, is_wide_pool: bool) -> tuple:
    """(load, value) of a pool of `kind`: `load(pool, c, at, d0, kv_scale) -> (raw, scale)`
    reads a lane's elements [d0, d0 + 8) of pool[c] (packed int32 words: 4 of float16 or
    bfloat16 pairs, 4 of q8_0 byte pairs, 2 of q4_0 biased codes, 4 of fp8 as float16 pairs;
    or 8 float32) and their scale. Where c < 0 the values are 0 and the scale finite, or
    (q8_0, q4_0) the values finite and the scale 0: those read cell 0's codes (their last
    block where d0 >= head_dim), which are finite whatever the bytes. `value(raw, i) ->
    float32` widens element i. at = the KV head * the pool's head stride (elements); d0 is a
    multiple of 8; kv_scale is the head's fp8 scale (float32)."""
    code = {"float": quant.FLOAT, "bfloat16": quant.BFLOAT16, "q8_0": quant.Q8_0,
            "q4_0": quant.Q4_0, "fp8_e4m3": quant.FP8}[kind]  # fmt: skip
    dim = np.int32(head_dim)
    q8_bytes, q4_bytes, block = np.int32(quant.Q8_BYTES), np.int32(quant.Q4_BYTES), np.int32(BLOCK)
    zero, one, two, four, eight = np.int32(0), np.int32(1), np.int32(2), np.int32(4), np.int32(8)
    sixteen, fifteen, thirty_one = np.int32(16), np.int32(15), np.int32(31)
    last = np.int32(max(head_dim // BLOCK - 1, 0))  # a quantized head's last block
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
            base = at + min(d0 // block, last) * q8_bytes  # past head_dim: the last block
            cell = max(c, zero)
            words = wide.u16x4(pool, cell, base + two + (d0 & thirty_one), True)
            return words, wide.half(pool, cell, base, c >= zero)[0]

        def value(raw, i):
            return wide.s8(raw[i >> one], (i & one) * eight)

    elif code == quant.Q4_0:

        def load(pool, c, at, d0, kv_scale):
            i = d0 & thirty_one
            base = at + min(d0 // block, last) * q4_bytes
            cell = max(c, zero)
            w = wide.u16x4(pool, cell, base + two + (i & fifteen), True)
            up = four - ((i >> two) & four)  # values 0..15 are the low nibbles: shifted up
            lo = w[0] | (w[1] << sixteen)
            hi = w[2] | (w[3] << sixteen)
            # code - 8 as a signed byte's high nibble: 16 (code - 8), the 16 folded into d
            # (flip and mask are the bias and the nibbles before the shift: one LOP3)
            flip, mask = SIGNS >> up, NIBBLES >> up
            words = (((lo ^ flip) & mask) << up, ((hi ^ flip) & mask) << up)
            return words, wide.half(pool, cell, base, c >= zero)[0] * SIXTEENTH

        def value(raw, i):
            return wide.s8(raw[i >> two], (i & np.int32(3)) * eight)

    else:

        def load(pool, c, at, d0, kv_scale):
            w = wide.u32x2(pool, max(c, zero), at + d0, c >= zero)
            even0, odd0 = _e4m3_halves(w[0])
            even1, odd1 = _e4m3_halves(w[1])
            return (even0, odd0, even1, odd1), kv_scale * E4M3_UNIT

        def value(raw, i):  # element i: word 2 (i // 4) + i % 2, half (i // 2) % 2
            w = raw[((i >> two) << one) | (i & one)]
            return wide.half_lo(w) if (i & two) == 0 else wide.half_hi(w)

    return device_function(load), device_function(value)
