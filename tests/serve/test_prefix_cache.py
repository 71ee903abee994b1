"""`PrefixCache` over a cache's verbs: against a naive oracle (every indexed sequence in a
list, the longest common prefix by brute force), physical counts (the cells the tree
indexes are the cells the pool holds), eviction order and refusals."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import numbakv
from examples.paged_cache import PagedCache
from numbakv.core.errors import ConfigError, ObserverError, SequenceError
from numbakv.reference import CellCache
from numbakv.serve.prefix import PrefixCache

from helpers import small_config, step_with

CONFIG = small_config(max_seqs=8, max_seq_len=24, capacity=160, max_width=24)


def compute(cache, seq: int, n: int) -> None:
    """Appends `n` positions to `seq` in one step (K/V written as zeros)."""
    step = step_with(cache, [seq] * n)
    kv = np.zeros((step.width, cache.config.n_kv_heads, cache.config.head_dim), np.float32)
    for layer in range(cache.config.n_layers):
        cache.write(layer, kv, kv)


def run(cache, prefix: PrefixCache, tokens: list[int], salt=None) -> tuple[int, int]:
    """A request: its prompt's hit, the rest computed, kept by the prefix cache."""
    seq, m = prefix.acquire(tokens, salt)
    seq = cache.seq_new() if seq is None else seq
    compute(cache, seq, len(tokens) - m)
    prefix.insert(seq, tokens, salt)
    return seq, m


def naive_match(indexed: list[tuple], tokens: list[int], salt) -> int:
    best = 0
    for s, other in indexed:
        if s == salt:
            n = 0
            while n < min(len(other), len(tokens) - 1) and other[n] == tokens[n]:
                n += 1
            best = max(best, n)
    return best


def test_a_hit_shares_cells_and_copies_nothing():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache)
    first, _ = run(cache, prefix, [1, 2, 3, 4, 5, 6])
    seq, m = prefix.acquire([1, 2, 3, 4, 9, 9])
    assert m == 4 and cache.pos(seq) == 4 and cache.used_cells == 6  # nothing copied
    snapshot = cache.snapshot()
    shared = [c for c in range(cache.rows) if snapshot.owners_of(c) == sorted([first, seq])]
    assert len(shared) == 4
    compute(cache, seq, 2)
    prefix.insert(seq, [1, 2, 3, 4, 9, 9])
    assert prefix.n_cells == cache.used_cells == 8
    prefix.check()


def test_the_last_prompt_token_is_always_computed():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache)
    run(cache, prefix, [1, 2, 3])
    assert prefix.match([1, 2, 3]) == 2 and prefix.match([1, 2, 3, 4]) == 3
    assert prefix.acquire([7]) == (None, 0)


def test_salts_do_not_share():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache)
    run(cache, prefix, [1, 2, 3, 4], salt="alice")
    assert prefix.match([1, 2, 3, 4, 5], "alice") == 4
    assert prefix.match([1, 2, 3, 4, 5], "bob") == 0 and prefix.match([1, 2, 3, 4, 5]) == 0


def test_eviction_is_least_recently_used_and_tail_first():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache)
    run(cache, prefix, [1, 2, 3, 4, 5, 6, 7, 8])
    run(cache, prefix, [9, 9, 9, 9])
    prefix.acquire([1, 2, 3, 0])  # a hit on the stem: its tail [4..8] is now the coldest
    prefix.close(cache.live_seqs[-1])
    assert prefix.evict(3) == 3 and cache.used_cells == 9
    assert prefix.match([1, 2, 3, 4, 5, 6]) == 5 and prefix.match([9, 9, 9, 9, 9]) == 4
    assert prefix.evict(100) == 9 and cache.used_cells == 0 == prefix.n_cells
    prefix.check()


def test_a_cell_a_live_sequence_holds_is_never_evicted():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache)
    run(cache, prefix, [1, 2, 3, 4, 5, 6])
    live, _m = prefix.acquire([1, 2, 3, 4, 0])
    assert prefix.cached_cells == 2  # [5, 6]: only the holder's
    assert prefix.evict(10) == 2 and cache.pos(live) == 4 and prefix.match([1, 2, 3, 4, 5]) == 4
    assert prefix.drop() == 0 and cache.used_cells == 4  # the live one's stay
    prefix.close(live)
    assert cache.used_cells == 0 and prefix.n_cells == 0
    prefix.check()


def test_max_cells_bounds_what_it_holds_alone():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache, max_cells=10)
    for i in range(6):
        run(cache, prefix, [i] * 5 + [i + 1] * 3)
        assert prefix.cached_cells <= 10 and cache.used_cells <= 10
    prefix.check()


def test_over_every_cache_that_answers_the_verbs():
    for cache in (CellCache(CONFIG), numbakv.CellCache(CONFIG), PagedCache(CONFIG, block_size=4)):
        prefix = PrefixCache(cache)
        run(cache, prefix, [1, 2, 3, 4, 5, 6, 7])
        _, m = run(cache, prefix, [1, 2, 3, 4, 5, 9])
        assert m == 5 and cache.used_cells == prefix.n_cells == 8
        prefix.drop()
        assert cache.used_cells == 0 and cache.live_seqs == []
        cache.check_invariants()


