"""The `Engine`'s annotations (`numbakv.serve.events`) recorded into a trace: every sequence
a step runs is bound to its request, finishes and cancels match the results, growths match
the pool's count, and annotating changes nothing the engine or the cache does."""

import itertools

import numpy as np
import pytest

from numbakv import Recorder
from numbakv.core.errors import AllocationError, ConfigError, ObserverError
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.sampling import Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler

from helpers import FlakyAllocator, tiny_model

MODEL = tiny_model(seed=2)
# (engine step before which it is submitted, submit's arguments)
WORKLOAD = [
    (0, dict(prompt="Hi", max_new_tokens=4)),
    (0, dict(prompt="a cell cache", max_new_tokens=5, n=3, sampling=Sampling(0.9, seed=3))),
    (1, dict(prompt="cancelled later", max_new_tokens=9)),
    (2, dict(prompt="waits for a session", max_new_tokens=3)),
    (3, dict(prompt="x", max_new_tokens=1, n=2)),
]
CANCEL = (2, 10)  # request 2 is cancelled before engine step 10, while it decodes


def run(annotate=True, every_verb=False, annotate_hook=None):
    """Runs WORKLOAD on a reference cache of 8 initial cells (so the pool grows), recording
    a trace; (engine, cache, trace, ObserverErrors the steps raised)."""
    cache = CellCache(MODEL.config.cache_config(capacity=160, max_width=8, max_seqs=5,
                                                initial_cells=8))  # fmt: skip
    recorder = Recorder(cache, every_verb=every_verb)
    hook = annotate_hook or (recorder.annotate if annotate else None)
    engine = Engine(Executor(MODEL, cache, 5, 32), DecodeFirstScheduler(8, 4, 4), annotate=hook)
    raised = []
    for tick in itertools.count():
        for at, kwargs in WORKLOAD:
            if at == tick:
                engine.submit(**kwargs)
        if tick > CANCEL[1] and not engine.is_busy:
            return engine, cache, recorder.trace(), raised
        if tick == CANCEL[1]:
            raised += observer_errors(engine.cancel, CANCEL[0])
        raised += observer_errors(engine.step)


def observer_errors(call, *args) -> list[ObserverError]:
    """[] after `call(*args)`, or [the ObserverError it raised]."""
    try:
        call(*args)
    except ObserverError as error:
        return [error]
    return []


def results(engine):
    return [engine.result(i) for i in range(len(WORKLOAD))]


@pytest.fixture(scope="module", params=[False, True], ids=["steps", "every_verb"])
def recorded(request):
    return run(every_verb=request.param)


def test_every_sequence_a_step_runs_is_bound_to_its_request(recorded):
    engine, _, trace, _ = recorded
    rows = dict.fromkeys(range(len(WORKLOAD)), 0)  # request -> step rows its sequences ran
    for f in trace.step_frames:
        bound = trace.seq_requests(f)
        step = trace.step(f)
        for seq in step.seq_ids[step.seq_ids >= 0].tolist():
            assert seq in bound, (f, seq)
            rows[bound[seq]] += 1
    assert 0 < len(results(engine)[CANCEL[0]].tokens[0]) < WORKLOAD[CANCEL[0]][1]["max_new_tokens"]
    for done in results(engine):
        # each sample feeds every token it sampled but its last; the prompt runs once
        expect = len(done.prompt) + sum(len(tokens) - 1 for tokens in done.tokens)
        assert rows[done.request_id] == expect, done.request_id


def test_admit_and_fork_bind_each_sample_once(recorded):
    _, _, trace, _ = recorded
    admits = [a for a in trace.annotations if a.kind == "admit"]
    forks = [a for a in trace.annotations if a.kind == "fork"]
    assert [a.data["request"] for a in admits] == list(range(len(WORKLOAD)))
    assert all(len(a.data["seqs"]) == 1 for a in admits)
    n = {r: kwargs.get("n", 1) for r, (_, kwargs) in enumerate(WORKLOAD)}
    assert {a.data["request"]: len(a.data["seqs"]) for a in forks} == {
        r: n[r] - 1 for r in n if n[r] > 1
    }
    for fork in forks:
        [admit] = [a for a in admits if a.data["request"] == fork.data["request"]]
        assert fork.data["source"] == admit.data["seqs"][0]
        assert admit.step < fork.step  # the prompt ran in between


