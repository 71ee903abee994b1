"""An observer of the cache that raises (`ObserverError`: the verb completed, its change
stands) never leaves the executor or the engine half-done: the error propagates once their
bookkeeping is finished, their sessions are the cache's sequences, and every request still
gets exactly the tokens of a run whose observer does not raise."""

import functools
import itertools

import pytest

from numbakv.core.errors import AllocationError, ObserverError, SequenceError
from numbakv.reference import CellCache
from numbakv.serve.batch import Input, Output
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.sampling import Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler
from numbakv.serve.tokenizer import encode

from helpers import FlakyAllocator, tiny_model

MODEL = tiny_model(seed=6)
EVENTS = ("seq_new", "seq_clone", "seq_rm", "rewind", "declare_step", "prepare_step")
PROMPTS = ["first", "forked", "last one"]
N = (1, 3, 1)  # the middle request forks two clones
MAX_NEW_TOKENS = (3, 5, 7)  # they end in different steps
MAX_STEPS = 50


class Boom(Exception):
    """What the observers raise."""


def raising_on(event: str):
    def observer(cache, verb, step):
        if verb == event:
            raise Boom(event)

    return observer


def new_executor() -> Executor:
    cache = CellCache(MODEL.config.cache_config(capacity=192, max_width=8, max_seqs=8))
    return Executor(MODEL, cache, 6, 32)


def assert_whole(executor: Executor) -> None:
    """The executor's sessions are the cache's sequences; the table holds."""
    assert executor.sessions == executor.cache.live_seqs
    assert executor.free_sessions == executor.max_sessions - len(executor.cache.live_seqs)
    executor.cache.check_invariants()


def script(executor: Executor) -> tuple[list, list[ObserverError]]:
    """Opens, forks, clones, rewinds, regenerates and closes sessions, taking each call's
    result from its ObserverError when it raised one; returns (what each call gave, in a
    comparable form, the ObserverErrors)."""
    results, errors = [], []

    def call(method, *args):
        try:
            out = method(*args)
        except ObserverError as error:
            errors.append(error)
            out = error.result
        assert_whole(executor)
        if isinstance(out, list):
            assert all(isinstance(o, Output) for o in out)
            results.append([(o.session, o.token, o.forks, o.logits.tolist()) for o in out])
        else:
            results.append(out)
        return out

    a = call(executor.open_session, Sampling(1.0, top_k=40, seed=1))
    b = call(executor.open_session)
    fork = (Sampling(1.0, top_k=40, seed=2),)
    prompt = encode("a prompt")
    [out_a, out_b] = call(executor.execute, [Input(a, 0, prompt, forks=fork), Input(b, 0, [3])])
    c = call(executor.clone, b)
    [(d, _)] = out_a.forks
    call(executor.execute, [Input(a, 3, [out_a.token]), Input(c, 1, [out_b.token, 7])])
    call(executor.execute, [Input(d, len(prompt), [9, 10]), Input(b, 0, [4, 5])])  # rewinds b
    for session in (a, b, c, d):
        call(executor.close_session, session)
    return results, errors


@pytest.mark.parametrize("event", EVENTS)
def test_the_executor_finishes_each_call_then_raises_the_observers_error(event):
    expect, clean = script(new_executor())
    assert clean == []
    executor = new_executor()
    executor.cache.add_observer(raising_on(event))
    results, errors = script(executor)
    assert errors and all(e.event == event for e in errors)
    assert all(isinstance(e.__cause__, Boom) for e in errors)
    assert results == expect  # every call did all it does without the fault
    assert executor.sessions == [] == executor.cache.live_seqs
    assert executor.cache.used_cells == 0 and executor.free_sessions == 6


def test_a_session_whose_close_raised_is_closed_and_its_slot_free():
    executor = new_executor()
    session = executor.open_session()
    executor.execute([Input(session, 0, [1, 2, 3])])
    executor.cache.add_observer(raising_on("seq_rm"))
    with pytest.raises(ObserverError):
        executor.close_session(session)
    assert executor.sessions == [] and executor.free_sessions == 6
    with pytest.raises(SequenceError):
        executor.close_session(session)
    assert executor.open_session() == session


