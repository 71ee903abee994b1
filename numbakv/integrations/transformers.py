"""A Hugging Face transformers causal LM served through numbakv (docs/contract.md §14.2).

    hf = AutoModelForCausalLM.from_pretrained(name)
    model = TransformersModel(hf)
    cache = CellCache(cache_config(hf.config, capacity=4096, max_width=256, max_seqs=8))
    engine = Engine(Executor(model, cache, max_sessions=8, max_session_tokens=512))
    [done] = engine.generate([prompt_ids], max_new_tokens=32)

`TransformersModel` is a `ServedModel`: one forward runs transformers' own layers (its
embeddings, norms, rotary embedding at the step's positions, MLPs, LM head) over the step's
tokens packed into one row, with every attention layer's K/V written into the numbakv cache
and attended through it (`cache.write`, `cache.attend`: either cache). transformers' own
cache is off and it builds no mask: which keys a token sees is the cell table's business.
Attention goes through an attention function registered with transformers'
`AttentionInterface` as "numbakv"; outside a numbakv forward (the wrapped model's own
`generate`, say) it is transformers' SDPA with transformers' masks (docs/contract.md §14.2).

Needs torch and transformers (`pip install numbakv[transformers]`), imported only here.
"""

import contextlib
import contextvars
from dataclasses import replace

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from numbakv.core.errors import ConfigError, StepError
from numbakv.integrations.hf_config import cache_config, geometry
from numbakv.serve.model import check_forward
from numbakv.serve.models import ModelShape

__all__ = ["IMPLEMENTATION", "TransformersModel", "cache_config"]

IMPLEMENTATION = "numbakv"  # the attention function's name in transformers' registries


class _Forward:
    """One forward through numbakv: the cache it attends through (None: a probe, whose
    attention gives each token its own q) and the layers attended so far, each once, with
    the window transformers passed each."""

    def __init__(self, cache=None):
        self.cache, self.windows, self.kv_shapes = cache, {}, {}

    def attention(self, module, query, key, value, kwargs: dict):
        layer = module.layer_idx
        if layer in self.windows:
            raise ConfigError(
                f"layer {layer}'s attention ({type(module).__name__}) ran twice in one forward; "
                "numbakv keeps one K and V per layer and step"
            )
        if kwargs.get("softcap") is not None:
            raise ConfigError(f"layer {layer} asks for soft-capping, which numbakv lacks")
        self.windows[layer] = kwargs.get("sliding_window") or 0
        self.kv_shapes[layer] = (key.shape[1], key.shape[-1])  # (KV heads, head_dim)
        if self.cache is None:
            return query.transpose(1, 2), None
        self.cache.write(layer, key[0].transpose(0, 1), value[0].transpose(0, 1))
        out = self.cache.attend(layer, query[0].transpose(0, 1), scale=kwargs.get("scaling"))
        return out[None], None

    def check(self, hf_model, n_layers: int, windows: tuple[int, ...] | None = None) -> None:
        """ConfigError unless every layer's attention went through numbakv, with `windows`
        (when given) the windows transformers passed."""
        missing = sorted(set(range(n_layers)) - set(self.windows))
        if missing:
            raise ConfigError(
                f"the attention of layers {missing} did not go through numbakv: the model's "
                f"attention implementation is {hf_model.config._attn_implementation!r}; wrap "
                "it again, or give a model whose attention transformers' AttentionInterface "
                "dispatches"
            )
        passed = tuple(self.windows[layer] for layer in range(n_layers))
        if windows is not None and passed != windows:
            raise ConfigError(
                f"the layers' attention was called with windows {passed}, not the {windows} "
                "the model was wrapped with (and its cache made for); wrap it again"
            )


_FORWARD = contextvars.ContextVar("numbakv_forward", default=None)  # the one in progress


