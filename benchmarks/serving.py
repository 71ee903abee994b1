"""What does continuous batching buy, and what does the serving loop cost? Prints figures;
asserts nothing about timing.

    python -m benchmarks.serving                  # reference cache, a few seconds
    python -m benchmarks.serving --quick          # under a second
    python -m benchmarks.serving --cache device   # the device cache (a GPU, else the simulator:
                                                  # use --quick there)

One workload (sizes in FULL and QUICK): `requests` greedy requests with prompts of
`prompt` tokens (random tokens of the model's vocabulary) and `new` tokens each, through
the `Engine` with a `DecodeFirstScheduler(max_width, max_width // 2, max_width // 2)`. It
runs twice with the same model and cache shape:

1. batched: every request submitted at once, continuous batching;
2. one at a time: each request submitted after the one before finished.

Each prints generated tokens/s, steps, the mean time to first token, and where the time
went: the executor's `execute` (model + cache + sampling), the scheduler's `next_batch`,
and the rest of the engine (admission, bookkeeping). The ratio batched / one-at-a-time is
from one run on one machine.
"""

import argparse
import time

import numpy as np

from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.model import Model, ModelConfig
from numbakv.serve.scheduler import DecodeFirstScheduler

MODEL = ModelConfig(
    d_model=256, n_heads=8, n_kv_heads=2, head_dim=32, d_ff=768, windows=(0, 64) * 2
)
TINY = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, windows=(0, 8))
FULL = {"requests": 32, "prompt": 48, "new": 32, "max_width": 64}
QUICK = {"requests": 8, "prompt": 16, "new": 8, "max_width": 16}


class Timed:
    """Wraps a callable and adds up the seconds spent in it."""

    def __init__(self, call):
        self.call, self.seconds = call, 0.0

    def __call__(self, *args):
        start = time.perf_counter()
        try:
            return self.call(*args)
        finally:
            self.seconds += time.perf_counter() - start


def serve(model: Model, cache_class: type, sizes: dict, batched: bool, seed: int = 0) -> dict:
    """Runs the workload; returns its figures."""
    n, prompt, new, width = sizes["requests"], sizes["prompt"], sizes["new"], sizes["max_width"]
    cache = cache_class(
        model.config.cache_config(capacity=n * (prompt + new), max_width=width, max_seqs=n)
    )
    executor = Executor(model, cache, max_sessions=n, max_session_tokens=prompt + new)
    engine = Engine(executor, DecodeFirstScheduler(width, max(1, width // 2), max(1, width // 2)))
    executor.execute = forward = Timed(executor.execute)
    engine.scheduler.next_batch = schedule = Timed(engine.scheduler.next_batch)
    vocab = model.config.vocab_size
    prompts = np.random.default_rng(seed).integers(0, vocab, (n, prompt)).tolist()
    start = time.perf_counter()
    if batched:
        ids = [engine.submit(p, new) for p in prompts]
        while engine.is_busy:
            engine.step()
    else:
        ids = []
        for p in prompts:
            ids.append(engine.submit(p, new))
            while engine.is_busy:
                engine.step()
    seconds = time.perf_counter() - start
    results = [engine.result(i) for i in ids]
    return {
        "tokens/s": sum(r.metrics.n_tokens for r in results) / seconds,
        "steps": engine.n_steps,
        "mean ttft ms": 1e3 * np.mean([r.metrics.time_to_first_token for r in results]),
        "forward %": 100 * forward.seconds / seconds,
        "schedule %": 100 * schedule.seconds / seconds,
        "engine %": 100 * (seconds - forward.seconds - schedule.seconds) / seconds,
        "seconds": seconds,
        "tokens": [r.tokens for r in results],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller workload")
    parser.add_argument("--cache", choices=("reference", "device"), default="reference")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.cache == "device":
        from numbakv import CellCache, device_info

        where = device_info()["name"]
    else:
        from numbakv.reference import CellCache

        where = "NumPy reference"
    config = TINY if args.quick else MODEL
    model = Model.from_seed(config, 0)
    print(
        f"cache: {where}; model: {config.n_layers} layers, d_model {config.d_model}, "
        f"{config.n_heads} heads / {config.n_kv_heads} KV heads, windows {config.windows}\n"
        f"workload: {sizes['requests']} requests x ({sizes['prompt']} prompt + {sizes['new']} "
        f"new) tokens, max_width {sizes['max_width']}\n"
    )
    runs = {name: serve(model, CellCache, sizes, batched) for name, batched in
            (("batched", True), ("one at a time", False))}  # fmt: skip
    columns = ("tokens/s", "steps", "mean ttft ms", "forward %", "schedule %", "engine %")
    print(f"{'':<14}" + "".join(f"{c:>14}" for c in columns))
    for name, run in runs.items():
        print(f"{name:<14}" + "".join(f"{run[c]:>14.1f}" for c in columns))
    same = runs["batched"]["tokens"] == runs["one at a time"]["tokens"]
    ratio = runs["batched"]["tokens/s"] / runs["one at a time"]["tokens/s"]
    print(f"\nbatched / one at a time: {ratio:.2f}x tokens/s; identical tokens: {same}")


if __name__ == "__main__":
    main()