def test_a_failed_batch_is_rewound_and_carries_the_observers_errors():
    allocator = FlakyAllocator()
    cache = CellCache(MODEL.config.cache_config(capacity=64, max_width=8, max_seqs=2,
                                                initial_cells=8), allocator)  # fmt: skip
    executor = Executor(MODEL, cache, 2, 32)
    session = executor.open_session()
    executor.execute([Input(session, 0, [1, 2, 3])])
    cache.add_observer(raising_on("rewind"))
    allocator.fail_after = 0  # the pool cannot grow for the next 12 tokens
    with pytest.raises(AllocationError) as raised:
        executor.execute([Input(session, 1, list(range(12)))])  # rewinds to 1, then fails
    assert "observers of the cache raised too" in "".join(raised.value.__notes__)
    assert executor.length(session) == 1 and executor.sessions == [session]
    assert_whole(executor)


def new_engine() -> Engine:
    return Engine(new_executor(), DecodeFirstScheduler(24, 6, 8))


def submit(engine: Engine) -> None:
    for i, prompt in enumerate(PROMPTS):
        engine.submit(prompt, MAX_NEW_TOKENS[i], Sampling(1.0, top_k=40, seed=10 * i), n=N[i])


def assert_consistent(engine: Engine) -> None:
    """The engine's running samples are the executor's sessions and the cache's sequences;
    queued work is only theirs; the table holds."""
    running = sorted(engine._running)
    assert running == engine.executor.sessions
    assert all(engine.scheduler.pending(s) == 0 for s in range(8) if s not in running)
    assert_whole(engine.executor)


@functools.cache  # one fault-free run: every test compares with it, none changes it
def expected() -> list[list[list[int]]]:
    engine = new_engine()
    submit(engine)
    while engine.is_busy:
        engine.step()
    return [engine.result(i).tokens for i in range(len(PROMPTS))]


def assert_all_done(engine: Engine, expect) -> None:
    for i in range(len(PROMPTS)):
        done = engine.result(i)
        assert done.tokens == expect[i] and done.finish_reasons == ["length"] * N[i]
    assert not engine.is_busy and engine.executor.sessions == []
    assert engine.executor.cache.used_cells == 0


@pytest.mark.parametrize("event", [e for e in EVENTS if e != "rewind"])  # it never rewinds
def test_an_observer_that_raises_in_a_step_costs_no_request_a_token(event):
    expect = expected()
    engine = new_engine()
    submit(engine)
    observer = raising_on(event)
    engine.executor.cache.add_observer(observer)
    raised = None
    for _ in range(MAX_STEPS):
        if not engine.is_busy:
            break
        try:
            engine.step()
        except ObserverError as error:
            raised = error
            assert "no request lost a token" in "".join(error.__notes__)
            assert all(engine.result(i).finish_reasons != ["error"] for i in range(3))
            assert_consistent(engine)
            break
    assert raised is not None
    engine.executor.cache.remove_observer(observer)
    assert engine.is_busy  # the fault came before the end: the others step on
    while engine.is_busy:
        engine.step()
    assert_all_done(engine, expect)


def test_an_observer_that_always_raises_still_gives_every_token():
    expect = expected()
    engine = new_engine()
    submit(engine)
    engine.executor.cache.add_observer(raising_on("prepare_step"))
    n_raised = 0
    for _ in range(MAX_STEPS):
        if not engine.is_busy:
            break
        with pytest.raises(ObserverError):
            engine.step()
        n_raised += 1
        assert_consistent(engine)
    assert n_raised == 7  # one per step, to the longest request's end
    assert_all_done(engine, expect)


