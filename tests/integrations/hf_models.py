"""Tiny transformers causal LMs of each family numbakv serves, with random weights from a
seed (no download): 2-3 layers, 4 query heads over 2 KV heads of 8, a 256-token vocabulary
(the byte tokenizer's). initializer_range 0.25 (not transformers' 0.02) keeps greedy
choices far from ties, so a float32 summation order cannot flip a token."""

import torch
import transformers

SHAPE = dict(
    vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=512, initializer_range=0.25,
)  # fmt: skip

# family -> (config class, model class, its own options)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_hidden_layers=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2, sliding_window=5)),
    "ministral": (
        "MinistralConfig",
        "MinistralForCausalLM",
        dict(
            num_hidden_layers=3,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_hidden_layers=2)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_hidden_layers=2)),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(num_hidden_layers=2, sliding_window=5, pad_token_id=0, eos_token_id=None),
    ),  # every layer slides, with no layer_types
    "exaone4": (
        "Exaone4Config",
        "Exaone4ForCausalLM",
        dict(
            num_hidden_layers=4,
            sliding_window=4,
            sliding_window_pattern=4,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=None,
        ),
    ),  # every module keeps sliding_window; the sliding ones pass it
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            num_hidden_layers=3,
            sliding_window=4,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        ),
    ),
}


def hf_config(family: str, **options):
    config_class, _, own = FAMILIES[family]
    return getattr(transformers, config_class)(**SHAPE | own | options)


def hf_model(family: str, seed: int = 0, dtype=torch.float32, **options):
    """A tiny model of `family` in eval mode, its weights drawn from `seed`."""
    _, model_class, _ = FAMILIES[family]
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(hf_config(family, **options))
    return model.to(dtype).eval()


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own `generate` of `prompt` alone: greedy, its own cache and SDPA."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
        do_sample=False, min_new_tokens=max_new_tokens,
    )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def hf_greedy_uncached(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens from transformers' forward of the whole sequence each step (no cache)."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        tokens.append(int(hf_logits(model, tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """[len(tokens), vocab] float32: transformers' logits after each token, one forward."""
    with torch.no_grad():
        return model(torch.tensor([tokens]), use_cache=False).logits[0].float()