def test_refusals_name_the_value_and_change_nothing():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache)
    seq, _ = run(cache, prefix, [1, 2, 3, 4])
    before = (cache.snapshot(), prefix.holders, prefix.n_cells, prefix.match([1, 2, 3, 4, 5]))
    with pytest.raises(ConfigError, match="cache_salt must be a str"):
        prefix.acquire([1, 2, 3], salt=7)
    with pytest.raises(ConfigError, match="tokens"):
        prefix.acquire([[1, 2]])
    with pytest.raises(SequenceError, match="already a holder"):
        prefix.insert(seq, [1, 2, 3, 4])
    other = cache.seq_new()
    with pytest.raises(SequenceError, match="holds 0 positions"):
        prefix.insert(other, [1])
    with pytest.raises(SequenceError, match="is a holder"):
        prefix.close(seq)
    with pytest.raises(SequenceError, match="is a holder; acquire"):
        prefix.fork(seq, other)
    with pytest.raises(SequenceError, match="not live"):
        prefix.fork(other, 50)  # no such sequence
    with pytest.raises(SequenceError, match="not live"):
        prefix.close(50)
    with pytest.raises(ConfigError, match="fit int64"):
        prefix.match(np.array([2**63 + 5], np.uint64))
    cache.seq_rm(other)
    assert (
        prefix.live == []
        and (
            cache.snapshot(),
            prefix.holders,
            prefix.n_cells,
            prefix.match([1, 2, 3, 4, 5]),
        )
        == before
    )
    for bad in (-1, 2.5, "10", True):
        with pytest.raises(ConfigError, match="max_cells"):
            PrefixCache(cache, max_cells=bad)
    with pytest.raises(ConfigError, match="a prefix cache needs a cache"):
        PrefixCache(object())


TOKENS = st.lists(st.integers(0, 3), min_size=1, max_size=12)


class PrefixMachine(RuleBasedStateMachine):
    """Requests through the prefix cache over the reference: hits are the naive oracle's,
    the tree's cells are the pool's, every count is recounted."""

    def __init__(self):
        super().__init__()
        self.cache = CellCache(CONFIG)
        self.prefix = PrefixCache(self.cache, max_cells=None)
        self.indexed: list[tuple] = []  # (salt, tokens) of every insert since the last evict
        self.ever: list[tuple] = []  # and of every insert

    @precondition(lambda self: self.cache.free_cells >= 12 and len(self.cache.live_seqs) < 7)
    @rule(tokens=TOKENS, salt=st.sampled_from([None, "a"]))
    def request(self, tokens, salt):
        at_least, at_most = (naive_match(i, tokens, salt) for i in (self.indexed, self.ever))
        _, m = run(self.cache, self.prefix, tokens, salt)
        assert at_least <= m <= at_most
        self.indexed.append((salt, tokens))
        self.ever.append((salt, tokens))

    @precondition(lambda self: self.cache.free_cells >= 12 and len(self.cache.live_seqs) < 6)
    @rule(tokens=TOKENS, extra=st.lists(st.integers(0, 3), min_size=1, max_size=4))
    def shared_then_forked(self, tokens, extra):
        """A prompt shared while it runs, a fork of it, both kept with their own tails."""
        seq, m = self.prefix.acquire(tokens)
        seq = self.cache.seq_new() if seq is None else seq
        compute(self.cache, seq, len(tokens) - m)
        self.prefix.share(seq, tokens)
        fork = self.cache.seq_clone(seq)
        self.prefix.fork(seq, fork)
        for s in (seq, fork):
            compute(self.cache, s, len(extra))
            self.prefix.insert(s, tokens + extra)
        self.indexed.append((None, tokens + extra))
        self.ever.append((None, tokens + extra))

    @rule(n=st.integers(0, 40))
    def evict(self, n):
        before = self.cache.used_cells
        freed = self.prefix.evict(n)
        assert freed == min(n, before) and self.cache.used_cells == before - freed
        self.indexed = [] if freed else self.indexed

    @rule()
    def evict_holder(self):
        n_live = len(self.cache.live_seqs)
        seq = self.prefix.evict_holder()
        assert (seq is None) == (n_live == 0) and len(self.cache.live_seqs) == n_live - (
            seq is not None
        )
        self.indexed = [] if seq is not None else self.indexed

    @invariant()
    def physical(self):
        self.prefix.check()
        self.cache.check_invariants()
        assert self.cache.used_cells == self.prefix.n_cells == self.prefix.cached_cells
        assert self.cache.live_seqs == self.prefix.holders
        for salt, tokens in self.indexed:
            assert self.prefix.match([*tokens, 0], salt) >= len(tokens)


PrefixMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
test_prefix_cache_against_the_oracle = PrefixMachine.TestCase


def test_an_observers_error_carries_the_calls_result():
    cache = CellCache(CONFIG)
    prefix = PrefixCache(cache)
    run(cache, prefix, [1, 2, 3, 4])

    def observer(cache, verb, step):
        if verb == "seq_clone":
            raise RuntimeError("an observer's bug")

    cache.add_observer(observer)
    with pytest.raises(ObserverError) as raised:
        prefix.acquire([1, 2, 3, 9])
    seq, m = raised.value.result
    assert m == 3 and cache.pos(seq) == 3 and prefix.live == [seq]
