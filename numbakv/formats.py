"""The storage formats of K and V (docs/contract.md §4.1): what one cell of one KV head holds.

A pool array of format `f` is `[rows, n_kv_heads, row_width(f, head_dim)]` of
`ARRAY_DTYPES[f]`:

float32, float16 : the values, rounded to nearest even
bfloat16         : the values' bfloat16 bit patterns as uint16 (the top half of a float32)
q8_0             : ggml's blocks of 32 consecutive values along head_dim, 34 bytes each:
                   the float16 scale d (2 bytes, little-endian), then 32 int8 codes;
                   value i of the block = code[i] * d
q4_0             : ggml's blocks of 32 values, 18 bytes each: the float16 scale d, then 16
                   bytes; byte j holds value j's code in its low nibble and value j + 16's
                   in its high nibble; value = (code - 8) * d
fp8_e4m3         : one OCP e4m3fn byte per value; value = e4m3(byte) * scale, one float32
                   scale per layer, K or V, and KV head (`CacheConfig.fp8_scales`)

No scale spans two cells: every format is cell-local, so sharing, clones, rewinds and
growth move or keep whole cells and never re-quantize.
"""

import numpy as np

BLOCK = 32  # values per q8_0 / q4_0 block
FLOATS = ("float32", "float16", "bfloat16")
QUANTIZED = ("q8_0", "q4_0", "fp8_e4m3")
FORMATS = FLOATS + QUANTIZED
BLOCKED = ("q8_0", "q4_0")  # the formats with a float16 scale per block of 32
ARRAY_DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "q8_0": np.dtype(np.uint8),
    "q4_0": np.dtype(np.uint8),
    "fp8_e4m3": np.dtype(np.uint8),
}
BLOCK_BYTES = {"q8_0": 2 + BLOCK, "q4_0": 2 + BLOCK // 2}
FP8_MAX = 448.0  # the largest finite e4m3fn value; larger magnitudes saturate to it


def row_width(fmt: str, head_dim: int) -> int:
    """Entries of `ARRAY_DTYPES[fmt]` that one cell of one KV head takes."""
    if fmt in BLOCK_BYTES:
        return head_dim // BLOCK * BLOCK_BYTES[fmt]
    return head_dim


def head_bytes(fmt: str, head_dim: int) -> int:
    """Bytes that one cell of one KV head takes (scales of q8_0 / q4_0 included; fp8's
    per-head scales are not per cell)."""
    return row_width(fmt, head_dim) * ARRAY_DTYPES[fmt].itemsize


def bits_per_value(fmt: str) -> float:
    """Stored bits per K or V value: 32, 16, 16, 8.5, 4.5, 8."""
    return 8 * head_bytes(fmt, BLOCK) / BLOCK
