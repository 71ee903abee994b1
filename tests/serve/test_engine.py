"""`Engine`: continuous batching through the device cache equals each prompt generated alone
through the reference; streaming, n > 1 samples, stop tokens, cancel, admission, metrics."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numbakv
from numbakv.core.errors import AllocationError, CapacityError, ConfigError
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep, LockstepError
from numbakv.serve.sampling import Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler, Task
from numbakv.serve.tokenizer import encode

from helpers import FlakyAllocator, solo_generate, tiny_model

MODEL = tiny_model(seed=1)  # layers: global, window 4
PROMPTS = ["Hi", "a cell cache", "x", "several sequences share a pool", "GQA!", "seven"]
ARRIVALS = [0, 0, 1, 2, 4, 7]  # the engine step before which each prompt is submitted


def executor(cache_class=CellCache, max_sessions=6, max_session_tokens=48, model=MODEL, **fields):
    fields = dict(capacity=288, max_width=8, max_seqs=8, initial_cells=8) | fields
    cache = cache_class(model.config.cache_config(**fields))
    return Executor(model, cache, max_sessions, max_session_tokens)


def run_arrivals(engine: Engine, submissions: list[tuple[int, dict]]) -> dict[int, list]:
    """Submits each (step, kwargs) before that engine step, runs until idle; returns
    request -> its token events in order."""
    events: dict[int, list] = {}
    for tick in itertools.count():
        for at, kwargs in submissions:
            if at == tick:
                request = engine.submit(**kwargs, on_token=lambda e: events[e.request_id].append(e))
                events[request] = []
        if tick >= max(at for at, _ in submissions) and not engine.is_busy:
            return events
        engine.step()


def test_batched_greedy_on_the_device_equals_each_prompt_alone():
    engine = Engine(executor(numbakv.CellCache), DecodeFirstScheduler(8, 6, 4))
    submissions = [
        (at, dict(prompt=p, max_new_tokens=5)) for at, p in zip(ARRIVALS, PROMPTS, strict=True)
    ]
    events = run_arrivals(engine, submissions)
    mixed = 0
    for request, prompt in enumerate(PROMPTS):
        # reference: the prompt alone, one sequence in a reference cache
        expect_tokens, expect_logits = solo_generate(MODEL, encode(prompt), 5)
        # device: its events from the batched run
        got = events[request]
        assert [e.token for e in got] == expect_tokens
        for e, logits in zip(got, expect_logits, strict=True):
            np.testing.assert_allclose(e.logits, logits, rtol=1e-4, atol=1e-4)
        assert engine.result(request).tokens == [expect_tokens]
        mixed += engine.result(request).metrics.n_steps
    assert engine.n_steps < mixed  # requests shared steps
    assert engine.executor.cache.used_cells == 0 and not engine.executor.sessions


def test_n_samples_share_the_prompt_and_equal_solo_runs_with_their_seeds():
    sampling = Sampling(temperature=0.9, top_k=50, top_p=0.9, seed=11)
    prompt = encode("one prompt, three samples")
    engine = Engine(executor(numbakv.CellCache), DecodeFirstScheduler(8, 4, 4))
    cache = engine.executor.cache
    first: list[tuple[int, np.ndarray]] = []

    def on_token(event):
        if len(first) < 3:  # the three first tokens come from the same step, before any decode
            first.append((cache.used_cells, cache.snapshot().n_owners))

    request = engine.submit(prompt, max_new_tokens=6, sampling=sampling, n=3, on_token=on_token)
    while engine.is_busy:
        engine.step()
    for used, n_owners in first:
        assert used == len(prompt)  # the prompt's cells once
        assert n_owners.tolist() == [3] * len(prompt)  # owned by all three samples
    done = engine.result(request)
    for i, tokens in enumerate(done.tokens):
        expect, _ = solo_generate(MODEL, prompt, 6, Sampling(0.9, 50, 0.9, seed=11 + i))
        assert tokens == expect
    assert len({tuple(t) for t in done.tokens}) > 1  # the seeds made a difference
    assert done.finish_reasons == ["length"] * 3 and cache.used_cells == 0


class NoCloneOrSample:
    """An executor whose `clone` and `sample` the engine must not reach."""

    def __init__(self, executor: Executor):
        self.executor = executor

    def __getattr__(self, name):
        if name in ("clone", "sample"):
            raise AssertionError(f"the engine called executor.{name}")
        return getattr(self.executor, name)


def test_the_engine_leaves_sampling_and_cloning_to_execute():
    engine = Engine(NoCloneOrSample(executor()))
    done = engine.generate(["n = 3"], max_new_tokens=3, sampling=Sampling(1.0, seed=4), n=3)[0]
    for i, tokens in enumerate(done.tokens):
        assert tokens == solo_generate(MODEL, encode("n = 3"), 3, Sampling(1.0, seed=4 + i))[0]


def test_generate_on_the_reference_matches_solo_and_streams_in_order():
    engine = Engine(executor())
    prompts = [encode(p) for p in PROMPTS[:4]]
    heard = []
    done = engine.generate(prompts, max_new_tokens=4, on_token=heard.append)
    for completion, prompt in zip(done, prompts, strict=True):
        assert completion.prompt == prompt
        assert completion.tokens == [solo_generate(MODEL, prompt, 4)[0]]
        tokens = [e.token for e in heard if e.request_id == completion.request_id]
        assert tokens == completion.tokens[0]
    ids = [engine.submit(p, max_new_tokens=3) for p in prompts[:2]]
    streamed = list(engine.stream())
    for request in ids:
        tokens = [e.token for e in streamed if e.request_id == request]
        assert tokens == engine.result(request).tokens[0]
        reasons = [e.finish_reason for e in streamed if e.request_id == request]
        assert reasons == [None, None, "length"]


def test_new_requests_join_while_others_decode_and_finished_ones_free_cells_at_once():
    ex = executor(max_sessions=3)
    batches = []
    execute = ex.execute
    ex.execute = lambda inputs: batches.append(list(inputs)) or execute(inputs)
    engine = Engine(ex, DecodeFirstScheduler(8, 3, 4))
    short = engine.submit("ab", max_new_tokens=4)
    engine.step()
    engine.step()
    long = engine.submit("a longer prompt", max_new_tokens=4)
    freed = []

    def check(event):
        if event.finish_reason:  # its session is closed and its cells free already
            lengths = sum(ex.length(s) for s in ex.sessions)
            freed.append(ex.cache.used_cells == lengths)

    engine._requests[short].on_token = check
    engine.step()
    kinds = {(i.session, len(i.tokens)) for i in batches[-1]}
    assert (0, 1) in kinds and (1, 4) in kinds  # a decode and a prefill chunk in one batch
    while engine.is_busy:
        engine.step()
    assert freed == [True]
    assert engine.result(long).finish_reasons == ["length"]


def test_stop_tokens_end_a_sample_and_are_kept():
    engine = Engine(executor())
    free_run = engine.generate(["stop here"], max_new_tokens=6)[0].tokens[0]
    stop = free_run[2]
    cut = free_run[: free_run.index(stop) + 1]
    done = engine.generate(["stop here"], max_new_tokens=6, stop_tokens=[stop])[0]
    assert done.tokens == [cut] and done.finish_reasons == ["stop"]


def test_cancel_waiting_running_and_finished_requests():
    engine = Engine(executor(max_sessions=2), DecodeFirstScheduler(8, 2, 4))
    ex = engine.executor
    running = engine.submit("running", max_new_tokens=20, n=2)
    waiting = engine.submit("waiting", max_new_tokens=3)
    for _ in range(4):
        engine.step()
    assert len(ex.sessions) == 2 and engine.result(running).tokens[0]
    assert engine.cancel(waiting)
    assert engine.result(waiting).finish_reasons == ["cancelled"]
    assert engine.cancel(running)
    assert ex.sessions == [] and ex.cache.used_cells == 0
    assert engine.scheduler.pending() == 0 and not engine.is_busy
    assert engine.result(running).finish_reasons == ["cancelled", "cancelled"]
    assert not engine.cancel(running)
    done = engine.generate(["after"], max_new_tokens=2)[0]
    assert done.tokens == [solo_generate(MODEL, encode("after"), 2)[0]]


def test_cancel_before_the_clones_releases_their_sessions():
    engine = Engine(executor(max_sessions=3), DecodeFirstScheduler(4, 2, 2))
    three = engine.submit("long enough prompt", max_new_tokens=3, n=3)
    engine.step()  # admitted: one session open, two reserved for its clones
    blocked = engine.submit("next", max_new_tokens=2)
    engine.step()
    assert engine.executor.sessions == [0]  # `next` waits behind the reservation
    engine.cancel(three)
    engine.step()
    assert engine.executor.sessions == [0] and engine.result(blocked).tokens[0]


def test_a_request_waits_until_sessions_are_free():
    engine = Engine(executor(max_sessions=3))
    first = engine.submit("first", max_new_tokens=3, n=2)
    second = engine.submit("second", max_new_tokens=2, n=2)
    engine.step()  # `first` ran its prompt and cloned; `second` needs 2 sessions, 1 is free
    assert len(engine.executor.sessions) == 2 and engine.result(second).tokens == [[], []]
    while not engine.result(first).finish_reasons[0]:
        engine.step()
        assert engine.result(second).tokens == [[], []]
    while engine.is_busy:
        engine.step()
    assert engine.result(second).finish_reasons == ["length", "length"]


def test_metrics_from_the_clock():
    engine = Engine(executor(), clock=lambda: float(engine.n_steps))  # time in steps
    request = engine.submit("metrics", max_new_tokens=4)
    assert engine.result(request).metrics.time_to_first_token is None
    while engine.is_busy:
        engine.step()
    m = engine.result(request).metrics
    assert m.n_steps == 4 and m.n_tokens == 4
    assert m.time_to_first_token == 1.0  # submitted at 0, the first token after step 1
    assert m.tokens_per_second == 1.0  # 4 tokens, finished after step 4


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(prompt=""), ConfigError, "prompt"),
        (dict(prompt=[1, 300]), ConfigError, "prompt"),
        (dict(prompt="x", max_new_tokens=0), ConfigError, "max_new_tokens"),
        (dict(prompt="x", n=0), ConfigError, "n"),
        (dict(prompt="x", n=7), CapacityError, "max_sessions=6"),
        (dict(prompt="x" * 40, max_new_tokens=9), CapacityError, "max_session_tokens=48"),
        (dict(prompt="x", sampling="greedy"), ConfigError, "Sampling"),
    ],
)
def test_submit_refusals_change_nothing(kwargs, error, match):
    engine = Engine(executor())
    with pytest.raises(error, match=match):
        engine.submit(**kwargs)
    assert not engine.is_busy and engine.step() == []
    assert engine.submit("ok") == 0


def test_engine_refusals():
    scheduler = DecodeFirstScheduler(8, 2, 4)
    scheduler.submit([Task(0, "prefill", 3)])
    with pytest.raises(ConfigError, match="queued"):
        Engine(executor(), scheduler)
    with pytest.raises(ConfigError, match="no request 3"):
        Engine(executor()).result(3)


def test_lockstep_passes_equal_executors_and_catches_a_different_one():
    same = Lockstep(executor(), executor())
    Engine(same).generate(["lockstep"], max_new_tokens=3, n=2)
    assert same.n_steps == 3 and same.max_logit_error == 0.0
    other = Lockstep(executor(), executor(model=tiny_model(seed=2)))
    with pytest.raises(LockstepError, match="logits differ"):
        Engine(other).generate(["lockstep"], max_new_tokens=3)


def test_lockstep_compares_forks():
    lockstep = Lockstep(executor(), executor())
    session = lockstep.open_session()
    lockstep.reference.open_session()  # the reference's next free id is one higher
    with pytest.raises(LockstepError, match="forked"):
        lockstep.execute([Input(session, 0, [1, 2], forks=(Sampling(),))])


def test_lockstep_refusals_must_agree():
    strict = Lockstep(executor(), executor(max_session_tokens=8))
    session = strict.open_session()
    with pytest.raises(LockstepError, match="the executor did not"):
        strict.execute([Input(session, 0, [1] * 9)])
    both = Lockstep(executor(), executor())
    with pytest.raises(CapacityError):
        both.execute([Input(both.open_session(), 0, [1] * 49)])


@st.composite
def workloads(draw):
    """Requests (arrival tick, prompt, max_new_tokens, n, sampling, cancel tick or None) and
    the limits of an executor and a scheduler to serve them."""
    max_width = draw(st.integers(1, 8))
    budget = draw(st.integers(1, 10))
    limits = (max_width, budget, draw(st.integers(1, budget)), draw(st.integers(1, budget)))
    requests = []
    for _ in range(draw(st.integers(1, 5))):
        sampling = draw(st.sampled_from([Sampling(), Sampling(0.8, 20, 0.9, seed=3)]))
        requests.append(
            (
                draw(st.integers(0, 6)),
                draw(st.lists(st.integers(0, 255), min_size=1, max_size=12)),
                draw(st.integers(1, 4)),
                draw(st.integers(1, 2)),
                sampling,
                draw(st.none() | st.integers(0, 12)),
            )
        )
    return limits, requests


@settings(max_examples=40)
@given(workloads())
def test_any_workload_gives_each_request_its_solo_tokens(workload):
    (max_width, budget, n_decodes, chunk), requests = workload
    ex = executor(max_sessions=4, max_session_tokens=16, max_width=max_width, capacity=64)
    engine = Engine(ex, DecodeFirstScheduler(budget, n_decodes, chunk))
    ids = {}
    for tick in itertools.count():
        for i, (at, prompt, max_new, n, sampling, cancel_at) in enumerate(requests):
            if at == tick:
                ids[i] = engine.submit(prompt, max_new, sampling, n=n)
            if cancel_at == tick and i in ids:
                engine.cancel(ids[i])
        if len(ids) == len(requests) and not engine.is_busy:
            break
        engine.step()
        lengths = {s: ex.length(s) for s in ex.sessions}
        assert ex.cache.used_cells <= sum(lengths.values())  # shared prompts count once
    assert ex.sessions == [] and ex.cache.used_cells == 0 and engine.scheduler.pending() == 0
    for i, (_, prompt, max_new, n, sampling, _) in enumerate(requests):
        done = engine.result(ids[i])
        assert len(done.tokens) == n
        for k, (tokens, reason) in enumerate(zip(done.tokens, done.finish_reasons, strict=True)):
            expect, _ = solo_generate(
                MODEL, prompt, max_new, replace(sampling, seed=sampling.seed + k)
            )
            if reason == "cancelled":
                assert tokens == expect[: len(tokens)]
            else:
                assert (tokens, reason) == (expect, "length")


def test_a_failed_batch_ends_its_requests_with_error_and_the_rest_go_on():
    allocator = FlakyAllocator()
    ex = executor(lambda config: CellCache(config, allocator), max_sessions=2)
    engine = Engine(ex, DecodeFirstScheduler(16, 2, 14))
    a = engine.submit("ab", max_new_tokens=3)
    engine.step()  # 8 rows allocated
    b = engine.submit("ten tokens", max_new_tokens=3)
    c = engine.submit("waits", max_new_tokens=2)  # no session for it yet
    allocator.fail_after = 0
    with pytest.raises(AllocationError):
        engine.step()  # a's decode and b's prompt need 12 cells
    assert engine.result(a).finish_reasons == engine.result(b).finish_reasons == ["error"]
    assert ex.sessions == [] and ex.cache.used_cells == 0 and engine.scheduler.pending() == 0
    allocator.fail_after = None
    while engine.is_busy:
        engine.step()
    assert engine.result(c).tokens == [solo_generate(MODEL, encode("waits"), 2)[0]]
