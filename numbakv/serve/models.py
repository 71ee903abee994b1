"""`ServedModel`: what the `Executor` needs of a model, and nothing more (docs/contract.md §14).

numbakv's `Model` (NumPy) and `DeviceModel` (numba.cuda, device-resident) are two; the
transformers adapter (`numbakv.integrations.transformers.TransformersModel`) is a third;
so is anything of your own with these members:

    model.config.vocab_size, .n_layers, .n_kv_heads, .head_dim, .windows
    model.forward(cache, step, tokens, logits_at) -> [len(logits_at), vocab_size] float32

A device-resident model (`device_resident = True`) may also be captured into a decode
graph: it then answers `stage`, `run` and `logits` (`CapturedModel`).
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from numbakv.core.calls import GEOMETRY
from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.core.values import int_at_least

CONFIG_FIELDS = (*GEOMETRY, "vocab_size")  # what the executor reads of `model.config`
CAPTURE_MEMBERS = ("stage", "run", "logits")  # what a captured decode forward calls


class ModelGeometry(Protocol):
    """A model's config as the executor reads it; the first four must equal the cache's."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    windows: tuple[int, ...]  # per layer, 0 = global, W > 0 = W keys, the token's own included
    vocab_size: int


@runtime_checkable
class ServedModel(Protocol):
    """One forward over a prepared step: tokens in, the requested rows' logits out."""

    config: ModelGeometry

    def forward(self, cache, step, tokens: Sequence[int], logits_at: np.ndarray) -> np.ndarray:
        """[len(logits_at), vocab_size] float32: the logits after the step's tokens
        `logits_at` (int indices into [0, step.width)). `tokens` are [step.width] ids, any
        valid id on padded rows; every layer writes its K/V of the step into `cache` and
        attends through it; rotary positions are `step.positions` (-1 on padded rows)."""


@runtime_checkable
class CapturedModel(ServedModel, Protocol):
    """A device-resident model whose decode forward can be captured and replayed: `stage`
    puts the step's inputs in fixed device buffers, `run` launches every kernel on the
    step's stream reading only those, `logits(n)` copies the first n rows back."""

    device_resident: bool

    def stage(self, cache, step, tokens: Sequence[int], logits_at: np.ndarray) -> None: ...

    def run(self, cache, step) -> None: ...

    def logits(self, n: int) -> np.ndarray: ...


@dataclass(frozen=True)
class ModelShape:
    """A `ModelGeometry` of plain values, for a model that has no config of this shape (the
    transformers adapter's); `cache_config(**fields)` makes the cache that fits it."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    windows: tuple[int, ...]
    vocab_size: int

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_kv_heads", "head_dim", "vocab_size"):
            object.__setattr__(self, name, int_at_least(name, getattr(self, name), 1))
        if isinstance(self.windows, str) or not isinstance(self.windows, Iterable):
            raise ConfigError(f"windows must be a tuple of ints (0 = global), got {self.windows!r}")
        windows = tuple(int_at_least("window", w, 0) for w in self.windows)
        if len(windows) != self.n_layers:
            raise ConfigError(
                f"windows {windows} has {len(windows)} entries, n_layers={self.n_layers}"
            )
        object.__setattr__(self, "windows", windows)

    def cache_config(self, **fields) -> CacheConfig:
        """A `CacheConfig` with this model's layers, KV heads, head_dim and windows; `fields`
        gives the rest (capacity, max_width, max_seqs, dtype, ...)."""
        return CacheConfig(
            n_layers=self.n_layers, n_kv_heads=self.n_kv_heads, head_dim=self.head_dim,
            windows=self.windows, **fields,
        )  # fmt: skip


def check_model(model) -> None:
    """ConfigError naming the first member `model` lacks of `ServedModel` (and, when it says
    it is device-resident, of `CapturedModel`), or whose config field is not an int (a
    tuple of ints for windows)."""
    config = getattr(model, "config", None)
    if config is None:
        raise ConfigError(f"{_name(model)} has no config; a served model needs {_needs()}")
    for field in CONFIG_FIELDS:
        if not hasattr(config, field):
            raise ConfigError(f"{_name(model)}'s config has no {field}; {_needs()}")
    for field in ("n_layers", "n_kv_heads", "head_dim", "vocab_size"):
        int_at_least(f"model.config.{field}", getattr(config, field), 1)
    windows = config.windows
    if not isinstance(windows, tuple) or not all(
        isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in windows
    ):
        raise ConfigError(
            f"{_name(model)}'s config.windows={windows!r}: give a tuple of ints >= 0, one per "
            "layer (0 = global)"
        )
    if not callable(getattr(model, "forward", None)):
        raise ConfigError(f"{_name(model)} has no forward(cache, step, tokens, logits_at)")
    if getattr(model, "device_resident", False):
        for member in CAPTURE_MEMBERS:
            if not callable(getattr(model, member, None)):
                raise ConfigError(
                    f"{_name(model)} says device_resident=True but has no {member}(); a "
                    f"captured model answers {', '.join(CAPTURE_MEMBERS)} (CapturedModel)"
                )


def _name(model) -> str:
    return f"the model {type(model).__name__}"


def _needs() -> str:
    fields = ", ".join(CONFIG_FIELDS)
    return f"config.{{{fields}}} and forward(cache, step, tokens, logits_at) (ServedModel)"
