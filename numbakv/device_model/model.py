"""`DeviceModel`: `numbakv.serve.model.Model`'s forward with the hidden state on the device.

A forward is three calls (`docs/contract.md §9`): `stage` checks the tokens and
`logits_at` (the tokens whose logits come back) and sends them to a fixed device buffer in
one asynchronous copy from pinned memory; `run` launches every kernel of the forward
(embedding, per layer the fused norm + QKV + rotary, the cache's write and attend, the
output projection + residual, the fused norm + SwiGLU, the down projection + residual;
then the final norm and LM head of the tokens of logits_at) into fixed device buffers;
`logits` copies their logits back. `run` allocates, copies and synchronizes nothing and
its kernels read every per-step value (tokens, logits_at, positions, the cache's cells)
from device buffers, so its launches, recorded once
(`numbakv.cache.kernels.launch.recording`), can be re-issued for any later step of the
same width after a `stage` (`docs/contract.md §8.2`). The layers compute the tokens
[0, live) only, the step's tokens and every token of logits_at: trailing padding that no
one asked for is skipped (its K/V is never stored and its logits never read).
"""

from dataclasses import dataclass

import numpy as np

from numbakv.cache.cellcache import CellCache
from numbakv.cache.cuda import cuda, is_done, ordering_event
from numbakv.cache.kernels.launch import launch, launch_dims
from numbakv.core.calls import check_geometry
from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError, StepError
from numbakv.core.values import as_int
from numbakv.device_model import kernels
from numbakv.device_model.kernels import LIVE, LOGITS_AT, TOKENS
from numbakv.device_model.tiles import tile_grid
from numbakv.device_model.weights import DeviceWeights, upload
from numbakv.serve.model import Model, check_forward


@dataclass(frozen=True)
class WidthPlan:
    """The views and launch geometry of steps of one width (made once per width).

    x: [width, d_model]; q: [width, n_heads, head_dim]; k, v: [width, n_kv_heads,
    head_dim]; attn: [width, n_heads, head_dim] and attn_flat, its [width, n_heads *
    head_dim] view; hidden: [width, d_ff]; all float32 views of the fixed buffers. The grids
    are (grid, threads) pairs of each kernel.
    """

    x: object
    q: object
    k: object
    v: object
    attn: object
    attn_flat: object
    hidden: object
    embed_grid: tuple
    qkv_grid: tuple
    out_grid: tuple
    mlp_grid: tuple
    head_grid: tuple