def _attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention call: query [1, n_heads, width, head_dim], key and value
    [1, n_kv_heads, width, head_dim] (rotary applied) -> ([1, width, n_heads, head_dim],
    None), through the forward in progress (none: transformers' SDPA)."""
    forward = _FORWARD.get()
    if forward is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return forward.attention(module, query, key, value, kwargs)


def _mask(*args, **kwargs):
    """No mask in a numbakv forward (the cells decide); transformers' SDPA mask outside."""
    return None if _FORWARD.get() is not None else sdpa_mask(*args, **kwargs)


AttentionInterface.register(IMPLEMENTATION, _attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, _mask)


class TransformersModel:
    """A transformers causal LM (`PreTrainedModel` with an LM head: Llama, Mistral,
    Ministral, Phi-3 and EXAONE 4 with sliding windows, Qwen2, Qwen3, Gemma, Gemma 3, ...)
    as a numbakv model.

    config   : `ModelShape` (n_layers, n_kv_heads, head_dim, windows, vocab_size): the HF
               config's, each layer's window as transformers passes it to that layer's
               attention (in the probe forwards at wrapping, `_probe`); `config.cache_config`
               makes the cache that fits (`cache_config(hf.config, ...)` too, where the
               config says what the layers do)
    hf_model : the model, put in eval mode, its attention implementation set to "numbakv"
    stop_tokens : the ids its own `generate` stops at (`eos_ids`): the Engine's default

    Refused (ConfigError, the model left as it was) when it is no causal LM, when its config
    asks for what numbakv does not implement (`hf_config.check_supported`: soft-capping,
    ALiBi, attention sinks, rotary scaling by the forward's length, non-causal or chunked
    layers, ...), when an attention layer is not causal, when its parameters lie on more
    than one device, or when the probe finds a layer whose attention does not go through
    numbakv exactly once with the config's K shape, or tokens of one row that change each
    other outside attention.
    """

    device_resident = False  # its activations are torch's; each forward runs eagerly

    def __init__(self, hf_model):
        hf_config = getattr(hf_model, "config", None)
        if not isinstance(hf_model, torch.nn.Module) or hf_config is None:
            raise ConfigError(f"expected a transformers model, got {type(hf_model).__name__}")
        if not callable(getattr(hf_model, "get_output_embeddings", None)) or (
            hf_model.get_output_embeddings() is None
        ):
            raise ConfigError(
                f"{type(hf_model).__name__} has no LM head; wrap a causal LM (AutoModelForCausalLM)"
            )
        shape = _split(hf_model, geometry(hf_config))
        _check_layers(hf_model, shape.n_layers)
        devices = sorted({str(p.device) for p in hf_model.parameters()})
        if len(devices) != 1:
            raise ConfigError(f"the model's parameters lie on {devices}; give it one device")
        self.hf_model, self._shape = hf_model, shape
        self.stop_tokens = eos_ids(hf_model)
        self._device = next(hf_model.parameters()).device
        previous, training = hf_config._attn_implementation, hf_model.training
        try:
            hf_model.set_attn_implementation(IMPLEMENTATION)
            hf_model.eval()
            self.config: ModelShape = replace(shape, windows=self._probe(shape.n_layers))
        except BaseException as error:
            hf_model.set_attn_implementation(previous)
            hf_model.train(training)
            if isinstance(error, ValueError | ImportError):  # transformers' own refusal
                raise ConfigError(f"{type(hf_model).__name__}: {error}") from error
            raise

    def forward(self, cache, step, tokens, logits_at) -> np.ndarray:
        """[len(logits_at), vocab_size] float32: the logits after the step's tokens
        `logits_at`, from one forward of the HF model over the step's [step.width] tokens
        (padded rows at position 0: their K/V go to no cell, their attention is 0)."""
        tokens, logits_at = check_forward(tokens, logits_at, step.width, self.config.vocab_size)
        if self.hf_model.training:
            raise StepError("the model is in training mode (dropout on); call hf_model.eval()")
        if self._device.type == "cuda" and not hasattr(step, "stream"):
            raise StepError(
                f"the model is on {self._device}: serve it over the device cache "
                "(numbakv.CellCache), whose steps have a stream, or move it to the CPU"
            )
        positions = np.maximum(step.positions, 0)
        forward = _Forward(cache)
        with _on_stream(self._device, step):
            logits = self._run(forward, tokens, positions, logits_at).float().cpu()
        forward.check(self.hf_model, self.config.n_layers, self.config.windows)
        return logits.numpy()

    def _probe(self, n_layers: int) -> tuple[int, ...]:
        """Each layer's window as transformers passes it to the layer's attention, from probe
        forwards (each token's attention its own q) of two tokens at position 0 packed in
        one row and of each alone: ConfigError unless every layer attends once and the row's
        tokens come out as alone, i.e. the model mixes tokens only in attention and takes
        positions from `position_ids`, as a packed step needs."""
        tokens, zeros = np.array([1, 2]), np.zeros(2, np.int64)
        probes = [_Forward() for _ in range(3)]
        packed = self._run(probes[0], tokens, zeros, np.arange(2))
        alone = [
            self._run(p, tokens[i : i + 1], zeros[:1], zeros[:1]) for i, p in enumerate(probes[1:])
        ]
        for probe in probes:
            probe.check(self.hf_model, n_layers)
        alone = torch.cat(alone).float()
        tolerance = (1e-4 if packed.dtype == torch.float32 else 3e-2) * alone.abs().max().item()
        if not torch.allclose(packed.float(), alone, rtol=0, atol=tolerance):
            raise ConfigError(
                f"{type(self.hf_model).__name__} gives two tokens at position 0 in one row other "
                "logits than each alone: it mixes tokens outside attention or takes positions "
                "from their index, so sequences packed in one step would change each other"
            )
        for layer, kv_shape in probes[0].kv_shapes.items():
            if kv_shape != (self._shape.n_kv_heads, self._shape.head_dim):
                raise ConfigError(
                    f"layer {layer}'s attention gets K of {kv_shape[0]} heads of {kv_shape[1]}; "
                    f"the config says {self._shape.n_kv_heads} of {self._shape.head_dim}"
                )
        windows = tuple(int(probes[0].windows[layer]) for layer in range(n_layers))
        if any(w < 0 for w in windows):
            raise ConfigError(f"transformers passes the layers sliding windows {windows}")
        return windows

    def _run(self, forward: _Forward, tokens, positions, logits_at) -> torch.Tensor:
        """[len(logits_at), vocab_size] logits of one HF forward of one row through `forward`."""
        as_long = {"dtype": torch.long, "device": self._device}
        entered = _FORWARD.set(forward)
        try:
            with torch.inference_mode():
                out = self.hf_model(
                    input_ids=torch.as_tensor(tokens, **as_long)[None],
                    position_ids=torch.as_tensor(positions, **as_long)[None],
                    use_cache=False, logits_to_keep=torch.as_tensor(logits_at, **as_long),
                )  # fmt: skip
        finally:
            _FORWARD.reset(entered)
        return out.logits[0]


def eos_ids(hf_model) -> frozenset[int]:
    """The ids transformers' `generate` stops at: the generation config's eos_token_id (an
    int or a list of them), else the model config's; none where neither names one."""
    eos = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(hf_model.config, "eos_token_id", None)
    ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list | tuple) else []
    return frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool))


