"""`CacheConfig`: the shape of a cell cache, validated once, shared by both implementations."""

import operator
from dataclasses import dataclass

import numpy as np

from numbakv.errors import ConfigError

STORAGE_DTYPES = ("float32", "float16")
DEFAULT_INITIAL_CELLS = 256


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
    dtype         : storage dtype of K and V, "float32" or "float16"
    max_seq_len   : positions one sequence may hold, which bounds the device's
                    position -> cell table [max_seqs, max_seq_len] int32 for gathered
                    attention; default capacity
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

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_kv_heads", "head_dim", "max_seqs", "max_width"):
            _set(self, name, int_at_least(name, getattr(self, name), 1))
        capacity = int_at_least("capacity", self.capacity, self.max_width)
        _set(self, "capacity", capacity)
        _set(self, "windows", _windows(self.windows, self.n_layers))
        for name, default in (
            ("initial_cells", min(DEFAULT_INITIAL_CELLS, capacity)),
            ("max_seq_len", capacity),
        ):
            _set(self, name, _cells_up_to_capacity(name, getattr(self, name), default, capacity))
        _set(self, "dtype", _dtype(self.dtype))

    @property
    def n_owner_words(self) -> int:
        """uint64 words in each cell's owner bitset: ceil(max_seqs / 64)."""
        return -(-self.max_seqs // 64)

    @property
    def distinct_windows(self) -> tuple[int, ...]:
        """The windows of the model, each once, ascending: one mask per entry."""
        return tuple(sorted(set(self.windows)))

    @property
    def row_bytes(self) -> int:
        """Bytes of K plus V that one cell takes in one layer."""
        return 2 * self.n_kv_heads * self.head_dim * np.dtype(self.dtype).itemsize


def _set(config: CacheConfig, name: str, value) -> None:
    object.__setattr__(config, name, value)


def int_at_least(name: str, value, bound: int) -> int:
    """`value` as an int >= bound (bools refused), or ConfigError naming `name` and the bound."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if value < bound:
        raise ConfigError(f"{name}={value} is below its bound {bound}; give {name} >= {bound}")
    return value


def _cells_up_to_capacity(name: str, value, default: int, capacity: int) -> int:
    """`value` (or `default` when None) as an int in [1, capacity], or ConfigError."""
    value = int_at_least(name, default if value is None else value, 1)
    if value > capacity:
        raise ConfigError(f"{name}={value} exceeds capacity={capacity}; give {name} <= capacity")
    return value


def _windows(windows, n_layers: int) -> tuple[int, ...]:
    if windows is None:
        return (0,) * n_layers
    windows = tuple(int_at_least("windows[i]", w, 0) for w in windows)
    if len(windows) != n_layers:
        raise ConfigError(
            f"windows has {len(windows)} entries but n_layers={n_layers}; give one window per layer"
        )
    return windows


def _dtype(dtype) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = repr(dtype)
    if name not in STORAGE_DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not a storage dtype; give one of {STORAGE_DTYPES}")
    return name
