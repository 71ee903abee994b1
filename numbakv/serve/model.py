"""A small Llama-style decoder in NumPy whose attention runs through any cell cache.

RMSNorm, rotary position embedding at the step's positions, grouped-query attention through
`cache.write` / `cache.attend` (reference or device: anything that answers docs/contract.md
§3 and §5), a SwiGLU MLP and per-layer windows (global and sliding layers mixed). Weights
come from a seed or an `.npz`; the vocabulary is `ModelConfig.vocab_size` tokens (256 by
default, the byte tokenizer's). float32 throughout; no numba.

    model = Model.from_seed(ModelConfig(), seed=0)
    cache.declare_step([a] * 5)
    step = cache.prepare_step()
    logits = model.forward(cache, step, encode("hello"), logits_at=[4])  # [1, vocab] float32
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from numbakv.core.arrays import as_host
from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError, StepError
from numbakv.core.values import int_at_least, real, token_ids
from numbakv.serve.tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class ModelConfig:
    """The model's shape.

    d_model    : width of the residual stream
    n_heads    : query heads per layer, a multiple of n_kv_heads
    n_kv_heads : key/value heads per layer (grouped-query attention)
    head_dim   : elements per head, even (rotary pairs)
    d_ff       : hidden width of the SwiGLU MLP
    windows    : per layer, 0 = global, W > 0 = sliding window of W positions
    rope_theta : rotary base; norm_eps: RMSNorm epsilon
    vocab_size : tokens are ids in [0, vocab_size); logits are [vocab_size] float32
    """

    d_model: int = 32
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 8
    d_ff: int = 64
    windows: tuple[int, ...] = (0, 8)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    vocab_size: int = VOCAB_SIZE

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"):
            object.__setattr__(self, name, int_at_least(name, getattr(self, name), 1))
        if isinstance(self.windows, str) or not isinstance(self.windows, Iterable):
            raise ConfigError(f"windows must be a tuple of ints (0 = global), got {self.windows!r}")
        windows = tuple(int_at_least("window", w, 0) for w in self.windows)
        if not windows:
            raise ConfigError("windows needs one entry per layer, got none")
        object.__setattr__(self, "windows", windows)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotary pairs")
        for name in ("rope_theta", "norm_eps"):
            object.__setattr__(self, name, real(name, getattr(self, name), ConfigError))
        if not (1 < self.rope_theta < np.inf and 0 < self.norm_eps < np.inf):
            raise ConfigError(
                f"rope_theta={self.rope_theta} must be > 1, norm_eps={self.norm_eps} > 0 "
                "(both finite)"
            )

    @property
    def n_layers(self) -> int:
        return len(self.windows)

    def cache_config(self, **fields) -> CacheConfig:
        """A `CacheConfig` with this model's layers, KV heads, head_dim and windows; `fields`
        gives the rest (capacity, max_width, max_seqs, ...)."""
        return CacheConfig(
            n_layers=self.n_layers,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            windows=self.windows,
            **fields,
        )


class Model:
    """The decoder's weights and its forward through a cell cache.

    weights : name -> float32 array; "embed" [vocab_size, d_model], "final_norm" [d_model],
              "lm_head" [d_model, vocab_size], and per layer i "layers.i.attn_norm" [d_model],
              "layers.i.wq" [d_model, n_heads*head_dim], "layers.i.wk" and
              "layers.i.wv" [d_model, n_kv_heads*head_dim], "layers.i.wo"
              [n_heads*head_dim, d_model], "layers.i.mlp_norm" [d_model],
              "layers.i.w_gate" and "layers.i.w_up" [d_model, d_ff], "layers.i.w_down"
              [d_ff, d_model]
    reduce  : None, or the sum over tensor-parallel ranks of each layer's partial attention
              output and MLP output, [width, d_model] float32 (a shard of
              `numbakv.distributed.shard_model` has one)
    """

    reduce: Callable[[np.ndarray], np.ndarray] | None = None

    def __init__(self, config: ModelConfig, weights: dict[str, np.ndarray]):
        if not isinstance(config, ModelConfig):
            raise ConfigError(f"expected a ModelConfig, got {config!r}")
        if not isinstance(weights, Mapping):
            raise ConfigError(f"weights must be a dict of name -> array, got {weights!r}")
        expected = weight_shapes(config)
        if set(weights) != set(expected):
            missing, extra = set(expected) - set(weights), set(weights) - set(expected)
            raise ConfigError(f"weights missing {sorted(missing)}, unexpected {sorted(extra)}")
        self.config = config
        self.weights = {
            name: _weight(name, weights[name], shape) for name, shape in expected.items()
        }
        half = config.head_dim // 2
        self._inv_freq = config.rope_theta ** (-np.arange(half, dtype=np.float64) / half)

    @classmethod
    def from_seed(cls, config: ModelConfig, seed: int = 0) -> "Model":
        """Random weights: normal / sqrt(fan_in), norms 1, the LM head scaled up x4 so that
        greedy choices are far from ties."""
        rng = np.random.default_rng(seed)
        weights = {}
        for name, shape in weight_shapes(config).items():
            if name.endswith("norm"):
                weights[name] = np.ones(shape, dtype=np.float32)
            else:
                gain = 4.0 if name == "lm_head" else 1.0
                w = rng.standard_normal(shape) * (
                    gain / np.sqrt(shape[0] if name != "embed" else 1)
                )
                weights[name] = w.astype(np.float32)
        return cls(config, weights)

    @classmethod
    def load(cls, path) -> "Model":
        """A model saved by `save`; a file written before `vocab_size` was saved has the
        default vocabulary (256)."""
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
        fields = {
            k[len("config.") :]: arrays.pop(k) for k in list(arrays) if k.startswith("config.")
        }
        fields = {k: tuple(v.tolist()) if v.ndim else v.item() for k, v in fields.items()}
        return cls(ModelConfig(**fields), arrays)

    def save(self, path) -> None:
        """Writes the config and the weights to one `.npz`."""
        config = {f"config.{k}": np.asarray(v) for k, v in asdict(self.config).items()}
        np.savez(path, **config, **self.weights)

    def forward(self, cache, step, tokens, logits_at) -> np.ndarray:
        """[len(logits_at), vocab_size] float32: the logits after the step's tokens
        `logits_at`.

        cache  : a cell cache with `step` prepared (reference or device); every layer's K/V
                 of the step is written into it
        step   : the prepared `Step`; its positions drive the rotary embedding
        tokens : [step.width] int in [0, vocab_size), the step's tokens (any valid token on
                 padded rows)
        logits_at : int indices into [0, step.width): the tokens whose logits come back
        """
        cfg, w = self.config, self.weights
        tokens, logits_at = check_forward(tokens, logits_at, step.width, cfg.vocab_size)
        cos, sin = self._rotary(np.maximum(step.positions, 0))
        x = w["embed"][tokens]  # [width, d_model]
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            h = rms_norm(x, w[p + "attn_norm"], cfg.norm_eps)
            q = rotate(self._heads(h @ w[p + "wq"], cfg.n_heads), cos, sin)
            k = rotate(self._heads(h @ w[p + "wk"], cfg.n_kv_heads), cos, sin)
            v = self._heads(h @ w[p + "wv"], cfg.n_kv_heads)
            cache.write(layer, k, v)
            attended = as_host(cache.attend(layer, q))  # [width, n_heads, head_dim]
            x = x + self._summed(attended.reshape(step.width, -1) @ w[p + "wo"])
            h = rms_norm(x, w[p + "mlp_norm"], cfg.norm_eps)
            x = x + self._summed(
                (silu(h @ w[p + "w_gate"]) * (h @ w[p + "w_up"])) @ w[p + "w_down"]
            )
        x = rms_norm(x[logits_at], w["final_norm"], cfg.norm_eps)
        return x @ w["lm_head"]

    def _summed(self, partial: np.ndarray) -> np.ndarray:
        return partial if self.reduce is None else self.reduce(partial)

    def _heads(self, x: np.ndarray, n_heads: int) -> np.ndarray:
        """[width, n_heads * head_dim] -> [width, n_heads, head_dim]."""
        return x.reshape(len(x), n_heads, self.config.head_dim)

    def _rotary(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin, [width, 1, head_dim / 2] float32, of each position's angles."""
        angles = positions.astype(np.float64)[:, None] * self._inv_freq
        return np.cos(angles)[:, None].astype(np.float32), np.sin(angles)[:, None].astype(
            np.float32
        )


