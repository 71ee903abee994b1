"""The prefix cache's host tier (docs/contract.md §9.2, §13): what the pool gives back is
kept in host memory within `host_bytes` and reloaded, byte for byte, by a later hit; an
engine whose pool is too small for its conversations computes fewer tokens with it and
samples the same ones."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.core.errors import ConfigError
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.host_tier import tail
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import Sampling

from helpers import full_state, small_config, step_with, tiny_model

MODEL = tiny_model(seed=5)  # layers: global, window 4
CONFIG = small_config(capacity=20, max_width=16, max_seqs=4, initial_cells=8)
TOKEN_BYTES = 2 * 2 * 4 * 4  # 2 layers x (K, V) x head_dim 4 x float32


def kv(tokens: list[int], start: int, layer: int) -> np.ndarray:
    """[n, 1, 4] float32: K/V of each token as a function of its token id and position
    alone, so equal prefixes hold equal bytes wherever they were computed."""
    positions = np.arange(start, start + len(tokens))
    values = np.asarray(tokens)[:, None] * 0.5 + positions[:, None] * 0.25 + np.arange(4) + layer
    return values.astype(np.float32)[:, None, :]


def compute(cache: CellCache, seq: int, tokens: list[int], m: int) -> None:
    """Writes tokens[m:] into `seq` (which holds their first m positions)."""
    step_with(cache, [seq] * (len(tokens) - m))
    for layer in range(CONFIG.n_layers):
        values = kv(tokens[m:], m, layer)
        cache.write(layer, values, values + 100)


def serve(prefix: PrefixCache, cache: CellCache, tokens: list[int], salt) -> None:
    """One request as a caller of the prefix cache runs it: its longest hit, its rest
    computed (room made by evicting), then kept. A reload must hold the very bytes the
    host tier was offered for those tokens."""
    while len(cache.live_seqs) == CONFIG.max_seqs and prefix.n_holders:
        prefix.evict_holder()
    reloads = prefix.host.n_reloads
    seq, m = prefix.acquire(tokens, salt)
    if prefix.host.n_reloads > reloads:
        state = prefix.host.states(salt)[-1]  # the one reloaded: the most recently used
        assert cache.seq_save(seq) == tail(state, 0, m) and m <= len(state.tokens)
        assert state.tokens[:m].tolist() == tokens[:m]
    if seq is None:
        if len(cache.live_seqs) == CONFIG.max_seqs:
            return
        seq = cache.seq_new()
    needed = len(tokens) - m
    if cache.free_cells < needed:
        prefix.evict(needed - cache.free_cells)
    if cache.free_cells < needed:
        prefix.close(seq)
        return
    compute(cache, seq, tokens, m)
    prefix.insert(seq, tokens, salt)


CHATS = np.random.default_rng(3).integers(0, 4, (3, 12)).tolist()  # prefixes requests share
REQUEST = st.tuples(
    st.just("request"),
    st.builds(
        lambda chat, n, more: CHATS[chat][:n] + more,
        st.integers(0, 2),
        st.integers(0, 12),
        st.lists(st.integers(0, 3), max_size=2),
    ).filter(len),
    st.sampled_from([None, None, "a"]),
)
OPS = st.one_of(
    REQUEST,
    REQUEST,
    REQUEST,
    st.tuples(st.just("evict"), st.integers(0, 30)),
    st.tuples(st.just("evict_holder")),
    st.tuples(st.just("drop")),
)


@settings(max_examples=200)
@given(host_bytes=st.integers(0, 60 * TOKEN_BYTES), ops=st.lists(OPS, max_size=40))
def test_the_host_tier_stays_in_its_bytes_and_reloads_what_it_was_given(host_bytes, ops):
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache, host_bytes=host_bytes)
    for op in ops:
        if op[0] == "request":
            serve(prefix, cache, op[1], op[2])
        elif op[0] == "evict":
            prefix.evict(op[1])
        else:
            getattr(prefix, op[0])()
        prefix.check()
        held = prefix.host.states(None) + prefix.host.states("a")
        assert prefix.host.nbytes == sum(s.nbytes for s in held) <= host_bytes
        for state in held:  # each as the pool held it: the bytes of its tokens
            for layer in range(CONFIG.n_layers):
                expect = kv(state.tokens.tolist(), 0, layer)
                assert np.array_equal(state.k[layer], expect)
                assert np.array_equal(state.v[layer], expect + 100)
    cache.check_invariants()


def test_a_reload_fills_the_pool_hit_and_is_a_pool_hit_afterwards():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache, host_bytes=10**6)
    long = [1, 2, 3, 4, 5, 6, 7, 8]
    query = [*long, 9]
    serve(prefix, cache, long, None)
    assert prefix.evict(4) == 4 and prefix.host.n_states == 1  # positions 4 .. 7 gone
    assert prefix.match(query) == 4 and prefix.host.nbytes == 8 * TOKEN_BYTES
    seq, m = prefix.acquire(query)  # the tail loaded onto the pool's stem
    assert m == 8 and prefix.host.n_reloads == 1 and prefix.host.n_reloaded_tokens == 4
    assert cache.seq_save(seq, 4) == tail(prefix.host.states()[0], 4, 8)
    prefix.insert(seq, long)
    assert prefix.match(query) == 8 and prefix.n_cells == 8
    again, m = prefix.acquire(query)
    assert m == 8 and prefix.host.n_reloads == 1  # served by the pool now
    prefix.close(again)
    assert prefix.drop() == 8 and prefix.host.n_states == 1  # covered: not saved twice
    assert prefix.host.n_offloads == 1 and prefix.n_cells == 0
    seq, m = prefix.acquire(query)  # a whole reload: the pool holds nothing
    assert m == 8 and prefix.host.n_reloaded_tokens == 12
    prefix.check()


def test_least_recently_used_states_go_first_and_one_too_large_is_not_kept():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache, host_bytes=10 * TOKEN_BYTES)
    for first in (1, 2):
        serve(prefix, cache, [first] * 5, None)
    prefix.drop()
    assert [s.tokens[0] for s in prefix.host.states()] == [1, 2]
    prefix.close(prefix.acquire([1] * 6)[0])  # reloaded: the most recently used
    serve(prefix, cache, [3] * 4, None)
    prefix.drop()  # [3] * 4 kept: [2] * 5, now the least recently used, goes
    assert [s.tokens[0] for s in prefix.host.states()] == [1, 3]
    serve(prefix, cache, [0] * 11, None)
    prefix.drop()  # 11 positions pass 10 positions' bytes: not kept
    assert prefix.host.nbytes == 9 * TOKEN_BYTES and prefix.host.n_states == 2


def test_a_reload_that_cannot_fit_is_a_miss():
    cache = CellCache(CONFIG)  # 20 cells, 4 ids
    prefix = PrefixCache(cache, host_bytes=10**6)
    chat = list(range(10))
    serve(prefix, cache, chat, None)
    prefix.drop()
    busy = cache.seq_new()  # the caller's, unknown to the prefix cache: never evicted
    compute(cache, busy, [3] * 15, 0)
    assert prefix.acquire([*chat, 1]) == (None, 0)  # 10 cells needed, 5 free
    cache.rewind(busy, 0)
    others = [cache.seq_new() for _ in range(3)]  # every id live
    assert prefix.acquire([*chat, 1]) == (None, 0) and prefix.host.n_reloads == 0
    for seq in [busy, *others]:
        cache.seq_rm(seq)
    seq, m = prefix.acquire([*chat, 1])
    assert m == 10 and prefix.host.n_reloads == 1
    prefix.check()


@pytest.mark.parametrize("bad", [-1, True, 1.5, "64", [64]])
def test_a_bad_host_bytes_is_refused_naming_it_with_nothing_made(bad):
    cache = CellCache(CONFIG)
    before = full_state(cache)
    with pytest.raises(ConfigError, match=f"host_bytes.*{re.escape(repr(bad))}"):
        PrefixCache(cache, host_bytes=bad)
    assert full_state(cache) == before


def test_a_target_that_cannot_save_is_refused_with_a_host_tier_only():
    class Lengths:  # the four verbs, no seq_save / seq_load
        def seq_clone(self, src, upto=None): ...
        def rewind(self, seq, position): ...
        def seq_rm(self, seq): ...
        def pos(self, seq): ...

    PrefixCache(Lengths())
    with pytest.raises(ConfigError, match="seq_save, seq_load"):
        PrefixCache(Lengths(), host_bytes=0)


# -- the engine ------------------------------------------------------------------------


def conversations(engine: Engine, turns: int = 3, clients: int = 3) -> list[list[int]]:
    """`clients` chats served in turns round-robin, each turn its conversation so far and
    a new message of 3 tokens; every answer's tokens."""
    rng = np.random.default_rng(7)
    chats = [rng.integers(0, 256, 10).tolist() for _ in range(clients)]
    answers = []
    for _ in range(turns):
        for i, chat in enumerate(chats):
            [done] = engine.generate([chat], max_new_tokens=5)
            answers.append(done.tokens[0])
            chats[i] = chat + done.tokens[0] + rng.integers(0, 256, 3).tolist()
    return answers