def test_finishes_and_cancels_match_the_results(recorded):
    engine, _, trace, _ = recorded
    finishes = {
        (a.data["request"], a.data["sample"]): a.data["reason"]
        for a in trace.annotations
        if a.kind == "finish"
    }
    counts = trace.annotation_counts()
    assert counts["finish"] == len(finishes) == sum(kw.get("n", 1) for _, kw in WORKLOAD)
    for done in results(engine):
        for sample, reason in enumerate(done.finish_reasons):
            assert finishes[done.request_id, sample] == reason
    assert [a.data for a in trace.annotations if a.kind == "cancel"] == [{"request": CANCEL[0]}]
    assert "error" not in counts
    cancel = next(a for a in trace.annotations if a.kind == "cancel")
    finish = next(a for a in trace.annotations if a.kind == "finish" and a.data["request"] == 2)
    assert trace.annotations.index(cancel) < trace.annotations.index(finish)


def test_growths_match_the_pool(recorded):
    _, cache, trace, _ = recorded
    growths = [a for a in trace.annotations if a.kind == "growth"]
    assert cache.growth_count >= 2
    assert sum(a.data["growths"] for a in growths) == cache.growth_count
    rows = trace.arrays["rows"]
    for a in growths:
        assert a.data["rows"] == rows[a.frame] > a.data["rows_before"]
    assert rows[-1] == cache.rows


def test_annotating_changes_nothing():
    engine, cache, trace, _ = run(annotate=True)
    plain_engine, plain_cache, plain_trace, _ = run(annotate=False)
    for got, expect in zip(results(engine), results(plain_engine), strict=True):
        assert (got.tokens, got.finish_reasons) == (expect.tokens, expect.finish_reasons)
    assert cache.snapshot() == plain_cache.snapshot() and engine.n_steps == plain_engine.n_steps
    for name, array in trace.arrays.items():
        np.testing.assert_array_equal(array, plain_trace.arrays[name], err_msg=name)
    assert plain_trace.annotations == () and len(trace.annotations) > 0


def test_a_hook_that_raises_is_an_observer_error_once_the_step_is_done():
    heard = []

    def hook(kind, **data):
        heard.append(kind)
        if kind == "finish":
            raise RuntimeError("hook down")

    engine, cache, _, raised = run(annotate_hook=hook)
    plain_engine, plain_cache, _, _ = run(annotate=False)
    assert raised and all(isinstance(e.__cause__, RuntimeError) for e in raised)
    assert "annotate hook" in str(raised[0]) and raised[0].event == "finish"
    assert heard.count("finish") == sum(kw.get("n", 1) for _, kw in WORKLOAD)
    for got, expect in zip(results(engine), results(plain_engine), strict=True):
        assert (got.tokens, got.finish_reasons) == (expect.tokens, expect.finish_reasons)
    assert cache.snapshot() == plain_cache.snapshot()


def test_an_executor_failure_annotates_error_for_its_batch():
    allocator = FlakyAllocator()
    cache = CellCache(MODEL.config.cache_config(capacity=64, max_width=16, max_seqs=2,
                                                initial_cells=8), allocator)  # fmt: skip
    recorder = Recorder(cache)
    engine = Engine(Executor(MODEL, cache, 2, 32), DecodeFirstScheduler(16, 2, 14),
                    annotate=recorder.annotate)  # fmt: skip
    a = engine.submit("ab", max_new_tokens=3)
    engine.step()
    b = engine.submit("ten tokens", max_new_tokens=3)
    allocator.fail_after = 0
    with pytest.raises(AllocationError):
        engine.step()
    trace = recorder.trace()
    errors = [x.data for x in trace.annotations if x.kind == "error"]
    finishes = [x.data for x in trace.annotations if x.kind == "finish"]
    assert errors == [{"request": a}, {"request": b}]
    assert [(f["request"], f["reason"]) for f in finishes] == [(a, "error"), (b, "error")]
    assert "growth" not in trace.annotation_counts()  # the refused growth is no growth


def test_the_hook_must_be_callable_or_none():
    executor = Executor(
        MODEL, CellCache(MODEL.config.cache_config(capacity=64, max_width=8, max_seqs=2)), 2, 32
    )
    with pytest.raises(ConfigError, match="annotate must be a callable"):
        Engine(executor, annotate="recorder")
    assert Engine(executor, annotate=None).step() == []
