"""What numbakv does not implement is refused, never served as something else: HF configs
(`cache_config`, `TransformersModel`), models that are no causal LM or whose layers disagree
with their config, caches whose geometry disagrees with the model, and tensors the caches
cannot read. Each refusal names the option or value and changes nothing."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numbakv.core.errors import ConfigError, StepError
from numbakv.integrations import hf_config as hf_config_module
from numbakv.integrations.transformers import TransformersModel, cache_config
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor

from helpers import full_state
from hf_models import SHAPE, hf_config, hf_greedy, hf_greedy_uncached, hf_model

FIELDS = dict(capacity=16, max_width=4, max_seqs=2)
TYPES = ["full_attention", "sliding_attention"]


@pytest.mark.parametrize(
    "config, match",
    [
        (lambda: transformers.Gemma2Config(**SHAPE), "attn_logit_softcapping=50.0"),
        (lambda: transformers.FalconConfig(alibi=True), "alibi=True"),
        (lambda: transformers.GptOssConfig(**SHAPE), "attention sinks"),
        (lambda: hf_config("gemma3", use_bidirectional_attention=True), "bidirectional"),
        (lambda: transformers.Llama4TextConfig(), "attention_chunk_size=8192"),
        (lambda: transformers.DeepseekV3Config(), "kv_lora_rank=512"),
        (
            lambda: hf_config("ministral", layer_types=[TYPES[0], "chunked_attention", TYPES[0]]),
            "layer 1 is 'chunked_attention'",
        ),
        (
            lambda: hf_config("ministral", layer_types=[*TYPES[:2], "linear_attention"]),
            "layer 2 is 'linear_attention'",
        ),
    ],
)
def test_configs_asking_for_what_numbakv_lacks_are_refused(config, match):
    with pytest.raises(ConfigError, match=match):
        cache_config(config(), **FIELDS)


def test_gemma2_model_is_refused_before_anything_changes():
    torch.manual_seed(0)
    hf = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**SHAPE, num_hidden_layers=2))
    before = hf.config._attn_implementation
    with pytest.raises(ConfigError, match="soft-capping"):
        TransformersModel(hf)
    assert hf.config._attn_implementation == before


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: "a model", "expected a transformers model"),
        (lambda: transformers.LlamaModel(hf_config("llama")), "has no LM head"),
    ],
)
def test_what_is_no_causal_lm_is_refused(make, match):
    with pytest.raises(ConfigError, match=match):
        TransformersModel(make())


def test_windows_are_what_each_layer_tells_its_attention():
    """A sliding_window a family ignores (left in a Llama's config.json) is no window, as in
    transformers' forward (its `generate` differs: its cache keeps only the last W - 1 keys
    of every layer of such a config); a layer changed after the config was made is seen,
    and a cache of the config's windows is then refused."""
    hf = hf_model("llama", sliding_window=4)
    assert TransformersModel(hf).config.windows == (0, 0)
    assert cache_config(hf.config, **FIELDS).windows == (0, 0)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    expected = hf_greedy_uncached(hf_model("llama", sliding_window=4), prompt, 6)
    assert expected != hf_greedy(hf_model("llama", sliding_window=4), prompt, 6)
    executor = Executor(TransformersModel(hf), CellCache(cache_config(hf.config, **FIELDS)), 1, 16)
    assert Engine(executor).generate([prompt], max_new_tokens=6)[0].tokens[0] == expected
    hf = hf_model("ministral")
    hf.model.layers[1].self_attn.sliding_window = 7
    model = TransformersModel(hf)
    assert model.config.windows == (4, 7, 4)
    with pytest.raises(ConfigError, match=r"windows=\(4, 7, 4\) differs"):
        Executor(model, CellCache(cache_config(hf.config, **FIELDS)), 2, 8)


def test_a_layer_that_is_not_causal_is_refused():
    hf = hf_model("llama")
    hf.model.layers[0].self_attn.is_causal = False
    with pytest.raises(ConfigError, match="layer 0 is not causal"):
        TransformersModel(hf)


def test_two_attentions_in_one_layer_are_refused(monkeypatch):
    """DiffLlama calls the attention twice per layer (one K, two Vs): refused by its type,
    and, were it not, by the probe forward."""
    torch.manual_seed(0)
    hf = transformers.DiffLlamaForCausalLM(
        transformers.DiffLlamaConfig(**SHAPE, num_hidden_layers=2)
    )
    with pytest.raises(ConfigError, match="differential attention"):
        TransformersModel(hf)
    monkeypatch.delitem(hf_config_module.REFUSED_TYPES, "diffllama")
    hf.train()
    with pytest.raises(ConfigError, match=r"layer 0's attention .* ran twice in one forward"):
        TransformersModel(hf)
    assert hf.config._attn_implementation == "sdpa" and hf.training  # left as it was


def test_a_model_that_mixes_tokens_outside_attention_is_refused():
    """Sequences packed in one row must not see each other but through the cells: a model
    whose final norm mixes the row's tokens is refused by the probe."""
    hf = hf_model("llama")
    hf.model.norm.register_forward_hook(lambda module, args, out: out + out.mean(1, keepdim=True))
    with pytest.raises(ConfigError, match="mixes tokens outside attention"):
        TransformersModel(hf)


