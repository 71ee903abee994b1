"""The engine with a prefix cache and scheduling by memory (docs/contract.md §9.2): hits as
an unbounded trie counts them, the same tokens on and off, eviction before preemption
before failure, and the failures real runtimes' users reported, each by name."""

import numpy as np
import pytest

import numbakv
from examples.paged_cache import PagedCache
from numbakv.core.errors import CapacityError, ConfigError, ObserverError
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import Sampling
from numbakv.testing.oplog import OpLog
from numbakv.testing.replay import replay

from helpers import tiny_model

MODEL = tiny_model(seed=5)  # layers: global, window 4
RNG = np.random.default_rng(23)
STEM = [int(t) for t in RNG.integers(0, 256, 13)]  # 13: not a multiple of any block size


def engine(capacity=400, sessions=6, prefix=True, oversubscribe=False, cache=None, **kw):
    config = MODEL.config.cache_config(capacity=capacity, max_width=16, max_seqs=8)
    executor = Executor(
        MODEL, cache or CellCache(config), sessions, 40, oversubscribe=oversubscribe
    )
    return Engine(executor, prefix_cache=PrefixCache(executor) if prefix else None, **kw)


def tail(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


WORKLOADS = {
    "shared system prompt": [STEM + tail(4, i) for i in range(8)],
    "few-shot": [tail(5, 1) + tail(5, 2 + i % 3) + tail(5, 9) + tail(3, 40 + i) for i in range(6)],
    "tree of thought": [STEM + tail(3, i % 2) + tail(3, 10 + i) for i in range(8)],
}


def trie_hits(prompts: list[list[int]], earlier: list[list[int]]) -> list[int]:
    """Per prompt, the tokens it shares with any earlier sequence, capped at len - 1."""
    hits = []
    for prompt, seen in zip(prompts, earlier, strict=True):
        best = 0
        for other in seen:
            n = 0
            while n < min(len(other), len(prompt) - 1) and other[n] == prompt[n]:
                n += 1
            best = max(best, n)
        hits.append(best)
    return hits


def one_by_one(e: Engine, prompts, **kw) -> list:
    return [e.generate([p], max_new_tokens=4, **kw)[0] for p in prompts]


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_hits_equal_the_unbounded_tries_while_the_pool_holds_the_working_set(workload):
    prompts = WORKLOADS[workload]
    e = engine()
    done = one_by_one(e, prompts)
    kept = [d.prompt + d.tokens[0][:-1] for d in done]  # a sample's last token is never fed
    expect = trie_hits(prompts, [kept[:i] for i in range(len(prompts))])
    assert [d.metrics.n_cached_tokens for d in done] == expect
    assert sum(expect) > 0 and e.metrics.n_cached_tokens == sum(expect)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(0.9, top_k=20, seed=4)])
def test_the_same_tokens_with_the_prefix_cache_on_and_off(workload, sampling):
    prompts = WORKLOADS[workload]
    off = engine(prefix=False).generate(prompts, max_new_tokens=5, sampling=sampling, n=2)
    on = engine().generate(prompts, max_new_tokens=5, sampling=sampling, n=2)
    assert [d.tokens for d in on] == [d.tokens for d in off]


def test_multi_turn_chat_hits_the_whole_conversation():
    e, conversation = engine(), tail(6, 0)
    for turn in range(4):
        [done] = e.generate([conversation], max_new_tokens=3)
        if turn:
            # all of it but the new message and the reply's last token (never fed)
            assert done.metrics.n_cached_tokens == len(conversation) - 2 - 1
        conversation = conversation + done.tokens[0] + tail(2, 100 + turn)


def test_sliding_window_layers_hit_as_global_ones():
    """vLLM: sliding-window and hybrid models got 0 % hits (block alignment, tail blocks
    freed first). The pool keeps every layer's history: a window-2 model hits the same."""
    windowed = tiny_model(seed=5, windows=(2, 2))
    for model in (MODEL, windowed):
        config = model.config.cache_config(capacity=400, max_width=16, max_seqs=8)
        executor = Executor(model, CellCache(config), 6, 40)
        e = Engine(executor, prefix_cache=PrefixCache(executor))
        done = one_by_one(e, WORKLOADS["shared system prompt"])
        assert [d.metrics.n_cached_tokens for d in done] == [0] + [len(STEM)] * 7
        off = Engine(Executor(model, CellCache(config), 6, 40))
        assert [d.tokens for d in done] == [d.tokens for d in one_by_one(off, done_prompts(done))]


def done_prompts(done) -> list[list[int]]:
    return [d.prompt for d in done]