def test_stream_yields_the_step_then_raises_the_observers_error():
    expect = expected()
    engine = new_engine()
    submit(engine)
    observer = raising_on("seq_clone")  # in the first step, when the prompts are done
    engine.executor.cache.add_observer(observer)
    streamed = []
    with pytest.raises(ObserverError):
        for event in itertools.islice(engine.stream(), MAX_STEPS):
            streamed.append(event)
    assert len(streamed) == 5  # the first tokens of the five samples
    engine.executor.cache.remove_observer(observer)
    streamed += list(itertools.islice(engine.stream(), MAX_STEPS))
    for i in range(len(PROMPTS)):
        for j in range(N[i]):
            assert [e.token for e in streamed if (e.request_id, e.sample) == (i, j)] == expect[i][j]


def test_generate_finishes_its_requests_then_raises_the_observers_error():
    expect = expected()
    engine = new_engine()
    engine.submit(PROMPTS[0], MAX_NEW_TOKENS[0], Sampling(1.0, top_k=40, seed=0))
    engine.executor.cache.add_observer(raising_on("seq_rm"))
    with pytest.raises(ObserverError) as raised:
        engine.generate(PROMPTS[1:2], MAX_NEW_TOKENS[1], Sampling(1.0, top_k=40, seed=10), n=3)
    assert "generate() finished its requests [1] first" in "".join(raised.value.__notes__)
    for i in (0, 1):
        assert engine.result(i).tokens == expect[i]
        assert engine.result(i).finish_reasons == ["length"] * N[i]
    assert_consistent(engine)


def test_a_cancel_whose_close_raised_is_done():
    engine = new_engine()
    submit(engine)
    engine.step()
    engine.executor.cache.add_observer(raising_on("seq_rm"))
    with pytest.raises(ObserverError):
        engine.cancel(1)  # its three sessions close: all three, though each close raises
    assert engine.result(1).finish_reasons == ["cancelled"] * 3
    assert sorted(engine._running) == [0, 2]
    assert_consistent(engine)


def test_a_callbacks_cancel_raises_its_own_observers_error_into_the_callback():
    engine = new_engine()
    closing = []  # set while the callback cancels: the observer raises only then

    def observer(cache, verb, step):
        if closing and verb == "seq_rm":
            raise Boom(verb)

    def on_token(event):
        if not closing:
            closing.append(True)
            try:
                engine.cancel(1)
            finally:
                closing.clear()

    engine.executor.cache.add_observer(observer)
    engine.submit(PROMPTS[0], 3, on_token=on_token)
    engine.submit(PROMPTS[1], 3, n=3)
    with pytest.raises(ObserverError) as raised:
        engine.step()  # the callback's cancel raised: that is the callback raising
    notes = "".join(raised.value.__notes__)
    assert "on_token of request 0 raised this" in notes and "raised too" not in notes
    assert engine.result(0).finish_reasons == ["error"]
    assert engine.result(1).finish_reasons == ["cancelled"] * 3
    assert not engine.is_busy
    assert_consistent(engine)


@pytest.mark.parametrize("side", ["executor", "reference"])
def test_a_lockstep_takes_an_observers_error_as_no_disagreement(side):
    expect = expected()
    lockstep = Lockstep(new_executor(), new_executor())
    engine = Engine(lockstep, DecodeFirstScheduler(24, 6, 8))
    submit(engine)
    getattr(lockstep, side).cache.add_observer(raising_on("seq_clone"))
    with pytest.raises(ObserverError):
        engine.step()  # the prompts and their forks
    assert lockstep.n_steps == 1
    for executor in (lockstep.executor, lockstep.reference):
        assert executor.sessions == sorted(engine._running) == [0, 1, 2, 3, 4]
        assert_whole(executor)
    while engine.is_busy:
        engine.step()
    for i in range(len(PROMPTS)):
        assert engine.result(i).tokens == expect[i]
    for executor in (lockstep.executor, lockstep.reference):
        assert executor.sessions == [] == executor.cache.live_seqs