def test_a_config_whose_kv_heads_the_model_ignores_is_refused():
    """CodeGen has no grouped-query attention: a num_key_value_heads in its config (a
    leftover, or a wrong guess) is not what its layers compute."""
    torch.manual_seed(0)
    config = transformers.CodeGenConfig(
        vocab_size=256, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, num_key_value_heads=2
    )
    with pytest.raises(
        ConfigError, match="layer 0's attention gets K of 4 heads of 8; the config says 2 of 8"
    ):
        TransformersModel(transformers.CodeGenForCausalLM(config))


def test_a_model_on_two_devices_or_in_training_mode_is_refused():
    hf = hf_model("llama")
    hf.lm_head.to("meta")
    with pytest.raises(ConfigError, match=r"parameters lie on \['cpu', 'meta'\]"):
        TransformersModel(hf)
    hf = hf_model("llama")
    model = TransformersModel(hf)
    cache = CellCache(cache_config(hf.config, **FIELDS))
    cache.declare_step([cache.seq_new()])
    step = cache.prepare_step()
    hf.train()
    with pytest.raises(StepError, match="training mode"):
        model.forward(cache, step, [1], [0])


def test_a_window_changed_after_wrapping_is_refused_at_the_next_forward():
    hf = hf_model("ministral")
    executor = Executor(TransformersModel(hf), CellCache(cache_config(hf.config, **FIELDS)), 1, 8)
    hf.model.layers[0].self_attn.sliding_window = 2
    session = executor.open_session()
    with pytest.raises(ConfigError, match=r"called with windows \(2, 0, 4\), not the \(4, 0, 4\)"):
        executor.execute([Input(session, 0, [1, 2, 3])])
    assert executor.length(session) == 0 and executor.cache.used_cells == 0


def test_a_model_whose_attention_bypasses_numbakv_is_refused():
    """transformers keeps SDPA (with a warning) for a model it judges cannot switch; the
    probe forward sees no layer go through numbakv."""

    class Remote(transformers.LlamaForCausalLM):
        _can_set_attn_implementation_cached_value = False  # what remote code gets

    torch.manual_seed(0)
    hf = Remote(hf_config("llama")).eval()
    with pytest.raises(ConfigError, match=r"layers \[0, 1\] did not go through numbakv"):
        TransformersModel(hf)


def test_switching_the_attention_back_after_wrapping_is_refused_at_the_next_forward():
    hf = hf_model("llama")
    executor = Executor(TransformersModel(hf), CellCache(cache_config(hf.config, **FIELDS)), 2, 8)
    session = executor.open_session()
    executor.execute([Input(session, 0, [1, 2, 3])])
    before = full_state(executor.cache)
    hf.set_attn_implementation("sdpa")
    with pytest.raises(ConfigError, match="attention implementation is 'sdpa'"):
        executor.execute([Input(session, 3, [4])])
    assert full_state(executor.cache) == before and executor.length(session) == 3


def test_rotary_scaling_by_the_forward_length_is_refused():
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(ConfigError, match="rope_type='dynamic'"):
        cache_config(hf_config("llama", rope_parameters=dynamic), **FIELDS)
    longrope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 4,
                    long_factor=[4.0] * 4, original_max_position_embeddings=8)  # fmt: skip
    phi3 = hf_config("phi3", rope_parameters=longrope, original_max_position_embeddings=8)
    with pytest.raises(ConfigError, match="rope_type='longrope'"):
        cache_config(phi3, **FIELDS)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: transformers.BloomConfig(), "model_type='bloom' uses ALiBi"),
        (lambda: transformers.Gemma4TextConfig(**SHAPE, global_head_dim=16),
         "the config's head_dim differs between layers"),
    ],
)  # fmt: skip
def test_other_attention_shapes_are_refused(make, match):
    with pytest.raises(ConfigError, match=match):
        cache_config(make(), **FIELDS)


@pytest.mark.parametrize(
    "field, value",
    [("n_layers", 3), ("n_kv_heads", 4), ("head_dim", 16), ("windows", (0, 3))],
)
def test_a_cache_whose_geometry_differs_is_refused_naming_the_field(field, value):
    model = TransformersModel(hf_model("mistral"))
    fields = model.config.cache_config(**FIELDS).__dict__ | {field: value}
    if field == "n_layers":
        fields["windows"] = (5,) * value
    cache = CellCache(type(model.config.cache_config(**FIELDS))(**_init_fields(fields)))
    with pytest.raises(ConfigError, match=f"the model's {field}="):
        Executor(model, cache, 2, 8)
    assert cache.live_seqs == []


def _init_fields(fields: dict) -> dict:
    keep = ("n_layers", "n_kv_heads", "head_dim", "capacity", "max_width", "max_seqs", "windows")
    return {k: fields[k] for k in keep}


@pytest.mark.parametrize(
    "k, match",
    [
        (lambda: torch.ones(2, 2, 8, dtype=torch.int32), "tensor of int32"),
        (lambda: torch.ones(2, 2, 8, device="meta"), "Tensor is a foreign device array"),
    ],
)
def test_tensors_the_cache_cannot_read_are_refused_with_nothing_changed(k, match):
    hf = hf_model("llama")
    cache = CellCache(cache_config(hf.config, **FIELDS))
    cache.declare_step([cache.seq_new()] * 2)
    cache.prepare_step()
    cache.write(0, np.ones((2, 2, 8), np.float32), np.ones((2, 2, 8), np.float32))
    before = full_state(cache)
    with pytest.raises(StepError, match=match):
        cache.write(1, k(), torch.ones(2, 2, 8))
    with pytest.raises(StepError, match=match):
        cache.attend(0, k())
    assert full_state(cache) == before