def test_tokens_recomputed_after_a_preemption_are_not_counted_as_hits():
    """vLLM counted the tokens a preempted request found again in the cache as hits."""
    prompts = [tail(12, i) for i in range(4)]  # nothing shared: no hit is real
    e = engine(capacity=48, oversubscribe=True)
    done = e.generate(prompts, max_new_tokens=20)
    m = e.metrics
    assert m.n_preemptions > 0 and m.n_recomputed_tokens > 0
    assert m.n_cached_tokens == 0 == sum(d.metrics.n_cached_tokens for d in done)
    assert sum(d.metrics.n_recomputed_tokens for d in done) == m.n_recomputed_tokens
    off = engine(capacity=48, oversubscribe=True, prefix=False).generate(prompts, max_new_tokens=20)
    assert [d.tokens for d in done] == [d.tokens for d in off]
    assert all(d.finish_reasons == ["length"] for d in done)


def test_the_same_prompt_gives_the_same_outputs_with_prefix_caching_on():
    """vLLM users saw different outputs for one prompt once it came from the cache."""
    prompt = STEM + tail(5, 1)
    for sampling in (Sampling(), Sampling(1.0, seed=9)):
        e = engine()
        first, *again = one_by_one(e, [prompt] * 4, sampling=sampling)
        assert all(d.metrics.n_cached_tokens == len(prompt) - 1 for d in again)
        assert all(d.tokens == first.tokens for d in again)


def test_the_cell_limit_is_honoured():
    """mlx-lm's prompt cache byte limit was not honoured."""
    e = engine()
    e.prefix_cache.max_cells = 20
    for i, prompt in enumerate(WORKLOADS["tree of thought"]):
        e.submit(prompt, max_new_tokens=4)
        while e.is_busy:
            e.step()
            assert e.prefix_cache.cached_cells <= 20
        assert e.executor.cache.used_cells <= 20, i
    e.prefix_cache.check()


def test_alternating_conversations_do_not_thrash():
    """llama.cpp's server picks a slot by prompt similarity and overwrites it: two chats
    taking turns evict each other. Here each turn hits its own whole conversation (while
    the sessions hold every chat besides the running one: holders are sessions)."""
    e = engine(sessions=4)
    chats = [tail(5, 0), tail(5, 1), STEM[:6]]
    for turn in range(3):
        for i, chat in enumerate(chats):
            [done] = e.generate([chat], max_new_tokens=2)
            # all of it but the new token and the reply's last one (never fed)
            assert done.metrics.n_cached_tokens == (len(chat) - 2 if turn else 0)
            chats[i] = chat + done.tokens[0] + tail(1, 50 + turn)


def test_evicts_before_it_preempts_and_preempts_before_it_fails():
    heard = []
    e = engine(capacity=64, oversubscribe=True, annotate=lambda kind, **d: heard.append(kind))
    prompts = [STEM + tail(3, i) for i in range(8)]
    done = e.generate(prompts, max_new_tokens=24)
    assert "evict" in heard and "preempt" in heard and "error" not in heard
    assert all(d.finish_reasons == ["length"] for d in done)
    assert heard.count("resume") == heard.count("preempt")
    off = engine(capacity=400).generate(prompts, max_new_tokens=24)
    assert [d.tokens for d in done] == [d.tokens for d in off]


def test_after_every_request_and_a_drop_the_pool_is_empty_on_both_caches():
    for cache_type in (CellCache, numbakv.CellCache):
        config = MODEL.config.cache_config(capacity=64, max_width=8, max_seqs=6)
        executor = Executor(MODEL, cache_type(config), 4, 24, oversubscribe=True)
        e = Engine(executor, prefix_cache=PrefixCache(executor))
        e.generate([STEM[:8] + tail(2, i) for i in range(4)], max_new_tokens=6, n=2)
        assert executor.cache.used_cells > 0
        assert e.drop_prefix_cache() > 0
        assert executor.cache.used_cells == 0 and executor.sessions == []
        executor.cache.check_invariants()


def test_lockstep_holds_through_hits_evictions_and_preemptions():
    config = MODEL.config.cache_config(capacity=40, max_width=8, max_seqs=6)
    pair = [
        Executor(MODEL, c(config), 4, 24, oversubscribe=True)
        for c in (numbakv.CellCache, CellCache)
    ]
    lockstep = Lockstep(*pair)
    e = Engine(lockstep, prefix_cache=PrefixCache(lockstep))
    e.generate([STEM[:9] + tail(2, i) for i in range(4)], max_new_tokens=8)
    m = e.metrics
    assert m.n_cached_tokens > 0 and m.n_evicted_cells > 0 and m.n_preemptions > 0
    assert lockstep.n_steps > 0


