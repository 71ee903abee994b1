"""`Executor`: sessions, batches cut into forwards, rewinds, forks, any vocabulary, and
refusals that change nothing."""

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from numbakv.core.errors import (
    AllocationError,
    CapacityError,
    ConfigError,
    SequenceError,
    StepError,
)
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.executor import Executor
from numbakv.serve.plan import plan_slices
from numbakv.serve.sampling import GREEDY, Sampling, sample_token
from numbakv.serve.tokenizer import encode

from helpers import FlakyAllocator, dense_logits, full_state, solo_generate, tiny_model

MODEL = tiny_model()


def make(max_sessions=4, max_session_tokens=32, allocator=None, model=MODEL, **fields):
    fields = dict(capacity=128, max_width=8, max_seqs=4, initial_cells=4) | fields
    cache_config = model.config.cache_config(**fields)
    cache = CellCache(cache_config) if allocator is None else CellCache(cache_config, allocator)
    return Executor(model, cache, max_sessions, max_session_tokens)


def state(executor: Executor) -> tuple:
    """Everything a refused call must leave as it was: the cache, the sessions and each
    session's generator."""
    rngs = {s: executor._open.rng[s].bit_generator.state for s in executor.sessions}
    return full_state(executor.cache), executor.sessions, rngs


def test_execute_appends_and_samples_like_a_solo_run():
    ex = make()
    prompts = [encode("a batch of three"), encode("ab"), encode("cells")]
    sessions = [ex.open_session() for _ in prompts]
    outs = ex.execute([Input(s, 0, p) for s, p in zip(sessions, prompts, strict=True)])
    for out, s, p in zip(outs, sessions, prompts, strict=True):
        tokens, logits = solo_generate(MODEL, p, 1)
        assert (out.session, out.token) == (s, tokens[0])
        np.testing.assert_allclose(out.logits, logits[0], rtol=1e-5, atol=1e-4)
        assert ex.length(s) == len(p)


def test_a_batch_runs_as_the_planned_forwards():
    ex = make(max_width=8)
    widths = []
    ex.cache.add_observer(lambda cache, event, step: widths.append(step.width) if step else None)
    a, b, c = (ex.open_session() for _ in range(3))
    ex.execute([Input(a, 0, encode("12345678901")), Input(b, 0, [1] * 7), Input(c, 0, [2])])
    assert widths == [s.length for s in plan_slices(19, 8) if s.kind == "prefill"] == [8, 8, 3]


def test_rewind_then_regenerate_equals_the_first_run():
    ex = make()
    s = ex.open_session()
    first = ex.execute([Input(s, 0, encode("prompt")), Input(s, 6, [40, 41, 42])])
    other = ex.execute([Input(s, 4, [9, 9, 9, 9, 9])])  # rewinds to 4, appends 5
    assert ex.length(s) == 9
    again = ex.execute([Input(s, 4, [*encode("pt"), 40, 41, 42])])[0]  # rewinds to 4
    np.testing.assert_allclose(again.logits, first[1].logits, rtol=1e-6, atol=1e-5)
    assert not np.allclose(other[0].logits, first[1].logits)


def test_two_inputs_of_one_session_in_position_order():
    ex = make()
    s, t = ex.open_session(), ex.open_session()
    outs = ex.execute([Input(s, 0, [5, 6, 7]), Input(t, 0, [1]), Input(s, 3, [8, 9], sample=False)])
    assert [o.token is None for o in outs] == [False, False, True]
    expect = solo_generate(MODEL, [5, 6, 7, 8, 9], 1)[1][0]
    np.testing.assert_allclose(outs[2].logits, expect, rtol=1e-5, atol=1e-4)


def test_sessions_sample_independently_of_the_batch():
    sampling = Sampling(temperature=1.0, seed=4)
    alone = make()
    s = alone.open_session(sampling)
    expect = [alone.execute([Input(s, 0, [3, 4])])[0].token]
    for i in range(5):
        expect.append(alone.execute([Input(s, 2 + i, expect[-1:])])[0].token)
    crowded = make()
    others = [crowded.open_session(Sampling(temperature=1.0, seed=9)) for _ in range(2)]
    s = crowded.open_session(sampling)
    got = []
    for i in range(6):
        feed = [3, 4] if i == 0 else got[-1:]
        batch = [Input(o, i, [7]) for o in others] + [Input(s, 0 if i == 0 else 1 + i, feed)]
        got.append(crowded.execute(batch)[-1].token)
    assert got == expect


