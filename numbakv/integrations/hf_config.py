"""What a Hugging Face model config means to numbakv: its geometry, or a `ConfigError` naming
what numbakv does not implement (docs/contract.md §14.2). Reads attributes only: no torch,
no transformers.

A layer's window comes from `layer_types` where the config has them ("full_attention": 0,
"sliding_attention": `sliding_window`), else `sliding_window` on every layer for the
families that apply it so (`SLIDING_EVERY_LAYER`: Mistral's configs), else 0 (a
`sliding_window` left in a Llama's config.json changes nothing in transformers).
transformers' sliding window lets a query see keys with `q - k < sliding_window`: W keys,
its own included, which is numbakv's window W. `TransformersModel` asks the model itself
(each layer's attention call says its window) and the executor holds the cache to that.
"""

from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.serve.models import ModelShape

LAYER_WINDOWS = {"full_attention": False, "sliding_attention": True}  # True: the window

# (attribute, what it asks for): a config whose attribute is set (not None, False, 0) asks
# for attention numbakv does not compute; served anyway it would give other logits
REFUSED = (
    ("attn_logit_softcapping", "attention logit soft-capping (tanh of the scores)"),
    ("alibi", "ALiBi position biases"),
    ("use_alibi", "ALiBi position biases"),
    ("use_bidirectional_attention", "bidirectional (non-causal) attention"),
    ("is_encoder_decoder", "an encoder-decoder model (cross and non-causal attention)"),
    ("attention_chunk_size", "chunked attention (each token sees only its chunk)"),
    ("kv_lora_rank", "multi-head latent attention (compressed K/V)"),
)
REFUSED_TYPES = {
    "gpt_oss": "attention sinks (a learned logit per head in the softmax)",
    "bloom": "ALiBi position biases",
    "mpt": "ALiBi position biases",
    "diffllama": "two attentions per layer over one K and two Vs (differential attention)",
}
# rotary scalings whose frequencies follow the longest position of the whole forward: in a
# step of several sequences, one sequence's rotation would depend on the others'
REFUSED_ROPE = ("dynamic", "longrope")
# model types that slide every layer by `sliding_window` when the config has no layer_types
SLIDING_EVERY_LAYER = frozenset(
    {"mistral", "mixtral", "phi3", "starcoder2", "olmoe", "minimax", "ministral3"}
)


def text_config(hf_config):
    """The text model's config of `hf_config` (a multimodal config's text part)."""
    get = getattr(hf_config, "get_text_config", None)
    return get() if callable(get) else hf_config


def check_supported(hf_config) -> None:
    """ConfigError naming the first option of `hf_config` numbakv does not implement."""
    config = text_config(hf_config)
    model_type = getattr(config, "model_type", None)
    if model_type in REFUSED_TYPES:
        raise ConfigError(
            f"model_type={model_type!r} uses {REFUSED_TYPES[model_type]}, which numbakv does "
            "not implement; its attention would be computed without it"
        )
    for name, meaning in REFUSED:
        value = getattr(config, name, None)
        if value not in (None, False, 0):
            raise ConfigError(
                f"the config's {name}={value!r} asks for {meaning}, which numbakv does not "
                "implement; its attention would be computed without it"
            )
    for name in ("v_head_dim", "global_head_dim"):
        value = _read(config, name)
        if value is not None and value != head_dim(config):
            raise ConfigError(
                f"{name}={value} differs from head_dim={head_dim(config)}; numbakv stores K "
                "and V heads of one head_dim in every layer"
            )
    global_kv = _read(config, "num_global_key_value_heads")
    if global_kv is not None and global_kv != _read(config, "num_key_value_heads"):
        raise ConfigError(
            f"num_global_key_value_heads={global_kv} differs from num_key_value_heads="
            f"{_read(config, 'num_key_value_heads')}; numbakv has one KV head count per cache"
        )
    for rope_type in _rope_types(config):
        if rope_type in REFUSED_ROPE:
            raise ConfigError(
                f"rope_type={rope_type!r} scales the rotary frequencies by the longest position "
                "of each forward; numbakv's steps hold several sequences, whose rotations "
                "would then depend on each other"
            )


def _read(config, name: str):
    """config.name, None when absent; ConfigError when transformers cannot say one value (a
    per-layer attribute read globally)."""
    try:
        return getattr(config, name, None)
    except Exception as error:  # transformers' AmbiguousGlobalPerLayerAttributeError, say
        raise ConfigError(
            f"the config's {name} differs between layers ({error}); numbakv needs one value"
        ) from error


def _rope_types(config) -> list[str]:
    """The rotary types `rope_parameters` and `rope_scaling` name (per layer type too)."""
    found = []
    for name in ("rope_parameters", "rope_scaling"):
        value = _read(config, name)
        for params in (value, *(value.values() if isinstance(value, dict) else ())):
            if isinstance(params, dict):
                found += [
                    params[k] for k in ("rope_type", "type") if isinstance(params.get(k), str)
                ]
    return found


def head_dim(config) -> int:
    """Elements per attention head: `head_dim`, else hidden_size / num_attention_heads."""
    value = _read(config, "head_dim")
    return value if value is not None else config.hidden_size // config.num_attention_heads


def windows(config) -> tuple[int, ...]:
    """Per layer, 0 (global) or the sliding window W (module docstring)."""
    n_layers = config.num_hidden_layers
    sliding = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is None:
        every = sliding and getattr(config, "model_type", None) in SLIDING_EVERY_LAYER
        return (int(sliding) if every else 0,) * n_layers
    if len(types) != n_layers:
        raise ConfigError(f"layer_types has {len(types)} entries for {n_layers} layers")
    result = []
    for layer, kind in enumerate(types):
        if kind not in LAYER_WINDOWS:
            raise ConfigError(
                f"layer {layer} is {kind!r}; numbakv serves {sorted(LAYER_WINDOWS)} layers"
            )
        if LAYER_WINDOWS[kind] and not (isinstance(sliding, int) and sliding >= 1):
            raise ConfigError(f"layer {layer} is sliding but sliding_window={sliding!r}")
        result.append(sliding if LAYER_WINDOWS[kind] else 0)
    return tuple(result)


def geometry(hf_config) -> ModelShape:
    """The model's geometry and vocabulary, after `check_supported`."""
    check_supported(hf_config)
    config = text_config(hf_config)
    n_heads = config.num_attention_heads
    n_kv_heads = getattr(config, "num_key_value_heads", None) or n_heads
    return ModelShape(
        n_layers=config.num_hidden_layers, n_kv_heads=n_kv_heads, head_dim=head_dim(config),
        windows=windows(config), vocab_size=config.vocab_size,
    )  # fmt: skip


def cache_config(hf_config, **fields) -> CacheConfig:
    """The `CacheConfig` of a model of `hf_config`: its layers, KV heads, head_dim and
    per-layer windows, with `fields` for the rest (capacity, max_width, max_seqs, dtype,
    ...); `max_seq_len` defaults to the least of the capacity and the model's
    `max_position_embeddings`. ConfigError for what numbakv does not implement
    (`check_supported`)."""
    shape = geometry(hf_config)
    limit = getattr(text_config(hf_config), "max_position_embeddings", None)
    capacity = fields.get("capacity")
    if "max_seq_len" not in fields and isinstance(limit, int) and isinstance(capacity, int):
        fields["max_seq_len"] = max(1, min(capacity, limit))
    return shape.cache_config(**fields)
