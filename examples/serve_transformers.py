"""The README's "Serving a transformers model": a transformers causal LM served by numbakv's
Engine in five lines, here a small Qwen3 of random weights built from a config (no
download; `from_pretrained(name)` loads real ones the same way), over the device cache (the
CUDA simulator without a GPU). Run it with
`python -m examples.serve_transformers` from a checkout, the transformers extra installed."""

import transformers

from numbakv import ByteTokenizer, CellCache, Engine, Executor
from numbakv.integrations.transformers import TransformersModel, cache_config

CONFIG = transformers.Qwen3Config(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.25,
)  # fmt: skip


def main() -> list[list[int]]:
    """Serves two prompts; returns each one's generated tokens."""
    hf, tokenizer = transformers.AutoModelForCausalLM.from_config(CONFIG), ByteTokenizer()
    model = TransformersModel(hf)
    cache = CellCache(cache_config(hf.config, capacity=512, max_width=32, max_seqs=4))
    engine = Engine(Executor(model, cache, 4, 128), tokenizer=tokenizer)
    done = engine.generate(["Hello", "A cell cache"], max_new_tokens=12)
    return [d.tokens[0] for d in done]


if __name__ == "__main__":
    for tokens in main():
        print(tokens)