def test_an_engine_run_replays_into_the_reference_and_the_paged_example():
    config = MODEL.config.cache_config(capacity=30, max_width=8, max_seqs=6)
    log = OpLog(CellCache(config))
    executor = Executor(MODEL, log, 4, 24, oversubscribe=True)
    e = Engine(executor, prefix_cache=PrefixCache(executor))
    e.generate([STEM[:8] + tail(2, i) for i in range(5)], max_new_tokens=8, n=2)
    e.drop_prefix_cache()
    assert e.metrics.n_cached_tokens > 0 and {op.verb for op in log.ops} >= {"seq_clone", "rewind"}
    replay(log.ops, CellCache, config=config)
    replay(log.ops, lambda c: PagedCache(c, block_size=4), config=config)


def test_a_request_that_can_never_fit_is_refused_at_submit():
    e = engine(capacity=48, oversubscribe=True)
    with pytest.raises(CapacityError, match="need 53 cells, more than the pool's capacity 48"):
        e.submit(tail(20, 0), max_new_tokens=12, n=3)
    assert not e.is_busy and e.metrics.n_prompt_tokens == 0


def test_bad_arguments_are_refused_and_change_nothing():
    e = engine()
    with pytest.raises(ConfigError, match="cache_salt must be a str or None, got 3"):
        e.submit([1, 2], cache_salt=3)
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ConfigError, match="watermark"):
            engine(watermark=bad)
    other = engine().executor
    with pytest.raises(ConfigError, match="not this engine's executor"):
        Engine(e.executor, prefix_cache=PrefixCache(other))
    assert not e.is_busy and e.executor.sessions == []


def test_salted_requests_share_only_with_their_salt():
    e = engine()
    prompt = [*STEM, 1]
    assert e.generate([prompt], cache_salt="a")[0].metrics.n_cached_tokens == 0
    assert e.generate([prompt], cache_salt="b")[0].metrics.n_cached_tokens == 0
    assert e.generate([prompt])[0].metrics.n_cached_tokens == 0
    assert e.generate([prompt], cache_salt="a")[0].metrics.n_cached_tokens == len(prompt) - 1


def test_drop_with_requests_running_releases_only_what_they_do_not_hold():
    e = engine()
    e.generate([[*STEM, 1]], max_new_tokens=3)
    running = e.submit([*STEM, 2], max_new_tokens=6)
    e.step()
    held = e.executor.cache.used_cells
    freed = e.drop_prefix_cache()
    assert 0 < freed < held and e.executor.cache.used_cells == held - freed
    while e.is_busy:
        e.step()
    assert e.result(running).metrics.n_cached_tokens == len(STEM)


@pytest.mark.parametrize("prefix", [True, False])
def test_a_preempted_request_of_n_samples_resumes_within_submits_bound(prefix):
    """Its samples come back one, then the others sharing the prompt it computed again:
    resumed apart, three copies of the prompt would not fit the pool `submit` allowed."""
    config = MODEL.config.cache_config(capacity=24, max_width=8, max_seqs=6)
    executor = Executor(MODEL, CellCache(config), 4, 24, oversubscribe=True)
    e = Engine(executor, prefix_cache=PrefixCache(executor) if prefix else None)
    a = e.submit(list(range(10)), max_new_tokens=12)  # 10 + 11 = 21 cells
    b = e.submit(list(range(50, 58)), max_new_tokens=5, n=3)  # 8 + 3 x 4 = 20 cells
    while e.is_busy:
        e.step()
    assert e.metrics.n_preemptions > 0
    assert e.result(a).finish_reasons == ["length"] and e.result(b).finish_reasons == ["length"] * 3
    alone = engine(capacity=400).generate([list(range(50, 58))], max_new_tokens=5, n=3)[0]
    assert e.result(b).tokens == alone.tokens


def test_an_observer_raising_on_a_hit_costs_nothing():
    e = engine()
    e.generate([[1, 2, 3, 4, 5, 6]], max_new_tokens=2)

    def observer(cache, verb, step):
        if verb == "seq_clone":
            raise RuntimeError("an observer's bug")

    e.executor.cache.add_observer(observer)
    request = e.submit([1, 2, 3, 4, 5, 9], max_new_tokens=2)
    with pytest.raises(ObserverError):
        e.step()
    e.executor.cache.remove_observer(observer)
    while e.is_busy:
        e.step()
    assert e.result(request).metrics.n_cached_tokens == 5
    assert e.result(request).finish_reasons == ["length"]
    e.drop_prefix_cache()
    assert e.executor.cache.used_cells == 0 and e.executor.sessions == []
