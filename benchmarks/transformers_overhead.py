"""What does serving a transformers model through numbakv add to a step? Prints figures;
asserts nothing about timing. Needs the transformers extra.

    python -m benchmarks.transformers_overhead            # a 4-layer Llama, a few seconds
    python -m benchmarks.transformers_overhead --quick    # a 2-layer one, about a second

One random Llama (sizes in FULL and QUICK) on the CPU, a decode step of `batch` sequences
that each hold `context` tokens. Medians over `repeat` steps, in microseconds:

1. adapter overhead: `TransformersModel.forward` over a cache that does nothing (write
   discards, attend returns zeros) against the HF model's own forward of the same [1, batch]
   row with an attention function that returns zeros (`use_cache=False`, one row of
   logits per sequence): what the adapter itself costs a step — tensors of tokens,
   positions and rows, the attention views, the logits back as NumPy;
2. in context: the executor's whole decode step over the reference cache (model, cache,
   sampling) against transformers' own decode step (its `cache`, SDPA) of the same
   batch, with the time inside the cache's write and attend.
"""

import argparse
import statistics
import time

import numpy as np
import torch
import transformers
from transformers import AttentionInterface

from benchmarks.common import gc_off, print_machine, print_table, timed
from numbakv.integrations.transformers import TransformersModel, cache_config
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.executor import Executor

FULL = dict(hidden=256, layers=4, heads=8, kv_heads=2, vocab=2048, batch=8, context=64, repeat=50)
QUICK = dict(hidden=64, layers=2, heads=4, kv_heads=2, vocab=256, batch=4, context=16, repeat=10)


def zeros_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' attention call answered with zeros: the model's forward without it."""
    return torch.zeros_like(query).transpose(1, 2), None


AttentionInterface.register("zeros", zeros_attention)


class NullCache:
    """A cache that does nothing: `write` discards, `attend` gives zeros in q's kind."""

    def write(self, layer, k, v) -> None:
        pass

    def attend(self, layer, q, scale=None):
        return torch.zeros_like(q)


class NullStep:
    def __init__(self, width: int, context: int):
        self.width, self.positions = width, np.full(width, context, np.int32)


def llama(sizes: dict):
    config = transformers.LlamaConfig(
        vocab_size=sizes["vocab"], hidden_size=sizes["hidden"],
        intermediate_size=4 * sizes["hidden"], num_hidden_layers=sizes["layers"],
        num_attention_heads=sizes["heads"], num_key_value_heads=sizes["kv_heads"],
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def median_us(first, second, repeat: int) -> tuple[float, float]:
    """Median µs of each of two calls, run in turns (the machine's noise falls on both)."""
    first(), second()  # warm
    times = ([], [])
    with gc_off():
        for _ in range(repeat):
            for run, kept in zip((first, second), times, strict=True):
                kept += timed(run, 1)
    return tuple(1e6 * statistics.median(t) for t in times)


def adapter_overhead(sizes: dict) -> list[list[str]]:
    """Row 1 of the module docstring."""
    b, ctx, repeat = sizes["batch"], sizes["context"], sizes["repeat"]
    twin = llama(sizes)
    twin.set_attn_implementation("zeros")
    model = TransformersModel(llama(sizes))
    tokens, rows = np.arange(b) % sizes["vocab"], np.arange(b)
    ids, pos = torch.as_tensor(tokens)[None], torch.full((1, b), ctx)
    keep = torch.as_tensor(rows)

    def own():
        with torch.inference_mode():
            twin(input_ids=ids, position_ids=pos, use_cache=False, logits_to_keep=keep)

    cache, step = NullCache(), NullStep(b, ctx)
    hf_us, ours_us = median_us(own, lambda: model.forward(cache, step, tokens, rows), repeat)
    return [
        ["HF forward, zero attention", f"{hf_us:.0f}", ""],
        ["TransformersModel.forward, null cache", f"{ours_us:.0f}", ""],
        ["adapter overhead", f"{ours_us - hf_us:.0f}", f"{(ours_us - hf_us) / hf_us:+.1%}"],
    ]


def in_context(sizes: dict) -> list[list[str]]:
    """Row 2 of the module docstring."""
    b, ctx, repeat = sizes["batch"], sizes["context"], sizes["repeat"]
    hf = llama(sizes)
    model = TransformersModel(hf)
    config = cache_config(hf.config, capacity=b * (ctx + 1), max_width=64, max_seqs=b)
    cache = CellCache(config)
    executor = Executor(model, cache, b, ctx + 1)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, sizes["vocab"], (b, ctx))
    sessions = [executor.open_session() for _ in range(b)]
    last = [o.token for o in executor.execute(
        [Input(s, 0, p.tolist()) for s, p in zip(sessions, prompts, strict=True)]
    )]  # fmt: skip
    inside = [0.0]
    for name in ("write", "attend"):
        call = getattr(cache, name)

        def counted(*args, _call=call, **kwargs):
            start = time.perf_counter()
            try:
                return _call(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - start

        setattr(cache, name, counted)

    def ours():
        outs = executor.execute(  # at position ctx: each step rewinds the one before
            [Input(s, ctx, [t]) for s, t in zip(sessions, last, strict=True)]
        )
        last[:] = [o.token for o in outs]

    twin = llama(sizes)
    with torch.inference_mode():
        out = twin(torch.as_tensor(prompts), use_cache=True)
    past, next_ids = out.past_key_values, out.logits[:, -1:].argmax(-1)

    def own():
        with torch.inference_mode():
            twin(next_ids, cache=past, use_cache=True)
            past.crop(-1)  # the same context length every step

    hf_us, ours_us = median_us(own, ours, repeat)
    cache_us = 1e6 * inside[0] / (repeat + 1)
    return [
        ["transformers' own decode step (its cache, SDPA)", f"{hf_us:.0f}", ""],
        ["numbakv executor step, reference cache", f"{ours_us:.0f}", f"{ours_us / hf_us:.2f}x"],
        ["  of which the cache's write + attend", f"{cache_us:.0f}", ""],
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model, fewer steps")
    sizes = QUICK if parser.parse_args(argv).quick else FULL
    print("transformers overhead: one decode step, microseconds (median)")
    print_machine("torch", "transformers")
    print(f"  sizes    {sizes}")
    torch.set_num_threads(1)  # one core: the figures do not depend on the machine's count
    print_table(["", "µs", ""], adapter_overhead(sizes) + in_context(sizes))


if __name__ == "__main__":
    main()
