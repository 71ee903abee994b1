"""Helpers the tests share: small configs, a refusal's "nothing changed" state, workloads,
an observer, a failing allocator, a tiny model and its oracles."""

import io
import re

import ml_dtypes
import numpy as np

from numbakv import CacheConfig
from numbakv.core.config import TOLERANCE
from numbakv.reference import CellCache, solo_attention
from numbakv.reference.pool import numpy_allocator
from numbakv.serve.model import Model, ModelConfig, rms_norm, rotate, silu
from numbakv.serve.sampling import GREEDY, sample_token


def small_config(**overrides) -> CacheConfig:
    """A small cache: 2 layers (global and window 2), 1 KV head of 4, 16 cells, 4 seqs."""
    fields = dict(
        n_layers=2,
        n_kv_heads=1,
        head_dim=4,
        windows=(0, 2),
        capacity=16,
        max_width=8,
        max_seqs=4,
        initial_cells=4,
    )
    fields.update(overrides)
    return CacheConfig(**fields)


def full_state(cache: CellCache) -> tuple:
    """Everything a refused call must leave unchanged: table, pos of every live sequence,
    free cells, pool and its storage, and for the device its mirror and seq_cells."""
    layers = range(cache.config.n_layers)
    kv = [b"".join(x.tobytes() for x in cache.pool_kv(layer)) for layer in layers]
    mirror = []
    if hasattr(cache, "mirror"):
        mirror = [a.tobytes() for a in (*cache.mirror(), *cache.seq_table())]
    return (
        cache.snapshot(),
        tuple((seq, cache.pos(seq)) for seq in cache.live_seqs),
        cache.free_cells,
        cache.read_len,
        cache.rows,
        cache.generation,
        cache.growth_count,
        cache.allocated_bytes,
        kv,
        mirror,
    )


def as_storage(x, dtype: str) -> np.ndarray:
    """float32 values in a pool's representation of storage `dtype`: float32, float16, or
    uint16 bfloat16 patterns (through ml_dtypes)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        with np.errstate(invalid="ignore"):  # NaN casts warn in ml_dtypes
            return x.astype(ml_dtypes.bfloat16).view(np.uint16)
    return x.astype(dtype)


def pool_values(stored: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of pool entries (`pool_kv`) of storage `dtype`."""
    if dtype == "bfloat16":
        return stored.view(ml_dtypes.bfloat16).astype(np.float32)
    return stored.astype(np.float32)


def as_stored(x, dtype: str) -> np.ndarray:
    """float32 values as a pool of storage `dtype` holds them, widened back to float32;
    bfloat16 through ml_dtypes, an oracle written independently of both caches."""
    return pool_values(as_storage(x, dtype), dtype)


def assert_close(got, expect, err_msg: str = "") -> None:
    """Attention outputs computed in float32 from the same stored values (numbakv's kernels
    and the reference, whatever the storage dtype) agree within TOLERANCE["float32"]."""
    tol = TOLERANCE["float32"]
    np.testing.assert_allclose(got, expect, rtol=tol, atol=tol, err_msg=err_msg)


def step_with(cache: CellCache, seq_ids, width=None):
    """Declares and prepares one step."""
    cache.declare_step(seq_ids)
    return cache.prepare_step(width)


def churn(cache: CellCache, ops: list[int]) -> None:
    """A workload driven by a list of small integers: steps, clones, rewinds, removals."""
    for op in ops:
        live = cache.live_seqs
        kind, arg = op % 6, op // 6
        if kind == 0 or not live:
            if len(live) < cache.config.max_seqs:
                cache.seq_new()
        elif kind in (1, 2) and cache.free_cells:
            n = min(1 + arg % cache.config.max_width, cache.free_cells)
            step_with(cache, [live[(arg + i) % len(live)] for i in range(n)], width=None)
        elif kind == 3 and len(live) < cache.config.max_seqs:
            src = live[arg % len(live)]
            cache.seq_clone(src, upto=arg % (cache.pos(src) + 1))
        elif kind == 4:
            seq = live[arg % len(live)]
            cache.rewind(seq, arg % (cache.pos(seq) + 1))
        elif kind == 5:
            cache.seq_rm(live[arg % len(live)])


class Snapshots:
    """An observer that keeps the table after every step (or every verb): the expectation."""

    def __init__(self, cache, every_verb=False):
        self.every_verb = every_verb
        self.frames = [cache.snapshot()]
        self.events = ["start"]
        self.steps = {}
        cache.add_observer(self)

    def __call__(self, cache, event, step):
        if step is not None or self.every_verb:
            self.frames.append(cache.snapshot())
            self.events.append(event)
        if step is not None:
            self.steps[len(self.frames) - 1] = step.width


