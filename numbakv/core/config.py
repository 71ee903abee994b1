"""`CacheConfig`: the shape of a cell cache, validated once, shared by both implementations."""

from dataclasses import dataclass

import numpy as np

from numbakv.core.errors import ConfigError
from numbakv.core.formats import (
    ARRAY_DTYPES,
    FORMATS,
    Formats,
    check_blocks,
    format_name,
    head_bytes,
    resolve_formats,
    resolve_scales,
    row_width,
)
from numbakv.core.values import at_most, int_at_least

STORAGE_DTYPES = FORMATS  # every storage format (numbakv.core.formats)
# How far an attention output may be from the reference's and count as the same: relative to
# max(1, the largest |value| of its row), by the dtype its arithmetic rounds to. Every numbakv
# kernel, and the reference, compute in float32 whatever they store, so they are held to the
# float32 entry; a kernel that computes in its storage precision (q and the softmax weights
# rounded to float16 or bfloat16 for its matmuls, as FlashAttention's do) lands near 1 unit
# of roundoff (4.9e-4 for float16, 3.9e-3 for bfloat16), 4 units inside its entry. float32:
# 1e-5 is ~170 ulps, room for any summation order, online-softmax rescaling and a fast exp.
# The quantized formats are read back as float32 (dequantized), so a kernel that computes in
# float32 over the same stored bytes is held to the float32 entry.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2,
             "q8_0": 1e-5, "q4_0": 1e-5, "fp8_e4m3": 1e-5}  # fmt: skip
DEFAULT_INITIAL_CELLS = 256
INT32_MAX = 2**31 - 1  # cells, positions and ids travel as int32
MAX_LAYERS = 2**16  # far past any model; bounded before `windows` is built
# bounds no device reaches: a full pool of a tebibyte, fixed buffers of 64 GiB
MAX_POOL_BYTES = 2**40
MAX_FIXED_BYTES = 2**36


