"""What does the prefix cache hit, against an unbounded cache and vLLM's block rule, and
what does it cost the host? Prints figures; asserts nothing about timing.

    python -m benchmarks.prefix_cache            # about four minutes (NumPy reference cache)
    python -m benchmarks.prefix_cache --quick    # about half a minute
    python -m benchmarks.prefix_cache --host     # the host cost of PrefixCache alone

Four workload shapes (`benchmarks.prefix_workloads`: shared system prompt, multi-turn
chat, few-shot, tree-of-thought), each a deterministic trace of greedy requests of 16 new
tokens, served through the `Engine` over the reference `CellCache` with a tiny model (2
layers, one a sliding window of 8) by `CLIENTS` clients: each submits the trace's next
request when its last one finished, in trace order (a multi-turn prompt is built then,
from the answer the model gave). Per shape, at pool sizes (the cache's capacity) of 1x, 2x
and 8x the working set, once with a `PrefixCache` (no max_cells) and once without
(`prefix_cache=None`):

    hit %       prompt tokens served from the prefix cache (`n_cached_tokens`) / prompt tokens
    trie %      the same for an unbounded cache: each prompt's tokens shared with any
                earlier request's cells (its prompt and all but the last answer token), by
                a trie of the run's trace; it counts requests still in flight, which the
                engine hits only by waiting for their prefill
    vLLM %      vLLM's rule on that trace: only full 16-token blocks of a hash chain hit
    computed    prefill tokens computed with / without the cache: the requests'
                n_prompt_tokens - n_cached_tokens + n_recomputed_tokens
    preempt     preemptions, and the tokens computed again after them, with / without
    same trace  whether both runs had the same prompts and answers

Multi-turn chat is served again with a pool too small for its conversations (1/4 of the
working set: at 1x the pool keeps them all, so eviction never runs), with a host tier
under the prefix cache (`PrefixCache(..., host_bytes=...)`: what eviction gives back is
saved to host memory and reloaded by a later hit) of 1x and 4x the pool's K/V bytes,
against the pool tier alone:

    computed           prefill tokens computed (`n_computed_tokens`: n_prompt_tokens -
                       n_cached_tokens + n_recomputed_tokens)
    recomputed, preempt  of those, computed again after preemptions; the preemptions
    pool / host hits   the cached prompt tokens served from the pool and reloaded from host
                       memory (`n_pool_cached_tokens`, `n_host_cached_tokens`), and the
                       reloads (hits the host tier served)
    offloaded, held    positions the host tier kept, and the kB it holds at the end

The working set is what an unbounded cache needs at once: the distinct cells the trie's
hits read (on the trace with stand-ins for the answers, known before anything runs), plus
CLIENTS x the mean cells a running request holds of its own (its uncached prompt and its
new tokens). The pool is at least the longest request.

Then how far logits move when a prefix is computed in another batch shape (whole, or in
two chunks), and the host cost of `PrefixCache` itself, at 1 000 cached prefixes of 2 000
tokens, in two trees: random branches (each prefix branches off an earlier one at a random position:
about 75 nodes deep) and one system prompt (half of every prefix shared): median µs of
`match`, `acquire`, `insert` (of the acquired sequence, grown to 2 000 positions) and
`evict_holder` (which brings it back to 1 000), over fresh prefixes built alike, given as
int64 arrays as the engine keeps them, and of `acquire + insert` (a request's lookup and
insert: the sum per prefix). Its target is `Lengths`, a stand-in that keeps only each
sequence's length, so the µs exclude the cache's own verbs (`seq_clone`, `rewind`,
`seq_rm`). Then the same over random branches at 250, 1 000 and 4 000 cached prefixes:
`evict_holder` finds the least recently used holder in a heap (O(log n) in the holders);
a lookup walks one branch, whose nodes, not the prefixes, it costs (a holder is about 30,
85 and 170 nodes deep there).
"""

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.common import gc_off, print_machine, print_table
from benchmarks.prefix_workloads import Trace, Workload, trie_hits, vllm_hits, workloads
from numbakv import Engine, Executor, Model, ModelConfig, PrefixCache
from numbakv.core.formats import head_bytes
from numbakv.reference import CellCache
from numbakv.serve.requests import EngineMetrics