def _split(hf_model, shape: ModelShape) -> ModelShape:
    """`shape` with this rank's KV heads when transformers split the model over `tp_size`
    ranks (`from_pretrained(..., tp_plan="auto")`): ConfigError unless every rank holds
    whole KV heads (its plan cuts the K and V projections' columns evenly)."""
    tp = getattr(hf_model, "tp_size", None) or 1
    if tp == 1:
        return shape
    if shape.n_kv_heads % tp:
        raise ConfigError(
            f"transformers split the model over {tp} ranks (tp_plan), which cuts its "
            f"n_kv_heads={shape.n_kv_heads} K/V heads apart; numbakv keeps whole heads on "
            f"each rank: use a number of ranks that divides {shape.n_kv_heads}"
        )
    return replace(shape, n_kv_heads=shape.n_kv_heads // tp)


def _check_layers(hf_model, n_layers: int) -> None:
    """ConfigError unless the model has one causal attention module per layer (transformers'
    `layer_idx` and `is_causal`), none with attention sinks."""
    decoder = hf_model.get_decoder() if callable(getattr(hf_model, "get_decoder", None)) else None
    layers = {}
    for module in (decoder or hf_model).modules():
        if hasattr(module, "layer_idx") and hasattr(module, "is_causal"):
            if module.layer_idx in layers:
                raise ConfigError(
                    f"two attention modules of layer {module.layer_idx}: numbakv keeps one K "
                    "and V per layer"
                )
            layers[module.layer_idx] = module
    if sorted(layers) != list(range(n_layers)):
        raise ConfigError(
            f"{type(hf_model).__name__} has attention modules (transformers' layer_idx and "
            f"is_causal) for layers {sorted(layers)}, not for each of num_hidden_layers="
            f"{n_layers}: its attention does not go through transformers' AttentionInterface"
        )
    for layer, module in layers.items():
        if not module.is_causal:
            raise ConfigError(f"attention layer {layer} is not causal; numbakv serves causal LMs")
        if getattr(module, "sinks", None) is not None:
            raise ConfigError(f"attention layer {layer} has attention sinks; numbakv has none")


def _on_stream(device: torch.device, step):
    """A CUDA model's kernels go on the step's stream, in order with the cache's."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    _, handle = step.stream.__cuda_stream__()  # a numba stream: (version, CUstream)
    return torch.cuda.stream(torch.cuda.ExternalStream(handle, device=device))
