"""What does the prefix cache reuse, and what does it cost on the host? Prints figures;
asserts nothing about timing.

    python -m benchmarks.prefix_cache           # four traces x three pool sizes, minutes
    python -m benchmarks.prefix_cache --quick   # short traces, seconds

Four deterministic traces, all requests submitted at once to an `Engine` over the
reference cache (a tiny model with a global and a window-8 layer, greedy, 4 new tokens):
a shared system prompt (three system prompts of 517, 1203 and 1999 tokens in the full run),
multi-turn chat (each turn repeats the conversation), few-shot (each prompt picks three of
a pool of examples) and tree-of-thought (branching continuations of one stem). Shared
prefixes do not end on 16-token boundaries. Per trace and pool size (1x, 2x and 8x the
working set: the distinct tokens of every prompt and completion, which an unbounded cache
keeps), it prints:

- hit: cached tokens / prompt tokens, as the engine counted them (`n_cached_tokens`);
- trie: what an unbounded cache would hit — per prompt, the tokens it shares with any
  earlier prompt or completion, capped at len - 1 (a trie, computed apart from numbakv);
- vllm: vLLM's rule on the same trace — only whole 16-token blocks of a hash chain hit;
- computed: prefill tokens computed with and without the prefix cache;
- preempt, recomputed: preemptions and tokens computed again after them.

Then host µs per lookup (`match`) and per insert at 1 000 cached prefixes of 2 000 tokens,
over a target that only counts lengths (the µs exclude the cache's own verbs).
"""

import argparse
import time

import numpy as np

from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.model import Model, ModelConfig
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.scheduler import DecodeFirstScheduler

MODEL = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, windows=(0, 8))
FULL = {"requests": 120, "system": (517, 1203, 1999), "scale": 1}
QUICK = {"requests": 24, "system": (37, 83, 141), "scale": 0}
NEW = 4


def tokens(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, 256, n)]


def traces(size: dict) -> dict[str, list[list[int]]]:
    """Each trace's prompts (multi-turn's later turns are built as the run goes: None)."""
    rng = np.random.default_rng(7)
    n, scale = size["requests"], size["scale"]
    systems = [tokens(rng, k) for k in size["system"]]
    examples = [tokens(rng, 37 + 60 * scale) for _ in range(8)]
    stem = tokens(rng, 101 + 400 * scale)
    branches = [tokens(rng, 23 + 40 * scale) for _ in range(4)]
    return {
        "system prompt": [systems[i % 3] + tokens(rng, 9 + i % 7) for i in range(n)],
        "few-shot": [
            [t for j in sorted(rng.choice(8, 3, replace=False)) for t in examples[j]]
            + tokens(rng, 11)
            for _ in range(n)
        ],
        "tree of thought": [stem + branches[i % 4] + tokens(rng, 7 + i % 5) for i in range(n)],
    }


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b) - 1) and a[n] == b[n]:
        n += 1
    return n


def trie_and_vllm(prompts: list[list[int]], kept: list[list[int]]) -> tuple[int, int]:
    """(tokens an unbounded cache hits, tokens vLLM's block rule hits) over the trace."""
    trie = vllm = 0
    blocks: set[tuple[int, ...]] = set()
    for i, (prompt, done) in enumerate(zip(prompts, kept, strict=True)):
        best = 0
        for k in range(16, len(prompt), 16):
            if tuple(prompt[:k]) not in blocks:
                break
            best = k
        vllm += best
        trie += max((shared(other, prompt) for other in kept[:i]), default=0)
        for k in range(16, len(done) + 1, 16):
            blocks.add(tuple(done[:k]))
    return trie, vllm


def serve(prompts, capacity: int, prefix: bool, longest: int):
    """(completions, engine metrics) of the trace on a pool of `capacity` cells."""
    config = MODEL.cache_config(capacity=capacity, max_width=256, max_seqs=32)
    executor = Executor(Model.from_seed(MODEL, 0), CellCache(config), 16, longest,
                        oversubscribe=True)  # fmt: skip
    cache = PrefixCache(executor) if prefix else None
    engine = Engine(executor, DecodeFirstScheduler(256, 16, 240), prefix_cache=cache)
    done = engine.generate(prompts, max_new_tokens=NEW)
    return done, engine.metrics