TINY = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, windows=(0, 8))
CLIENTS = 8
MAX_SEQS = 256  # sessions: the running requests and the prefix cache's holders
MAX_WIDTH = 256
POOLS = (1, 2, 8)  # x the working set
HOST_POOL = 4  # the host tier's table: a pool of 1 / HOST_POOL x the working set
HOST_TIERS = (1, 4)  # host tiers, x that pool's bytes
N_PREFIXES, PREFIX_LEN = 1000, 2000
SCALING = (250, 1000, 4000)  # cached prefixes


@dataclass(frozen=True)
class Run:
    """One workload served at one pool size: the trace and the engine's metrics."""

    trace: Trace
    metrics: EngineMetrics

    @property
    def n_computed(self) -> int:
        return self.metrics.n_computed_tokens


def serve(
    workload: Workload, model: Model, capacity: int, cached: bool, host_bytes: int | None = None
) -> Run:
    """Serves the workload in trace order, CLIENTS requests at most in flight; with the
    prefix cache when `cached` (and its host tier of `host_bytes`)."""
    config = model.config.cache_config(capacity=capacity, max_width=MAX_WIDTH, max_seqs=MAX_SEQS)
    executor = Executor(model, CellCache(config), MAX_SEQS, workload.longest, oversubscribe=True)
    prefix = PrefixCache(executor, host_bytes=host_bytes) if cached else None
    engine = Engine(executor, prefix_cache=prefix)
    prompts: list[list[int]] = []
    answers: list[list[int] | None] = [None] * len(workload)
    flying: dict[int, int] = {}  # request id -> its entry
    while len(prompts) < len(workload) or flying:
        submit_ready(engine, workload, prompts, answers, flying)
        engine.step()
        for request, i in list(flying.items()):
            done = engine.result(request)
            if done.finish_reasons[0] is not None:
                answers[i] = done.tokens[0]
                del flying[request]
    trace = [(p, p + a[:-1]) for p, a in zip(prompts, answers, strict=True)]
    return Run(trace, engine.metrics)


def submit_ready(
    engine: Engine,
    workload: Workload,
    prompts: list[list[int]],
    answers: list[list[int] | None],
    flying: dict[int, int],
) -> None:
    """Submits the next entries while a client is free and the entry it follows (if any)
    has its answer; their prompts go to `prompts`, their request ids to `flying`."""
    while len(prompts) < len(workload) and len(flying) < CLIENTS:
        after = workload.entries[len(prompts)].after
        if after is not None and answers[after] is None:
            return
        prompts.append(workload.prompt(len(prompts), answers))
        flying[engine.submit(prompts[-1], workload.max_new_tokens)] = len(prompts) - 1


def working_set(workload: Workload) -> int:
    """The cells an unbounded cache holds at once (the module docstring)."""
    trace = workload.placeholder_trace()
    hits, n_read = trie_hits(trace)
    own = [len(p) - h + workload.max_new_tokens for (p, _), h in zip(trace, hits, strict=True)]
    return n_read + round(CLIENTS * np.mean(own))


def percent(hits: list[int] | int, trace: Trace) -> str:
    return f"{100 * np.sum(hits) / sum(len(p) for p, _ in trace):.1f}"


def pool_row(workload: Workload, model: Model, times: int, ws: int) -> list[str]:
    """The table's row of the workload at `times` x the working set `ws`."""
    capacity = max(times * ws, workload.longest)
    cached, uncached = (serve(workload, model, capacity, on) for on in (True, False))
    trace, on, off = cached.trace, cached.metrics, uncached.metrics
    return [
        f"{times}x = {capacity}",
        percent(on.n_cached_tokens, trace),
        percent(trie_hits(trace)[0], trace),
        percent(vllm_hits(trace), trace),
        f"{cached.n_computed} / {uncached.n_computed}",
        f"{on.n_preemptions} / {off.n_preemptions}",
        f"{on.n_recomputed_tokens} / {off.n_recomputed_tokens}",
        "yes" if cached.trace == uncached.trace else "no",
    ]


def print_workload(workload: Workload, model: Model) -> None:
    ws = working_set(workload)
    n_tokens = sum(len(p) for p, _ in workload.placeholder_trace())
    print(
        f"\n{workload.name}: {len(workload)} requests, {n_tokens} prompt tokens, the longest "
        f"request {workload.longest} positions; working set {ws} cells"
    )
    headers = [
        "pool (cells)", "hit %", "trie %", "vLLM %", "computed w/wo", "preempt w/wo",
        "recomputed w/wo", "same trace",
    ]  # fmt: skip
    print_table(headers, [pool_row(workload, model, times, ws) for times in POOLS])


