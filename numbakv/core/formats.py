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

import math

import numpy as np

from numbakv.core.errors import ConfigError
from numbakv.core.values import real, short_repr

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


# -- how CacheConfig resolves its storage fields into one format per layer for K and V, and
# its fp8 scales: pure checks that raise ConfigError naming the bad value
Formats = tuple[tuple[str, str], ...]  # per layer: (K's format, V's format)


def format_name(name: str, value) -> str:
    """A storage format's name from its name or anything np.dtype takes ("f4", np.float16,
    ml_dtypes.bfloat16), or ConfigError naming `name`."""
    if isinstance(value, str) and value in FORMATS:
        return value
    text = repr(value)
    if not isinstance(value, dict | list | tuple | set | bytes):  # JSON's shapes: never one
        try:
            text = np.dtype(value).name
        except Exception:  # NumPy raises TypeError, ValueError or its own for a bad spec
            text = repr(value)
    if text not in FORMATS:
        raise ConfigError(
            f"{name}={short_repr(value)} is not a storage format; give one of {FORMATS}"
        )
    return text


def resolve_formats(dtype: str, k_dtype, v_dtype, layer_dtypes, n_layers: int) -> Formats:
    """Per layer (K format, V format): `layer_dtypes[i]` (a format for both, a (K, V) pair,
    or None) over `k_dtype` / `v_dtype` over `dtype`."""
    k = dtype if k_dtype is None else format_name("k_dtype", k_dtype)
    v = dtype if v_dtype is None else format_name("v_dtype", v_dtype)
    if layer_dtypes is None:
        return ((k, v),) * n_layers
    if not isinstance(layer_dtypes, tuple | list) or len(layer_dtypes) != n_layers:
        raise ConfigError(
            f"layer_dtypes={short_repr(layer_dtypes)} must be a list of n_layers={n_layers} "
            "entries, each None, a format, or a (K format, V format) pair"
        )
    formats = []
    for i, entry in enumerate(layer_dtypes):
        if entry is None:
            formats.append((k, v))
        elif isinstance(entry, tuple | list):
            if len(entry) != 2:
                raise ConfigError(f"layer_dtypes[{i}]={short_repr(entry)} is not a (K, V) pair")
            formats.append(tuple(format_name(f"layer_dtypes[{i}]", e) for e in entry))
        else:
            name = format_name(f"layer_dtypes[{i}]", entry)
            formats.append((name, name))
    return tuple(formats)


def check_blocks(formats: Formats, head_dim: int) -> None:
    """ConfigError unless head_dim is a multiple of BLOCK wherever a layer stores q8_0/q4_0."""
    used = sorted({f for pair in formats for f in pair if f in BLOCKED})
    if used and head_dim % BLOCK:
        raise ConfigError(
            f"head_dim={head_dim} is not a multiple of {BLOCK}, which {' and '.join(used)} "
            f"store in blocks of; give head_dim a multiple of {BLOCK} or another format"
        )


def resolve_scales(scales, n_layers: int, n_kv_heads: int) -> tuple:
    """fp8 scales as [n_layers][2 (K, V)][n_kv_heads] floats: None is 1.0 everywhere, one
    real is that everywhere; each finite and positive, else ConfigError naming it."""
    if scales is None:
        scales = 1.0
    if isinstance(scales, np.ndarray):
        scales = scales.tolist()
    if not isinstance(scales, tuple | list):
        scale = _scale("fp8_scales", scales)
        return ((((scale,) * n_kv_heads),) * 2,) * n_layers
    shape = (n_layers, 2, n_kv_heads)
    if np.shape(np.asarray(scales, dtype=object)) != shape:
        raise ConfigError(
            f"fp8_scales has shape {np.shape(np.asarray(scales, dtype=object))}; give one "
            f"real or a nested list [n_layers][2 (K, V)][n_kv_heads] = {list(shape)}"
        )
    return tuple(
        tuple(
            tuple(_scale(f"fp8_scales[{i}][{j}][{h}]", s) for h, s in enumerate(heads))
            for j, heads in enumerate(layer)
        )
        for i, layer in enumerate(scales)
    )


def _scale(name: str, value) -> float:
    """A finite positive real that stays finite and positive as a float32."""
    scale = real(name, value, ConfigError)
    narrowed = float(np.float32(scale)) if math.isfinite(scale) and abs(scale) < 3e38 else 0.0
    if not (scale > 0 and 0 < narrowed < math.inf):
        raise ConfigError(f"{name}={short_repr(value)} is not a finite positive float32 scale")
    return narrowed