def chat_prompts(rng: np.random.Generator, n: int) -> list[list[int]]:
    """Multi-turn chat, built ahead: turn k repeats turn k-1 and a stand-in reply."""
    chats = [tokens(rng, 29) for _ in range(max(1, n // 6))]
    prompts = []
    for turn in range(6):
        for c, chat in enumerate(chats):
            prompts.append(list(chat))
            chats[c] = chat + tokens(rng, NEW) + tokens(rng, 13 + turn)
    return prompts


def report(name: str, prompts: list[list[int]]) -> None:
    longest = max(len(p) for p in prompts) + NEW
    base, base_metrics = serve(prompts, 10**7, prefix=False, longest=longest)
    kept = [d.prompt + d.tokens[0][:-1] for d in base]
    working = len({tuple(k[:i]) for k in kept for i in range(1, len(k) + 1)})
    trie, vllm = trie_and_vllm(prompts, kept)
    total = sum(len(p) for p in prompts)
    computed_off = total + base_metrics.n_recomputed_tokens
    for factor in (1, 2, 8):
        capacity = max(working * factor, 2 * longest)
        done, m = serve(prompts, capacity, prefix=True, longest=longest)
        same = [d.tokens for d in done] == [d.tokens for d in base]
        computed = total - m.n_cached_tokens + m.n_recomputed_tokens
        print(
            f"{name:<16} {factor}x {capacity:>8} hit {m.n_cached_tokens / total:6.1%} "
            f"trie {trie / total:6.1%} vllm {vllm / total:6.1%} computed {computed:>7} "
            f"of {computed_off:>7} preempt {m.n_preemptions:>4} recomputed "
            f"{m.n_recomputed_tokens:>6} same tokens {same}"
        )


class Lengths:
    """A target that only counts lengths: the µs of the tree alone."""

    def __init__(self):
        self.length: dict[int, int] = {}

    def seq_clone(self, src, upto=None):
        seq = len(self.length)
        self.length[seq] = upto
        return seq

    def rewind(self, seq, position):
        self.length[seq] = position

    def seq_rm(self, seq):
        del self.length[seq]

    def pos(self, seq):
        return self.length[seq]

    def new(self, n: int) -> int:
        seq = len(self.length)
        self.length[seq] = n
        return seq


def host_costs(n_prefixes: int = 1000, n_tokens: int = 2000) -> None:
    """Each prompt a lookup (`acquire`: the hit's clone) and an insert of its whole length,
    as a request goes; then a lookup of each again among every cached prefix."""
    rng = np.random.default_rng(3)
    target, stem = Lengths(), tokens(rng, n_tokens // 2)
    prefix = PrefixCache(target)
    prompts = [stem + tokens(rng, n_tokens // 2) for _ in range(n_prefixes)]
    inserting = 0.0
    for p in prompts:
        seq, _ = prefix.acquire(p)
        seq = target.new(len(p)) if seq is None else seq
        target.length[seq] = len(p)  # the rest computed
        start = time.perf_counter()
        prefix.insert(seq, p)
        inserting += time.perf_counter() - start
    start = time.perf_counter()
    for p in prompts:
        prefix.match(p)
    match_us = (time.perf_counter() - start) / n_prefixes * 1e6
    insert_us = inserting / n_prefixes * 1e6
    print(
        f"host: {n_prefixes} cached prefixes of {n_tokens} tokens: lookup {match_us:.0f} µs, "
        f"insert {insert_us:.0f} µs, together {match_us + insert_us:.0f} µs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short traces, seconds")
    size = QUICK if parser.parse_args().quick else FULL
    for name, prompts in traces(size).items():
        report(name, prompts)
    report("multi-turn chat", chat_prompts(np.random.default_rng(11), size["requests"]))
    host_costs(100 if size is QUICK else 1000)


if __name__ == "__main__":
    main()