class DeviceModel:
    """`model`'s forward on the device, for caches of `cache_config` (whose max_width and
    max_seq_len size the fixed buffers and the rotary table).

    config          : the ModelConfig;  model: the NumPy Model (the weights' source)
    device_resident : True: the hidden state stays on the device, only logits come back;
                      False for a tensor-parallel shard (`numbakv.distributed.shard_model`),
                      whose partial sums meet the other ranks' through the host, twice a
                      layer (`reduce`), so its forward is never captured

    One DeviceModel serves one stream of steps at a time: its buffers are shared by every
    step (a step's logits are valid until the next `run`).
    """

    device_resident = True

    def __init__(self, model: Model, cache_config: CacheConfig):
        if not isinstance(model, Model):
            raise ConfigError(f"expected a numbakv.serve.model.Model, got {model!r}")
        if not isinstance(cache_config, CacheConfig):
            raise ConfigError(f"expected a CacheConfig, got {cache_config!r}")
        cfg = model.config
        check_geometry(cfg, cache_config)
        self.model, self.config, self.cache_config = model, cfg, cache_config
        width, d, hd = cache_config.max_width, cfg.d_model, cfg.head_dim
        self._eps = np.float32(cfg.norm_eps)
        self._weights: DeviceWeights = upload(model, cache_config.max_seq_len)
        # tokens, logits_at and live tokens: [3, max_width + 1] int32 (`kernels`)
        self._staging = cuda.pinned_array((3, width + 1), np.int32)
        self._staging[:] = 0
        self._staging[LIVE, 1:] = np.arange(width)
        self._inputs = cuda.to_device(self._staging)
        self._logits_at, self._live = self._inputs[LOGITS_AT], self._inputs[LIVE]
        self._copied = ordering_event()
        self._has_copied = False
        # the activations, [max_width, ...] float32, zero (finite) where no step wrote
        n_q, n_kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
        self._x, self._q, self._k, self._v, self._attn, self._hidden, self._logits = (
            cuda.to_device(np.zeros((width, n), np.float32))
            for n in (d, n_q, n_kv, n_kv, n_q, cfg.d_ff, cfg.vocab_size)
        )
        self._host_logits = cuda.pinned_array((width, cfg.vocab_size), np.float32)
        self.reduce = model.reduce
        if self.reduce is not None:
            self.device_resident = False
            self._partial = cuda.to_device(np.zeros((width, d), np.float32))
            self._host_partial = cuda.pinned_array((width, d), np.float32)
        self._plans: dict[int, WidthPlan] = {}
        self._stream = None  # the stream of the last staged step
        self._n_logits = 0  # len(logits_at) of the last staged step
        self._staged = None  # the last staged step

    def forward(self, cache: CellCache, step, tokens, logits_at) -> np.ndarray:
        """[len(logits_at), vocab_size] float32: the logits after the step's tokens
        `logits_at`, as `Model.forward` (the same contract and refusals); `stage`, `run`,
        `logits`."""
        self.stage(cache, step, tokens, logits_at)
        self.run(cache, step)
        return self.logits(self._n_logits)

    def stage(self, cache: CellCache, step, tokens, logits_at) -> None:
        """Checks `tokens` ([step.width] ints in [0, vocab_size)) and `logits_at` (at most
        max_width ints in [0, step.width)), reserves the cache's decode workspace and
        copies both into the device inputs, with the count of tokens the layers compute
        (the step's tokens and every token of logits_at: trailing padding no one asked for
        is skipped): one asynchronous copy on the step's stream from pinned memory, after
        the previous copy from it has finished."""
        self._check_cache(cache)
        width, stream = step.width, step.stream
        tokens, at = check_forward(tokens, logits_at, width, self.config.vocab_size)
        if len(at) > self.cache_config.max_width:
            raise StepError(
                f"logits_at asks for {len(at)} logits; a DeviceModel returns at most "
                f"max_width={self.cache_config.max_width} a step"
            )
        cache.reserve(self.config.n_heads)
        if self._has_copied and not is_done(self._copied):
            self._copied.synchronize()
        staged = self._staging
        staged[TOKENS, :width] = tokens
        staged[LOGITS_AT, 0] = len(at)
        staged[LOGITS_AT, 1 : 1 + len(at)] = at
        staged[LIVE, 0] = max(step.n_tokens, int(at.max()) + 1 if len(at) else 0)
        self._inputs.copy_to_device(staged, stream=stream)
        self._copied.record(stream)
        self._has_copied = True
        self._stream, self._n_logits, self._staged = stream, len(at), step
        self._plan(width)

    def run(self, cache: CellCache, step) -> None:
        """Launches the whole forward of the staged step on its stream, from the embedding
        to the LM head; allocates, copies and synchronizes nothing (capturable), but for a
        tensor-parallel shard (`_residual`)."""
        if step is not self._staged:
            raise StepError("run() of a step that was not staged: stage(cache, step, ...) first")
        width, stream, step_buffer = step.width, step.stream, step.buffers.step
        plan, w, eps = self._plan(width), self._weights, self._eps
        launch(kernels.embed, *plan.embed_grid, stream, self._inputs, w.embed, plan.x)
        for layer, lw in enumerate(w.layers):
            launch(
                kernels.qkv_rotary, *plan.qkv_grid, stream, plan.x, self._live,
                lw.attn_norm, eps, lw.w_qkv, w.rotary, step_buffer, plan.q, plan.k, plan.v,
            )  # fmt: skip
            cache.write(layer, plan.k, plan.v)
            cache.attend(layer, plan.q, out=plan.attn)
            self._residual(plan, width, stream, plan.attn_flat, lw.wo)
            launch(
                kernels.swiglu, *plan.mlp_grid, stream, plan.x, self._live, lw.mlp_norm, eps,
                lw.w_gate, lw.w_up, plan.hidden,
            )  # fmt: skip
            self._residual(plan, width, stream, plan.hidden, lw.w_down)
        launch(
            kernels.lm_head, *plan.head_grid, stream, plan.x, self._logits_at, w.final_norm, eps,
            w.lm_head, self._logits,
        )  # fmt: skip

    def _residual(self, plan: WidthPlan, width: int, stream, a, w) -> None:
        """x += a @ w ([width, K] @ [K, d_model]); a shard's product is summed over the ranks
        first (`reduce`, on the host: it copies and synchronizes)."""
        if self.reduce is None:
            launch(kernels.residual_matmul, *plan.out_grid, stream, a, self._live, w, plan.x)
            return
        partial, host = self._partial[:width], self._host_partial[:width]
        launch(kernels.matmul, *plan.out_grid, stream, a, self._live, w, partial)
        partial.copy_to_host(host, stream=stream)
        stream.synchronize()
        partial.copy_to_device(np.ascontiguousarray(self.reduce(host)), stream=stream)
        launch(kernels.add_rows, *plan.embed_grid, stream, self._live, partial, plan.x)

    def logits(self, n: int) -> np.ndarray:
        """[n, vocab_size] float32: a host copy of the logits of the first `n` tokens of
        the last staged step's logits_at, copied on its stream, which is then
        synchronized."""
        n = as_int("n", n, StepError)
        if self._stream is None:
            raise StepError("logits() before any step was staged; call stage() and run()")
        if not 0 <= n <= self._n_logits:
            raise StepError(
                f"n={n} must lie in [0, {self._n_logits}], the tokens of logits_at staged"
            )
        host = self._host_logits[:n]
        if n:
            self._logits[:n].copy_to_host(host, stream=self._stream)
            self._stream.synchronize()
        return host.copy()

    def _plan(self, width: int) -> WidthPlan:
        """The views and grids of steps of `width`, made on first use."""
        if width not in self._plans:
            cfg = self.config
            hd, n_kv = cfg.head_dim, cfg.n_kv_heads
            attn_flat = self._attn[:width]
            self._plans[width] = WidthPlan(
                x=self._x[:width],
                q=self._q[:width].reshape(width, cfg.n_heads, hd),
                k=self._k[:width].reshape(width, n_kv, hd),
                v=self._v[:width].reshape(width, n_kv, hd),
                attn=attn_flat.reshape(width, cfg.n_heads, hd),
                attn_flat=attn_flat,
                hidden=self._hidden[:width],
                embed_grid=launch_dims(width * cfg.d_model),
                qkv_grid=tile_grid(width, (cfg.n_heads + 2 * n_kv) * hd // 2),
                out_grid=tile_grid(width, cfg.d_model),
                mlp_grid=tile_grid(width, cfg.d_ff),
                head_grid=tile_grid(width, cfg.vocab_size),
            )
        return self._plans[width]

    def _check_cache(self, cache) -> None:
        """ConfigError unless `cache` is a device cache this model's buffers can serve."""
        if not isinstance(cache, CellCache):
            raise ConfigError(
                f"a DeviceModel runs on a device cache (numbakv.CellCache), got {cache!r}"
            )
        check_geometry(self.config, cache.config)
        for name in ("max_width", "max_seq_len"):
            have, need = getattr(self.cache_config, name), getattr(cache.config, name)
            if need > have:
                raise ConfigError(
                    f"the cache's {name}={need} exceeds this DeviceModel's {name}={have}; "
                    "build the DeviceModel with the cache's config"
                )