@dataclass(frozen=True)
class CacheConfig:
    """What a cell cache holds and how far it may grow.

    n_layers      : layers, each with its own K and V pool
    n_kv_heads    : key/value heads per layer (query heads are a multiple, see `attend`)
    head_dim      : elements per head
    capacity      : cells the pool may grow to (the most tokens held at once)
    max_width     : tokens one step may carry, padding included
    max_seqs      : sequence ids; owner bitsets have `ceil(max_seqs / 64)` uint64 words
    windows       : per layer, 0 = global attention, W > 0 = a token sees its last W
                    positions; default all global
    initial_cells : rows of the first allocation (it may be larger if a step needs
                    more); default min(256, capacity)
    dtype         : storage format of K and V (`numbakv.core.formats`): "float32", "float16",
                    "bfloat16", "q8_0", "q4_0" or "fp8_e4m3"
    max_seq_len   : positions one sequence may hold, which bounds the device's
                    position -> cell table [max_seqs, max_seq_len] int32 for gathered
                    attention; default capacity
    k_dtype, v_dtype : the format of every layer's K (V), default `dtype`
    layer_dtypes  : per layer None, a format for K and V, or a (K, V) pair of formats,
                    over k_dtype / v_dtype; e.g. ["float16", "q8_0"] for a sliding layer
                    in float16 and a global one in q8_0. Resolved: `formats`
    fp8_scales    : the float32 scales of fp8_e4m3 storage: one real for all, or
                    [n_layers][2 (K, V)][n_kv_heads]; default 1.0. Fixed by the config
                    (calibrated offline, as vLLM's k_scale / v_scale): a value is stored
                    as e4m3(x / scale) and read as e4m3 * scale

    Refused (ConfigError, naming the field): a field that is not an integer (bools, floats,
    strings refused) or below its bound; a count past int32; a config whose full pool or
    fixed buffers (`device_bytes()`) would pass MAX_POOL_BYTES or MAX_FIXED_BYTES; an
    unknown format, a layer_dtypes of the wrong length, q8_0 or q4_0 with head_dim not a
    multiple of 32, an fp8 scale that is not finite and positive.
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    capacity: int
    max_width: int
    max_seqs: int
    windows: tuple[int, ...] | None = None
    initial_cells: int | None = None
    dtype: str = "float32"
    max_seq_len: int | None = None
    k_dtype: str | None = None
    v_dtype: str | None = None
    layer_dtypes: tuple | None = None
    fp8_scales: float | tuple | None = None

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_kv_heads", "head_dim", "max_seqs", "max_width"):
            _set(self, name, int_at_least(name, getattr(self, name), 1))
        capacity = int_at_least("capacity", self.capacity, self.max_width)
        at_most("n_layers", self.n_layers, MAX_LAYERS)
        for name in ("n_kv_heads", "head_dim", "max_seqs", "max_width", "capacity"):
            at_most(name, getattr(self, name), INT32_MAX)
        _set(self, "capacity", capacity)
        _set(self, "windows", _windows(self.windows, self.n_layers))
        for name, default in (
            ("initial_cells", min(DEFAULT_INITIAL_CELLS, capacity)),
            ("max_seq_len", capacity),
        ):
            _set(self, name, _cells_up_to_capacity(name, getattr(self, name), default, capacity))
        _set(self, "dtype", format_name("dtype", self.dtype))
        formats = resolve_formats(
            self.dtype, self.k_dtype, self.v_dtype, self.layer_dtypes, self.n_layers
        )
        check_blocks(formats, self.head_dim)
        for name in ("k_dtype", "v_dtype"):
            if getattr(self, name) is not None:
                _set(self, name, format_name(name, getattr(self, name)))
        if self.layer_dtypes is not None:
            _set(self, "layer_dtypes", tuple(tuple(e) if isinstance(e, list) else e
                                             for e in self.layer_dtypes))  # fmt: skip
        if self.fp8_scales is not None:
            _set(self, "fp8_scales", resolve_scales(self.fp8_scales, self.n_layers,
                                                    self.n_kv_heads))  # fmt: skip
        object.__setattr__(self, "_formats", formats)
        _check_bytes(self)

    @property
    def n_owner_words(self) -> int:
        """uint64 words in each cell's owner bitset: ceil(max_seqs / 64)."""
        return -(-self.max_seqs // 64)

    @property
    def distinct_windows(self) -> tuple[int, ...]:
        """The windows of the model, each once, ascending: one mask per entry."""
        return tuple(sorted(set(self.windows)))

    @property
    def formats(self) -> Formats:
        """Per layer (K format, V format), resolved from dtype, k_dtype, v_dtype and
        layer_dtypes."""
        return self._formats

    @property
    def uniform_dtype(self) -> str | None:
        """The one format of every layer's K and V, or None when they differ."""
        names = {f for pair in self._formats for f in pair}
        return names.pop() if len(names) == 1 else None

    @property
    def storage_dtype(self) -> np.dtype:
        """The dtype of the arrays of the format every K and V has (`uniform_dtype`), else of
        `dtype` (per pool: `pool_dtype`): float32, float16, uint16 (bfloat16 bit patterns)
        or uint8 (q8_0, q4_0, fp8_e4m3 bytes)."""
        return ARRAY_DTYPES[self.uniform_dtype or self.dtype]

    def pool_dtype(self, layer: int, which: int) -> np.dtype:
        """The dtype of layer `layer`'s K (which 0) or V (which 1) array."""
        return ARRAY_DTYPES[self._formats[layer][which]]

    @property
    def tolerance(self) -> float:
        """The default attention tolerance (`TOLERANCE`) of what this config stores: that of
        its loosest format, over every layer's K and V."""
        return max(TOLERANCE[f] for pair in self._formats for f in pair)

    def pool_shape(self, layer: int, which: int, rows: int) -> tuple[int, int, int]:
        """[rows, n_kv_heads, row width] of layer `layer`'s K (which 0) or V (which 1)."""
        return rows, self.n_kv_heads, row_width(self._formats[layer][which], self.head_dim)

    def fp8_scale(self, layer: int, which: int) -> np.ndarray:
        """[n_kv_heads] float32: the fp8 scales of layer `layer`'s K (which 0) or V (1)."""
        if self.fp8_scales is None:
            return np.ones(self.n_kv_heads, np.float32)
        return np.asarray(self.fp8_scales[layer][which], np.float32)

    @property
    def cell_bytes(self) -> int:
        """Bytes of K plus V that one cell takes over all layers (block scales included)."""
        per_head = sum(head_bytes(f, self.head_dim) for pair in self._formats for f in pair)
        return self.n_kv_heads * per_head

    def device_bytes(self) -> dict[str, int]:
        """Bytes the device cache takes, by buffer: "pool" (K and V of every layer at full
        capacity, in their formats), "fp8_scales" ([n_layers, 2, n_kv_heads] float32), the
        fixed buffers allocated once ("masks": one [max_width, capacity]
        uint8 per distinct window, "cell_pos", "cell_owners", "seq_cells" [max_seqs,
        max_seq_len] int32, "seq_len", "step": the [4, max(max_width, 2)] int32 step buffer),
        and "total". The decode kernels' split workspace (rows x n_heads x 32 x head_dim
        float32 per query head count, `CellCache.reserve`) is not counted."""
        sizes = {
            "pool": self.capacity * self.cell_bytes,
            "fp8_scales": 4 * self.n_layers * 2 * self.n_kv_heads,
            "masks": len(self.distinct_windows) * self.max_width * self.capacity,
            "cell_pos": 4 * self.capacity,
            "cell_owners": 8 * self.capacity * self.n_owner_words,
            "seq_cells": 4 * self.max_seqs * self.max_seq_len,
            "seq_len": 4 * self.max_seqs,
            "step": 4 * 4 * max(self.max_width, 2),
        }
        sizes["total"] = sum(sizes.values())
        return sizes


def _set(config: CacheConfig, name: str, value) -> None:
    object.__setattr__(config, name, value)


def _cells_up_to_capacity(name: str, value, default: int, capacity: int) -> int:
    """`value` (or `default` when None) as an int in [1, capacity], or ConfigError."""
    value = int_at_least(name, default if value is None else value, 1)
    if value > capacity:
        raise ConfigError(f"{name}={value} exceeds capacity={capacity}; give {name} <= capacity")
    return value


def _check_bytes(config: CacheConfig) -> None:
    sizes = config.device_bytes()
    fixed = sizes["total"] - sizes["pool"]
    if sizes["pool"] > MAX_POOL_BYTES:
        raise ConfigError(
            f"a full pool takes {sizes['pool']:,} bytes (capacity x cell_bytes), more "
            f"than {MAX_POOL_BYTES:,}; lower capacity, n_layers, n_kv_heads or head_dim"
        )
    if fixed > MAX_FIXED_BYTES:
        parts = ", ".join(
            f"{name} {n:,}" for name, n in sizes.items() if name not in ("pool", "total")
        )
        raise ConfigError(
            f"the fixed buffers take {fixed:,} bytes ({parts}), more than {MAX_FIXED_BYTES:,}; "
            "lower max_seqs x max_seq_len, max_width x capacity or the number of windows"
        )


def _windows(windows, n_layers: int) -> tuple[int, ...]:
    if windows is None:
        return (0,) * n_layers
    if not isinstance(windows, tuple | list | np.ndarray) or np.ndim(windows) != 1:
        raise ConfigError(
            f"windows must be a tuple with one window per layer (0 = global), got {windows!r}"
        )
    windows = tuple(int_at_least(f"windows[{i}]", w, 0) for i, w in enumerate(windows))
    for i, w in enumerate(windows):
        at_most(f"windows[{i}]", w, INT32_MAX)
    if len(windows) != n_layers:
        raise ConfigError(
            f"windows has {len(windows)} entries but n_layers={n_layers}; give one window per layer"
        )
    return windows