def chat_engine(host_bytes, heard=None, cache=None) -> Engine:
    config = MODEL.config.cache_config(capacity=64, max_width=16, max_seqs=8)
    executor = Executor(MODEL, cache or CellCache(config), 6, 60, oversubscribe=True)
    prefix = PrefixCache(executor, host_bytes=host_bytes)
    annotate = None if heard is None else (lambda kind, **data: heard.append((kind, data)))
    return Engine(executor, prefix_cache=prefix, annotate=annotate)


def test_a_pool_too_small_for_the_chats_computes_less_with_the_host_tier():
    heard = []
    pool, tiered = chat_engine(None), chat_engine(10**6, heard)
    assert conversations(pool) == conversations(tiered)
    before, after = pool.metrics, tiered.metrics
    assert after.n_computed_tokens < before.n_computed_tokens and before.n_evicted_cells
    assert after.n_host_cached_tokens > 0 and after.n_reloads > 0 and before.n_reloads == 0
    assert after.n_cached_tokens == after.n_pool_cached_tokens + after.n_host_cached_tokens
    reloads = [data for kind, data in heard if kind == "reload"]
    offloads = [data for kind, data in heard if kind == "offload"]
    assert sum(r["tokens"] for r in reloads) == after.n_host_cached_tokens
    assert len(reloads) == after.n_reloads and offloads
    assert sum(o["tokens"] for o in offloads) == after.n_offloaded_tokens
    assert offloads[-1]["host_bytes"] == after.n_host_bytes <= 10**6
    kinds = [kind for kind, _ in heard]
    for i, kind in enumerate(kinds):
        if kind == "reload":
            assert kinds[i + 1] == "hit" and heard[i + 1][1]["seq"] == heard[i][1]["seq"]
        if kind == "offload":
            assert kinds[i + 1] == "evict"


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(0.9, top_k=20, seed=4)])
def test_the_same_tokens_through_preemptions_and_samples(sampling):
    rng = np.random.default_rng(23)
    stem = rng.integers(0, 256, 13).tolist()
    prompts = [stem + rng.integers(0, 256, 5).tolist() for _ in range(6)]
    runs = {}
    for host_bytes in ("off", None, 10**6):
        config = MODEL.config.cache_config(capacity=48, max_width=16, max_seqs=8)
        executor = Executor(MODEL, CellCache(config), 6, 40, oversubscribe=True)
        prefix = None if host_bytes == "off" else PrefixCache(executor, host_bytes=host_bytes)
        e = Engine(executor, prefix_cache=prefix)
        done = e.generate(prompts, max_new_tokens=6, sampling=sampling, n=2)
        runs[host_bytes] = ([d.tokens for d in done], e.metrics)
    assert runs["off"][0] == runs[None][0] == runs[10**6][0]
    tiered = runs[10**6][1]
    assert tiered.n_preemptions and tiered.n_reloads
    assert tiered.n_computed_tokens < runs[None][1].n_computed_tokens


def test_without_a_host_tier_the_metrics_count_none():
    m = chat_engine(None).metrics
    assert (m.n_host_cached_tokens, m.n_host_bytes, m.n_offloaded_tokens, m.n_reloads) == (0,) * 4


def test_lockstep_holds_through_offloads_and_reloads():
    config = MODEL.config.cache_config(capacity=64, max_width=16, max_seqs=8)
    pair = [Executor(MODEL, CellCache(config), 6, 60, oversubscribe=True) for _ in range(2)]
    lockstep = Lockstep(*pair)
    e = Engine(lockstep, prefix_cache=PrefixCache(lockstep, host_bytes=10**6))
    assert conversations(e) == conversations(chat_engine(None))
    assert e.metrics.n_reloads > 0 and lockstep.n_steps > 0