def test_clone_shares_cells_and_closing_frees_them():
    ex = make()
    s = ex.open_session()
    ex.execute([Input(s, 0, [1, 2, 3, 4, 5])])
    c = ex.clone(s, upto=3, sampling=Sampling(temperature=1.0, seed=2))
    assert ex.cache.used_cells == 5 and ex.length(c) == 3
    ex.execute([Input(c, 3, [6])])
    assert ex.cache.used_cells == 6
    ex.close_session(s)
    assert ex.cache.used_cells == 4 and ex.sessions == [c]
    ex.close_session(c)
    assert ex.cache.used_cells == 0 and ex.free_sessions == 4


def test_forks_clone_after_the_input_and_sample_from_its_logits():
    ex = make()
    a, b, c = ex.open_session(), ex.open_session(), ex.open_session()
    ex.close_session(b)  # free ids: 1, then 3
    forks = (Sampling(temperature=1.0, seed=7), Sampling(temperature=0.7, top_k=5, seed=8))
    before = ex.cache.used_cells
    out = ex.execute(
        [Input(a, 0, [1, 2, 3], forks=forks), Input(c, 0, [9, 9]), Input(a, 3, [4, 5])]
    )
    assert [session for session, _ in out[0].forks] == [1, 3]  # lowest free ids, in order
    for (clone, token), sampling in zip(out[0].forks, forks, strict=True):
        assert token == sample_token(out[0].logits, sampling, sampling.generator())
        assert ex.length(clone) == 3  # after the input's last token, not the session's
    assert out[1].forks == out[2].forks == ()
    assert ex.cache.used_cells == before + 7  # the clones copied nothing
    # a clone goes on with its own sampling and generator, one draw already made
    clone, sampling = out[0].forks[0][0], forks[0]
    rng = sampling.generator()
    sample_token(out[0].logits, sampling, rng)
    nxt = ex.execute([Input(clone, 3, [6])])[0]
    assert nxt.token == sample_token(nxt.logits, sampling, rng)
    expect = solo_generate(MODEL, [1, 2, 3, 6], 1)[1][0]
    np.testing.assert_allclose(nxt.logits, expect, rtol=1e-5, atol=1e-4)


def test_forks_equal_clone_then_sample():
    forks = tuple(Sampling(temperature=0.9, seed=s) for s in (3, 4, 5))
    forked, cloned = make(), make()
    for ex in (forked, cloned):
        ex.open_session(Sampling(temperature=0.9, seed=2))
    out = forked.execute([Input(0, 0, encode("one prompt"), forks=forks)])[0]
    ref = cloned.execute([Input(0, 0, encode("one prompt"))])[0]
    by_hand = []
    for sampling in forks:
        clone = cloned.clone(0, sampling=sampling)
        by_hand.append((clone, cloned.sample(clone, ref.logits)))
    assert (out.token, out.forks) == (ref.token, tuple(by_hand))
    assert forked.cache.snapshot() == cloned.cache.snapshot()
    assert state(forked) == state(cloned)  # the same cache, sessions and generator states


@pytest.mark.parametrize(
    "batch, error, match",
    [
        ([("a", 5, [1], 3)], CapacityError, "forks 3 sessions, 2 of max_sessions=4"),
        ([("a", 2, [1], 1), ("b", 2, [1], 2)], CapacityError, "forks 3"),
        ([("a", 2, [1], 1, False)], StepError, "sample=True"),
        ([("a", 2, [1], "greedy")], StepError, "tuple of Sampling"),
        ([("a", 2, [1], ("greedy",))], StepError, "tuple of Sampling"),
        ([("b", 0, [1], 1), ("a", 5, [300], 1)], StepError, r"\[0, 256\)"),
    ],
)
def test_refused_forks_change_nothing(batch, error, match):
    ex = make()
    a, b = ex.open_session(Sampling(temperature=1.0, seed=1)), ex.open_session()
    ex.execute([Input(a, 0, [1, 2, 3, 4, 5]), Input(b, 0, [6, 7])])
    names = {"a": a, "b": b}
    before = state(ex)
    inputs = []
    for session, position, tokens, forks, *sample in batch:
        forks = (GREEDY,) * forks if isinstance(forks, int) else forks
        inputs.append(Input(names[session], position, tokens, *sample, forks=forks))
    with pytest.raises(error, match=match):  # the rewinds of `a` and `b` are not applied
        ex.execute(inputs)
    assert state(ex) == before


def test_session_limits():
    ex = make(max_sessions=2)
    a = ex.open_session()
    ex.clone(a)
    before = state(ex)
    with pytest.raises(CapacityError, match="max_sessions=2"):
        ex.open_session()
    with pytest.raises(CapacityError, match="max_sessions=2"):
        ex.clone(a)
    assert state(ex) == before
    for call in (lambda: ex.close_session(7), lambda: ex.length(3), lambda: ex.clone(5)):
        with pytest.raises(SequenceError, match="not open"):
            call()
    ex.close_session(a)
    before = state(ex)
    with pytest.raises(ConfigError, match="Sampling"):
        ex.open_session("greedy")
    assert state(ex) == before