def print_host_tier(workload: Workload, model: Model) -> None:
    """The workload at a pool of 1 / HOST_POOL x its working set, with the pool tier alone
    and with a host tier of HOST_TIERS x the pool's bytes."""
    capacity = max(working_set(workload) // HOST_POOL, workload.longest)
    cell_bytes = sum(
        TINY.n_kv_heads * (head_bytes(k, TINY.head_dim) + head_bytes(v, TINY.head_dim))
        for k, v in model.config.cache_config(capacity=1, max_width=1, max_seqs=1).formats
    )
    print(
        f"\n{workload.name} at a pool of 1/{HOST_POOL} x the working set = {capacity} cells "
        f"({capacity * cell_bytes / 1e3:.0f} kB of K/V), with a host tier"
    )
    runs = {None: serve(workload, model, capacity, True)}
    runs |= {
        t: serve(workload, model, capacity, True, t * capacity * cell_bytes) for t in HOST_TIERS
    }
    rows = []
    for times, run in runs.items():
        m = run.metrics
        rows.append([
            "none" if times is None else f"{times}x = {times * capacity * cell_bytes / 1e3:.0f} kB",
            f"{run.n_computed}", f"{m.n_recomputed_tokens}", f"{m.n_preemptions}",
            f"{m.n_pool_cached_tokens}", f"{m.n_host_cached_tokens}", f"{m.n_reloads}",
            f"{m.n_offloaded_tokens}", f"{m.n_host_bytes / 1e3:.0f}",
            "yes" if run.trace == runs[None].trace else "no",
        ])  # fmt: skip
    headers = [
        "host tier", "computed", "recomputed", "preempt", "pool hits (tok)", "host hits (tok)",
        "reloads",
        "offloaded (tok)", "host kB held", "same trace",
    ]  # fmt: skip
    print_table(headers, rows)


class Lengths:
    """A stand-in cache for the prefix cache's verbs: each sequence's length, no cells."""

    def __init__(self) -> None:
        self.lengths: dict[int, int] = {}
        self._next = 0

    def seq_new(self) -> int:
        self._next += 1
        self.lengths[self._next] = 0
        return self._next

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        seq = self.seq_new()
        self.lengths[seq] = self.lengths[src] if upto is None else upto
        return seq

    def rewind(self, seq: int, position: int) -> None:
        self.lengths[seq] = position

    def seq_rm(self, seq: int) -> None:
        del self.lengths[seq]

    def pos(self, seq: int) -> int:
        return self.lengths[seq]

    def computed(self, seq: int | None, length: int) -> int:
        """`seq` (a new one when None) grown to `length` positions, as a prefill would."""
        seq = self.seq_new() if seq is None else seq
        self.lengths[seq] = length
        return seq


def branch(rng: np.random.Generator, prefixes: list[list[int]]) -> list[int]:
    """A prefix of PREFIX_LEN tokens branching off a random one of `prefixes` at a random
    position (a random one when there are none)."""
    if not prefixes:
        return rng.integers(0, 256, PREFIX_LEN).tolist()
    stem = prefixes[int(rng.integers(len(prefixes)))][: int(rng.integers(PREFIX_LEN))]
    return stem + rng.integers(0, 256, PREFIX_LEN - len(stem)).tolist()


def shared_stem(rng: np.random.Generator, prefixes: list[list[int]]) -> list[int]:
    """A prefix of PREFIX_LEN tokens: a system prompt of half of them, then its own."""
    stem = prefixes[0][: PREFIX_LEN // 2] if prefixes else []
    return stem + rng.integers(0, 256, PREFIX_LEN - len(stem)).tolist()


def host_costs(
    repeat: int, make=branch, seed: int = 0, n_prefixes: int = N_PREFIXES
) -> dict[str, list[float]]:
    """Seconds of each verb per fresh prefix made by `make`, at `n_prefixes` cached ones,
    and of acquire + insert. The tokens go in as an int64 array, as the engine keeps a
    request's (made once)."""
    rng = np.random.default_rng(seed)
    target = Lengths()
    prefix = PrefixCache(target)
    prefixes: list[list[int]] = []
    for _ in range(n_prefixes):
        prefixes.append(make(rng, prefixes))
        seq, _ = prefix.acquire(prefixes[-1])
        prefix.insert(target.computed(seq, PREFIX_LEN), prefixes[-1])
    times: dict[str, list[float]] = {"match": [], "acquire": [], "insert": [], "evict_holder": []}
    with gc_off():
        for _ in range(repeat):
            tokens = np.array(make(rng, prefixes), dtype=np.int64)
            clock(times["match"], prefix.match, tokens)
            seq, _ = clock(times["acquire"], prefix.acquire, tokens)
            clock(times["insert"], prefix.insert, target.computed(seq, PREFIX_LEN), tokens)
            clock(times["evict_holder"], prefix.evict_holder)
    times["acquire + insert"] = list(np.add(times["acquire"], times["insert"]))
    return times


def clock(into: list[float], call: Callable, *args):
    """call(*args), its seconds appended to `into`."""
    start = time.perf_counter()
    result = call(*args)
    into.append(time.perf_counter() - start)
    return result


def print_host_costs(repeat: int) -> None:
    print(
        f"\nhost µs of PrefixCache at {N_PREFIXES} cached prefixes of {PREFIX_LEN} tokens "
        f"(target: lengths only), median of {repeat}"
    )
    shapes = {"random branches": branch, "one system prompt": shared_stem}
    costs = {name: host_costs(repeat, make) for name, make in shapes.items()}
    rows = [
        [verb] + [f"{1e6 * np.median(costs[name][verb]):.1f}" for name in shapes]
        for verb in costs["random branches"]
    ]
    print_table(["verb", *shapes], rows)


def print_host_scaling(repeat: int) -> None:
    """Median µs of evict_holder and acquire + insert over random branches of PREFIX_LEN
    tokens, at SCALING cached prefixes."""
    print(f"\nhost µs of PrefixCache over random branches by cached prefixes, median of {repeat}")
    costs = {n: host_costs(repeat, branch, n_prefixes=n) for n in SCALING}
    rows = [
        [verb] + [f"{1e6 * np.median(costs[n][verb]):.1f}" for n in SCALING]
        for verb in ("evict_holder", "acquire + insert")
    ]
    print_table(["verb", *(f"{n} prefixes" for n in SCALING)], rows)


def print_logit_drift(model: Model, n_prompts: int, length: int = 40) -> None:
    """How far a prefix's logits move when it is computed in another batch shape: each
    prompt in one forward, and in two chunks split at a random point (what a request
    reusing a prefix another computed does), relative to the row's largest |logit|."""
    rng, worst = np.random.default_rng(1), 0.0
    config = TINY.cache_config(capacity=4 * length, max_width=length, max_seqs=1)
    for _ in range(n_prompts):
        tokens = rng.integers(0, 256, length).tolist()
        cut = int(rng.integers(1, length))
        whole = forward_chunks(model, config, [tokens])
        split = forward_chunks(model, config, [tokens[:cut], tokens[cut:]])
        worst = max(worst, float(np.abs(whole - split).max() / max(1, np.abs(whole).max())))
    print(f"\nlogits of {n_prompts} prompts of {length} tokens, whole vs in two chunks: "
          f"they move by at most {worst:.1e} of the row's largest |logit|")  # fmt: skip


def forward_chunks(model: Model, config, chunks: list[list[int]]) -> np.ndarray:
    """[tokens, vocab] float32: the logits of every token, the chunks one forward each."""
    cache = CellCache(config)
    seq, rows = cache.seq_new(), []
    for chunk in chunks:
        cache.declare_step([seq] * len(chunk))
        step = cache.prepare_step()
        rows.append(model.forward(cache, step, chunk, list(range(len(chunk)))))
    return np.concatenate(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller workload")
    parser.add_argument("--host", action="store_true", help="the host cost alone")
    args = parser.parse_args(argv)
    print_machine()
    repeat = 50 if args.quick else 200
    if args.host:
        print_host_costs(repeat)
        print_host_scaling(repeat)
        return
    model = Model.from_seed(TINY, 0)
    print(
        f"  model    {TINY.n_layers} layers, windows {TINY.windows}; reference CellCache, "
        f"max_width {MAX_WIDTH}, max_seqs {MAX_SEQS}, {CLIENTS} clients"
    )
    start = time.perf_counter()
    for workload in workloads(args.quick):
        print_workload(workload, model)
        if workload.name == "multi-turn":
            print_host_tier(workload, model)
    print(f"\nserving: {time.perf_counter() - start:.1f} s")
    print_logit_drift(model, 5 if args.quick else 20)
    print_host_costs(repeat)
    print_host_scaling(repeat)


if __name__ == "__main__":
    main()
