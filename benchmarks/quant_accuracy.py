"""How far do quantized K/V (docs/contract.md §4.1) move attention and the serving model from
float32 storage? Prints figures; asserts nothing. NumPy only (the reference cache): the
device stores the same bytes (tests/cache/test_quant_storage.py), so it reads the same.

    python -m benchmarks.quant_accuracy           # attention, then the model's KL
    python -m benchmarks.quant_accuracy --quick   # fewer seeds and prompts

attention : one sequence of `length` random tokens (K, V, q standard normal, GQA 2), its
            last 8 tokens' attention over every earlier one; per format the largest
            |out - out_float32| and the RMS error relative to out_float32's RMS
model     : `Model.from_seed` decoders of two geometries under several seeds; a prompt of
            random bytes, then 24 greedy tokens with float32 storage. Teacher-forced along
            that text, the KL divergence KL(p_float32 || p_format) of every next-token
            distribution (mean and max), and whether the format's own greedy generation
            equals float32's, token for token
"""

import argparse

import numpy as np

from benchmarks.common import print_machine, print_table
from numbakv.core.config import CacheConfig
from numbakv.core.formats import bits_per_value
from numbakv.reference import CellCache
from numbakv.serve.model import Model, ModelConfig

FORMATS = ("float16", "bfloat16", "q8_0", "q4_0", "fp8_e4m3")
GEOMETRIES = (  # (name, ModelConfig)
    ("d64 h4/2 hd32", ModelConfig(d_model=64, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=128,
                                  windows=(0, 16))),
    ("d128 h8/2 hd64", ModelConfig(d_model=128, n_heads=8, n_kv_heads=2, head_dim=64,
                                   d_ff=256, windows=(0, 0, 32))),
)  # fmt: skip


def attention_errors(dtype: str, length: int, head_dim: int, seed: int) -> tuple[float, float]:
    """(max abs error, relative RMS error) of `dtype` storage against float32's."""
    rng = np.random.default_rng(seed)
    k, v = rng.standard_normal((2, length, 2, head_dim), dtype=np.float32)
    q = rng.standard_normal((8, 4, head_dim), dtype=np.float32)
    outs = []
    for fmt in ("float32", dtype):
        config = CacheConfig(n_layers=1, n_kv_heads=2, head_dim=head_dim, capacity=length,
                             max_width=length, max_seqs=1, dtype=fmt)  # fmt: skip
        cache = CellCache(config)
        seq = cache.seq_new()
        cache.declare_step([seq] * length)
        cache.prepare_step()
        cache.write(0, k, v)
        full_q = np.zeros((length, 4, head_dim), np.float32)
        full_q[-8:] = q
        outs.append(cache.attend(0, full_q)[-8:])
    error = outs[1] - outs[0]
    return float(np.abs(error).max()), float(np.sqrt((error**2).mean() / (outs[0] ** 2).mean()))


def run_text(model: Model, dtype: str, tokens: list[int], n_prompt: int, greedy: bool):
    """(per position after the prompt the next-token log-probabilities, the tokens): decoded
    one token a step from a cache of `dtype`; greedy: the model's own argmax continues the
    text past the prompt, else `tokens` is fed as given (teacher forcing)."""
    config = model.config.cache_config(capacity=len(tokens) + 1, max_width=1, max_seqs=1,
                                       dtype=dtype)  # fmt: skip
    cache = CellCache(config)
    seq, text, logps = cache.seq_new(), list(tokens[:n_prompt]), []
    for i in range(len(tokens)):
        cache.declare_step([seq])
        step = cache.prepare_step()
        logits = model.forward(cache, step, [text[i]], [0])[0].astype(np.float64)
        if i + 1 >= n_prompt:
            logps.append(logits - np.logaddexp.reduce(logits))
        if i + 1 == len(text) and i + 1 < len(tokens):
            text.append(int(np.argmax(logits)) if greedy else tokens[i + 1])
    return np.array(logps), text


def model_figures(seeds: range, n_prompt: int, n_new: int) -> list[list[str]]:
    rows = []
    for name, geometry in GEOMETRIES:
        per_format = {fmt: ([], 0) for fmt in FORMATS}
        for seed in seeds:
            model = Model.from_seed(geometry, seed)
            prompt = np.random.default_rng(seed).integers(0, 256, n_prompt).tolist()
            base, text = run_text(model, "float32", prompt + [0] * n_new, n_prompt, greedy=True)
            for fmt in FORMATS:
                logps, _ = run_text(model, fmt, text, n_prompt, greedy=False)
                kl = (np.exp(base) * (base - logps)).sum(axis=1)
                _, own = run_text(model, fmt, prompt + [0] * n_new, n_prompt, greedy=True)
                kls, same = per_format[fmt]
                per_format[fmt] = (kls + kl.tolist(), same + (own == text))
        for fmt, (kls, same) in per_format.items():
            rows.append([name, fmt, f"{np.mean(kls):.2e}", f"{np.max(kls):.2e}",
                         f"{same}/{len(seeds)}"])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer seeds and prompts")
    args = parser.parse_args()
    print_machine()
    print("\nattention over a sequence, against float32 storage (5 seeds, worst):")
    rows = []
    for head_dim, length in ((64, 256), (128, 1024)):
        for fmt in FORMATS:
            errors = [attention_errors(fmt, length, head_dim, seed) for seed in range(5)]
            worst = np.max(errors, axis=0)
            rows.append([f"hd{head_dim} n{length}", fmt, f"{bits_per_value(fmt):g}",
                         f"{worst[0]:.2e}", f"{worst[1]:.2e}"])  # fmt: skip
    print_table(["shape", "format", "bits", "max |err|", "rel rms"], rows)
    seeds = range(3) if args.quick else range(8)
    print(f"\nthe serving model, {len(seeds)} seeds a geometry, 16-byte prompts + 24 greedy"
          " tokens:")  # fmt: skip
    rows = model_figures(seeds, 16, 24)
    print_table(["model", "format", "mean KL", "max KL", "greedy equal"], rows)


if __name__ == "__main__":
    main()