@pytest.mark.parametrize(
    "batch, error, match",
    [
        ([], StepError, "at least one"),
        ([("a", 0, [1]), (9, 0, [1])], SequenceError, "not open"),
        ([("a", 0, [])], StepError, "non-empty"),
        ([("a", 0, [1.5])], StepError, "ints"),
        ([("a", 0, [256])], StepError, r"\[0, 256\)"),
        ([("a", 0, [1]), ("b", 3, [1])], SequenceError, "gap"),
        ([("a", 6, [1])], SequenceError, "gap"),
        ([("a", 0, [1, 2, 3]), ("a", 2, [1])], SequenceError, "overlaps"),
        ([("a", 2, [1]), ("a", 0, [1])], SequenceError, "overlaps"),
        ([("a", 0, [1]), ("a", 2, [1])], SequenceError, "gap"),
        ([("a", 1, [1] * 16), ("b", 0, [1])], CapacityError, "max_session_tokens=16"),
        ([("a", 3, [1]), ("a", 4, [1] * 13)], CapacityError, "max_session_tokens=16"),
        ([("a", -1, [1])], ConfigError, "position"),
    ],
)
def test_refused_batches_change_nothing(batch, error, match):
    ex = make(max_session_tokens=16)
    a = ex.open_session(Sampling(temperature=1.0, seed=1))
    b = ex.open_session()
    ex.execute([Input(a, 0, [1, 2, 3, 4, 5]), Input(b, 0, [6, 7])])
    names = {"a": a, "b": b}
    before = state(ex)
    # a valid rewind of `a` first in several of these: it must not be applied either
    with pytest.raises(error, match=match):
        ex.execute([Input(names.get(s, s), p, t) for s, p, t in batch])
    assert state(ex) == before


def test_refuses_what_is_not_an_input():
    ex = make()
    ex.open_session()
    with pytest.raises(StepError, match="Input"):
        ex.execute([(0, 0, [1])])