def _weight(name: str, value, shape: tuple[int, ...]) -> np.ndarray:
    """`value` as a float32 array of `shape`, or ConfigError: real numbers, all finite."""
    array = np.asarray(value)
    if array.shape != shape:
        raise ConfigError(f"weight {name} has shape {array.shape}, not {shape}")
    if array.dtype.kind not in "fiu":
        raise ConfigError(f"weight {name} has dtype {array.dtype}; give real numbers (float32)")
    with np.errstate(over="ignore"):  # past float32's range: inf, refused below
        array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise ConfigError(f"weight {name} holds NaN or inf (as float32); give finite weights")
    return array


def check_forward(tokens, logits_at, width: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A forward's arguments checked: `tokens` as [width] ids in [0, vocab_size) and
    `logits_at` as int64 indices into [0, width) (`check_logits_at`), or StepError."""
    tokens = np.asarray(token_ids("tokens", tokens, vocab_size, StepError))
    if tokens.shape != (width,):
        raise StepError(f"tokens must be [{width}] ints (the step's width), got {tokens}")
    return tokens, check_logits_at(logits_at, width)


def check_logits_at(logits_at, width: int) -> np.ndarray:
    """`logits_at` as an int64 array of token indices into [0, width), or StepError."""
    array = np.asarray(logits_at)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise StepError(f"logits_at must be a list of ints in [0, {width}), got {logits_at!r}")
    if array.size and not (array.min() >= 0 and array.max() < width):
        raise StepError(f"logits_at {array.tolist()} must lie in [0, step width={width})")
    return array.astype(np.int64)


def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape (see `Model`)."""
    d, hd = config.d_model, config.head_dim
    vocab = config.vocab_size
    shapes = {"embed": (vocab, d), "final_norm": (d,), "lm_head": (d, vocab)}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        shapes |= {
            p + "attn_norm": (d,),
            p + "wq": (d, config.n_heads * hd),
            p + "wk": (d, config.n_kv_heads * hd),
            p + "wv": (d, config.n_kv_heads * hd),
            p + "wo": (config.n_heads * hd, d),
            p + "mlp_norm": (d,),
            p + "w_gate": (d, config.d_ff),
            p + "w_up": (d, config.d_ff),
            p + "w_down": (config.d_ff, d),
        }
    return shapes


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, float32."""
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return (x * scale * weight).astype(np.float32)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotary embedding, Llama's half-split pairing: element i pairs with i + head_dim/2.

    x : [width, n_heads, head_dim] float32; cos, sin : [width, 1, head_dim / 2] float32
    """
    first, second = np.split(x, 2, axis=-1)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1) + np.exp(-x))