def tiny_model(seed: int = 0, windows=(0, 4), **fields):
    """A 2-layer model (global and window 4, GQA 2) small enough for the simulator."""
    config = dict(d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, d_ff=32, windows=windows)
    config.update(fields)
    return Model.from_seed(ModelConfig(**config), seed)


def solo_generate(model, prompt, max_new_tokens, sampling=None, stop_tokens=()):
    """One prompt generated alone through a reference cache holding only its sequence: the
    prompt in one step, then one token per step. Returns (tokens, [per token logits])."""
    sampling = sampling or GREEDY
    size = len(prompt) + max_new_tokens
    cache = CellCache(model.config.cache_config(capacity=size, max_width=size, max_seqs=1))
    seq, rng = cache.seq_new(), sampling.generator()
    tokens, logits, feed = [], [], list(prompt)
    while True:
        step = step_with(cache, [seq] * len(feed))
        row = model.forward(cache, step, feed, [len(feed) - 1])[0]
        tokens.append(sample_token(row, sampling, rng))
        logits.append(row)
        if tokens[-1] in stop_tokens or len(tokens) == max_new_tokens:
            return tokens, logits
        feed = tokens[-1:]


class FlakyAllocator:
    """Refuses once `fail_after` more allocations have succeeded; counts calls. Allocates
    with `base` (host memory by default; the device cache's allocator for a device cache)."""

    def __init__(self, error=MemoryError, base=numpy_allocator):
        self.fail_after = None
        self.error = error
        self.base = base
        self.calls = 0

    def __call__(self, shape, dtype):
        self.calls += 1
        if self.fail_after is not None:
            if self.fail_after == 0:
                raise self.error("no memory")
            self.fail_after -= 1
        return self.base(shape, dtype)


def dense_logits(model: Model, tokens: list[int]) -> np.ndarray:
    """[len(tokens), vocab]: the model over the whole sequence at once, attention by the
    solo oracle over its own keys; no cache, no cells, no masks."""
    cfg, w = model.config, model.weights
    positions = np.arange(len(tokens))
    cos, sin = model._rotary(positions)
    x = w["embed"][tokens]
    for layer, window in enumerate(cfg.windows):
        p = f"layers.{layer}."
        h = rms_norm(x, w[p + "attn_norm"], cfg.norm_eps)
        q = rotate((h @ w[p + "wq"]).reshape(len(x), cfg.n_heads, -1), cos, sin)
        k = rotate((h @ w[p + "wk"]).reshape(len(x), cfg.n_kv_heads, -1), cos, sin)
        v = (h @ w[p + "wv"]).reshape(len(x), cfg.n_kv_heads, -1)
        x = x + solo_attention(q, k, v, positions, window).reshape(len(x), -1) @ w[p + "wo"]
        h = rms_norm(x, w[p + "mlp_norm"], cfg.norm_eps)
        x = x + (silu(h @ w[p + "w_gate"]) * (h @ w[p + "w_up"])) @ w[p + "w_down"]
    return rms_norm(x, w["final_norm"], cfg.norm_eps) @ w["lm_head"]


def plain_attention(q, k, v, scale):
    """float64 softmax(q·kᵀ·scale)·v for one query head over its visible keys: [head_dim]."""
    scores = np.array([np.dot(q, key) for key in k], dtype=np.float64) * scale
    weights = np.exp(scores - scores.max())
    return (weights[:, None] * v).sum(axis=0) / weights.sum()


def solo_expect(q, k_hist, v_hist, positions, window, scale):
    """solo attention spelled out token by token, head by head, in float64."""
    q, k_hist, v_hist = (np.asarray(x, np.float64) for x in (q, k_hist, v_hist))
    n_heads, n_kv_heads = q.shape[1], k_hist.shape[1]
    out = np.zeros(q.shape)
    for i, p in enumerate(positions):
        seen = [j for j in range(p + 1) if window == 0 or j > p - window]
        for h in range(n_heads):
            kv = h * n_kv_heads // n_heads
            out[i, h] = plain_attention(q[i, h], k_hist[seen, kv], v_hist[seen, kv], scale)
    return out


def npy(array, **header) -> bytes:
    """The .npy bytes of `array` (allow_pickle on); `header` overrides its header fields."""
    out = io.BytesIO()
    if header:
        fields = np.lib.format.header_data_from_array_1_0(array) | header
        np.lib.format.write_array_header_1_0(out, fields)
        out.write(array.tobytes())
    else:
        np.save(out, array, allow_pickle=True)
    return out.getvalue()


def stable_id(value) -> str:
    """A parametrized test's id: the value's repr without memory addresses, the same in
    every process (pytest-xdist's workers must collect the same ids)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))