def test_a_failed_growth_rewinds_the_batch():
    allocator = FlakyAllocator()
    ex = make(allocator=allocator, max_width=4, initial_cells=4)
    a, b = ex.open_session(), ex.open_session()
    ex.execute([Input(a, 0, [1, 2, 3])])
    allocator.fail_after = 0
    with pytest.raises(AllocationError):  # the second forward must grow past 4 rows
        ex.execute([Input(a, 1, [5], forks=(GREEDY,)), Input(b, 0, [1, 2, 3, 4, 5])])
    assert (ex.length(a), ex.length(b)) == (1, 0)  # back to where the inputs start
    assert ex.sessions == [a, b]  # and the fork was never made
    allocator.fail_after = None
    out = ex.execute([Input(a, 1, [2, 3])])[0]
    np.testing.assert_allclose(out.logits, solo_generate(MODEL, [1, 2, 3], 1)[1][0], 1e-5, 1e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_sessions=5), "max_seqs=4"),
        (dict(max_session_tokens=200, max_seq_len=100, capacity=256), "max_seq_len=100"),
        (dict(max_sessions=4, max_session_tokens=33), "do not fit the capacity 128"),
        (dict(max_sessions=0), "max_sessions"),
    ],
)
def test_construction_refusals(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        make(**kwargs)


@pytest.mark.parametrize("model", [tiny_model(windows=(0, 5)), tiny_model(n_kv_heads=1)])
def test_refuses_a_cache_of_another_shape(model):
    cache = CellCache(MODEL.config.cache_config(capacity=64, max_width=8, max_seqs=2))
    with pytest.raises(ConfigError, match="cache_config"):
        Executor(model, cache, 2, 32)


def test_refuses_a_cache_in_use():
    cache = CellCache(MODEL.config.cache_config(capacity=64, max_width=8, max_seqs=2))
    cache.seq_new()
    with pytest.raises(ConfigError, match="holds sequences"):
        Executor(MODEL, cache, 2, 32)


REFUSALS = {
    "gap": (SequenceError, "gap"),
    "overlap": (SequenceError, "overlaps"),
    "past budget": (CapacityError, "max_session_tokens=12"),
    "forks": (CapacityError, "forks"),
}


class SessionMachine(RuleBasedStateMachine):
    """Random sessions, clones, closes and batches (appends, rewinds, several inputs of one
    session, forks) through an executor on the reference cache. Each session's tokens are
    modelled here, each token with an identity that clones and forks share: every output's
    logits must equal the dense model over the session's tokens (no cache), `used_cells` the
    number of distinct identities, and a refused batch must change nothing."""

    model = tiny_model(seed=5, windows=(0, 3))

    def __init__(self):
        super().__init__()
        self.ex = make(max_sessions=4, max_session_tokens=12, model=self.model, capacity=48)
        self.held: dict[int, list[tuple[int, int]]] = {}  # session -> [(token, identity)]
        self.n_identities = 0

    @precondition(lambda self: len(self.held) < 4)
    @rule()
    def open(self):
        session = self.ex.open_session()
        assert session == min(set(range(4)) - set(self.held))
        self.held[session] = []

    @precondition(lambda self: self.held and len(self.held) < 4)
    @rule(data=st.data())
    def clone(self, data):
        src = data.draw(st.sampled_from(sorted(self.held)))
        upto = data.draw(st.integers(0, len(self.held[src])))
        self.held[self.ex.clone(src, upto)] = self.held[src][:upto]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def close(self, data):
        session = data.draw(st.sampled_from(sorted(self.held)))
        self.ex.close_session(session)
        del self.held[session]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def execute(self, data):
        batch, ends, n_free = [], {}, 4 - len(self.held)
        for session in data.draw(
            st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=4)
        ):
            start = ends.get(session)
            if start is None:
                start = data.draw(st.integers(0, len(self.held[session])))
            tokens = data.draw(st.lists(st.integers(0, 255), min_size=1, max_size=4))
            is_sampled = data.draw(st.booleans())
            seeds = data.draw(st.lists(st.integers(0, 9), max_size=n_free if is_sampled else 0))
            n_free -= len(seeds)
            forks = tuple(Sampling(temperature=1.0, seed=seed) for seed in seeds)
            batch.append(Input(session, start, tokens, sample=is_sampled, forks=forks))
            ends[session] = start + len(tokens)
        if max(ends.values()) > 12:
            before = state(self.ex)
            with pytest.raises(CapacityError):
                self.ex.execute(batch)
            assert state(self.ex) == before
            return
        outputs = self.ex.execute(batch)
        for x, out in zip(batch, outputs, strict=True):
            kept = self.held[x.session][: x.position]
            self.held[x.session] = kept + [(t, self._identity()) for t in x.tokens]
            expect = dense_logits(self.model, [t for t, _ in self.held[x.session]])[-1]
            np.testing.assert_allclose(out.logits, expect, rtol=1e-4, atol=1e-4)
            assert (out.token is None) != x.sample
            assert len(out.forks) == len(x.forks)
            for (clone, token), sampling in zip(out.forks, x.forks, strict=True):
                assert clone == min(set(range(4)) - set(self.held))  # the lowest free id
                assert token == sample_token(out.logits, sampling, sampling.generator())
                self.held[clone] = list(self.held[x.session])  # shares the identities

    @precondition(lambda self: self.held)
    @rule(data=st.data(), kind=st.sampled_from(["gap", "overlap", "past budget", "forks"]))
    def refused(self, data, kind):
        session = data.draw(st.sampled_from(sorted(self.held)))
        length = len(self.held[session])
        if kind == "gap":
            batch = [Input(session, length + data.draw(st.integers(1, 3)), [1])]
        elif kind == "overlap":  # the first input fits the budget: only the overlap is wrong
            start = data.draw(st.integers(0, min(length, 12 - 2)))
            batch = [Input(session, start, [1, 2]), Input(session, start + 1, [3])]
        elif kind == "past budget":  # a valid start, one to three positions too many
            start = data.draw(st.integers(0, length))
            batch = [Input(session, start, [1] * (12 - start + data.draw(st.integers(1, 3))))]
        else:  # one fork more than there are free sessions
            n_forks = 4 - len(self.held) + 1
            batch = [Input(session, min(length, 11), [1], forks=(GREEDY,) * n_forks)]
        error, match = REFUSALS[kind]
        before = state(self.ex)
        with pytest.raises(error, match=match):
            self.ex.execute(batch)
        assert state(self.ex) == before

    @invariant()
    def lengths_and_cells(self):
        assert self.ex.sessions == sorted(self.held)
        for session, held in self.held.items():
            assert self.ex.length(session) == len(held)
        identities = {i for held in self.held.values() for _, i in held}
        assert self.ex.cache.used_cells == len(identities)
        self.ex.cache.check_invariants()

    def _identity(self) -> int:
        self.n_identities += 1
        return self.n_identities


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(max_examples=40, stateful_step_count=25)
