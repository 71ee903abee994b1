"""How `CacheConfig` resolves its storage fields into one format per layer for K and for V,
and its fp8 scales (docs/contract.md §4.1). Pure checks: they raise ConfigError naming the
bad value and change nothing."""

import math

import numpy as np

from numbakv.checks import real, short_repr
from numbakv.errors import ConfigError
from numbakv.formats import BLOCK, BLOCKED, FORMATS

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
