"""Faults in user code: an `on_token` callback that raises ends its own request with
"error", never costs another request a token, never leaves bookkeeping half-done and never
hangs `step`, `stream` or `generate`. Each faulty run is compared with the same run whose
callbacks do not raise (same prompts, same seeds)."""

import itertools

import pytest

from numbakv.core.errors import StepError
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.sampling import Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler
from numbakv.serve.tokenizer import encode

from helpers import solo_generate, tiny_model

MODEL = tiny_model(seed=4)
PROMPTS = ["before", "faulty", "after"]  # the faulty request sits between two others
MAX_STEPS = 50  # far more than any run here takes: more is a hang


class Boom(Exception):
    """What the faulty callbacks raise."""


def new_engine(max_sessions=6) -> Engine:
    cache = CellCache(MODEL.config.cache_config(capacity=192, max_width=8, max_seqs=8))
    return Engine(Executor(MODEL, cache, max_sessions, 32), DecodeFirstScheduler(24, 6, 8))


def sampling(i: int) -> Sampling:
    return Sampling(temperature=1.0, top_k=40, seed=10 * i)


def listener(heard: list, raise_on: tuple[int, int] | None = None):
    """An on_token that keeps every event in `heard` and raises `Boom` on the event of
    (sample, token index) `raise_on`."""

    def on_token(event):
        heard.append(event)
        index = sum(e.sample == event.sample for e in heard) - 1
        if (event.sample, index) == raise_on:
            raise Boom(f"sample {event.sample}, token {index}")

    return on_token


def submit_all(engine: Engine, raise_on: dict, n=(1, 1, 1), max_new_tokens=5) -> list[list]:
    """Submits PROMPTS (request i with n[i] samples); returns what each callback heard."""
    heard = [[] for _ in PROMPTS]
    for i, prompt in enumerate(PROMPTS):
        on_token = listener(heard[i], raise_on.get(i))
        engine.submit(prompt, max_new_tokens, sampling(i), n=n[i], on_token=on_token)
    return heard


def run_to_end(engine: Engine) -> int:
    """Steps until idle (a hang fails); returns how many steps raised `Boom`."""
    n_raised = 0
    for _ in range(MAX_STEPS):
        if not engine.is_busy:
            return n_raised
        try:
            engine.step()
        except Boom:
            n_raised += 1
            assert_consistent(engine)
    raise AssertionError(f"the engine is still busy after {MAX_STEPS} steps")


def expected_tokens(n=(1, 1, 1), max_new_tokens=5) -> list[list[list[int]]]:
    """Every request's tokens in a run whose callbacks never raise."""
    engine = new_engine()
    submit_all(engine, {}, n, max_new_tokens)
    assert run_to_end(engine) == 0
    return [engine.result(i).tokens for i in range(len(PROMPTS))]


def assert_consistent(engine: Engine) -> None:
    """The engine's running samples are exactly the executor's sessions and the cache's
    sequences (none leaked, none lost); queued work is only theirs; the table holds."""
    ex = engine.executor
    running = sorted(engine._running)
    assert running == ex.sessions == ex.cache.live_seqs
    assert all(engine.scheduler.pending(s) == 0 for s in range(8) if s not in running)
    assert engine.is_busy == bool(engine._waiting or running)
    assert ex.cache.used_cells <= sum(ex.length(s) for s in running)
    ex.cache.check_invariants()


def test_a_raising_callback_ends_its_request_and_the_rest_of_the_batch_goes_on():
    expect = expected_tokens()
    engine = new_engine()
    heard = submit_all(engine, {1: (0, 1)})  # request 1 raises on its second token
    engine.step()  # the three prompts
    with pytest.raises(Boom) as raised:
        engine.step()  # the three first decodes: all bookkept before request 1's callback
    assert "on_token of request 1 raised this" in "".join(raised.value.__notes__)
    faulty = engine.result(1)
    assert faulty.finish_reasons == ["error"] and faulty.tokens == [expect[1][0][:2]]
    for other in (0, 2):  # before and after the faulty one in the batch: nothing lost
        assert engine.result(other).tokens == [expect[other][0][:2]]
        assert [e.token for e in heard[other]] == expect[other][0][:2]
    assert_consistent(engine)
    assert sorted(engine._running) == [0, 2]  # request 1's session is closed
    assert run_to_end(engine) == 0  # it hears nothing more, so raises no more
    for other in (0, 2):
        done = engine.result(other)
        assert done.tokens == expect[other] and done.finish_reasons == ["length"]
    assert len(heard[1]) == 2 and not engine.is_busy
    assert engine.executor.cache.used_cells == 0 and engine.executor.sessions == []


@pytest.mark.parametrize("raise_on", [(0, 0), (1, 0), (2, 0), (2, 2)])
def test_a_fault_on_one_of_three_samples_ends_all_three(raise_on):
    n = (1, 3, 1)
    expect = expected_tokens(n)
    engine = new_engine()
    heard = submit_all(engine, {1: raise_on}, n)
    assert run_to_end(engine) == 1
    done = engine.result(1)
    assert done.finish_reasons == ["error"] * 3
    n_tokens = raise_on[1] + 1  # the three samples decode in the same steps
    assert done.tokens == [tokens[:n_tokens] for tokens in expect[1]]
    last = [(e.sample, e.token) for e in heard[1]][-1]  # the event that raised is its last
    assert last == (raise_on[0], expect[1][raise_on[0]][raise_on[1]])
    for other in (0, 2):
        assert engine.result(other).tokens == expect[other]
    assert engine._admission.reserved() == 0 and not engine.is_busy
    assert engine.executor.sessions == [] and engine.executor.cache.used_cells == 0


def test_several_callbacks_raise_in_one_step_the_first_propagates():
    expect = expected_tokens()
    engine = new_engine()
    submit_all(engine, {0: (0, 2), 2: (0, 2)})
    for _ in range(2):
        engine.step()
    with pytest.raises(Boom, match="sample 0, token 2") as raised:
        engine.step()
    notes = "".join(raised.value.__notes__)
    assert "on_token of request 0 raised this" in notes and "requests [2] raised too" in notes
    for request, reason in ((0, "error"), (1, None), (2, "error")):
        assert engine.result(request).finish_reasons == [reason]
        assert engine.result(request).tokens == [expect[request][0][:3]]
    assert run_to_end(engine) == 0
    assert engine.result(1).tokens == expect[1]


def test_a_fault_on_the_last_token_keeps_the_finish_reason():
    expect = expected_tokens(max_new_tokens=2)
    engine = new_engine()
    submit_all(engine, {1: (0, 1)}, max_new_tokens=2)
    assert run_to_end(engine) == 1
    # nothing was cut short: the sample had ended before its callback ran
    assert engine.result(1).finish_reasons == ["length"]
    assert [engine.result(i).tokens for i in range(3)] == expect


def test_stream_yields_the_faulty_step_then_raises_and_resumes():
    expect = expected_tokens()
    engine = new_engine()
    submit_all(engine, {1: (0, 1)})
    streamed = []
    with pytest.raises(Boom):
        for event in itertools.islice(engine.stream(), MAX_STEPS):
            streamed.append(event)
    assert len(streamed) == 6  # two steps of three tokens, the faulty step's included
    streamed += list(itertools.islice(engine.stream(), MAX_STEPS))  # it ends, with the others
    assert not engine.is_busy
    for request in range(3):
        tokens = [e.token for e in streamed if e.request_id == request]
        assert tokens == engine.result(request).tokens[0]
        assert tokens == expect[request][0][: len(tokens)]
    assert len(streamed) == 2 + 5 + 5


def test_generate_raises_and_cancels_only_its_own_requests():
    expect = expected_tokens()
    engine = new_engine()
    outside = engine.submit(PROMPTS[0], 5, sampling(0))
    heard = []

    def on_token(event):
        heard.append(event)
        if event.request_id == 1:
            raise Boom("request 1")

    with pytest.raises(Boom):
        engine.generate(PROMPTS[1:], 5, sampling(1), on_token=on_token)
    assert engine.result(1).finish_reasons == ["error"]
    assert engine.result(2).finish_reasons == ["cancelled"]  # nobody holds its id
    assert engine.result(2).tokens[0] == [e.token for e in heard if e.request_id == 2]
    assert engine.result(1).tokens == [expect[1][0][:1]]
    assert_consistent(engine)
    assert sorted(engine._running) == [0]  # the outside request goes on
    run_to_end(engine)
    assert engine.result(outside).tokens == expect[0]


def test_generate_finishes_its_requests_when_another_requests_callback_raises():
    engine = new_engine()
    clean = [engine.generate(PROMPTS[1:], 5, sampling(1))[i].tokens for i in range(2)]
    engine = new_engine()
    outside = engine.submit(PROMPTS[0], 5, sampling(0), on_token=listener([], (0, 1)))
    with pytest.raises(Boom) as raised:
        engine.generate(PROMPTS[1:], 5, sampling(1))
    assert "generate() finished its requests [1, 2] first" in "".join(raised.value.__notes__)
    assert engine.result(outside).finish_reasons == ["error"]
    for i in (1, 2):  # not cancelled: they got every token of the fault-free run
        assert engine.result(i).tokens == clean[i - 1]
        assert engine.result(i).finish_reasons == ["length"]
    assert_consistent(engine)
    assert not engine.is_busy
    # an interrupt is no fault of another request: generate stops at once
    engine.submit(PROMPTS[0], 5, sampling(0), on_token=interrupt_on_first_token)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(PROMPTS[1:], 5, sampling(1))
    assert [engine.result(i).finish_reasons for i in (4, 5)] == [["cancelled"]] * 2
    assert_consistent(engine)


def interrupt_on_first_token(event):
    raise KeyboardInterrupt


def test_callbacks_may_submit_and_cancel_but_not_step():
    engine = new_engine()
    later = []

    def cancel_and_submit(event):
        if event.finish_reason is None and not later:
            engine.cancel(2)
            later.append(engine.submit("later", max_new_tokens=3))

    def steps(event):
        engine.step()

    engine.submit(PROMPTS[0], 4, on_token=cancel_and_submit)
    engine.submit(PROMPTS[1], 4, on_token=steps)
    engine.submit(PROMPTS[2], 4)
    with pytest.raises(StepError, match="from an on_token callback"):
        engine.step()
    assert [engine.result(i).finish_reasons for i in range(3)] == [
        [None],
        ["error"],
        ["cancelled"],
    ]
    assert_consistent(engine)
    run_to_end(engine)
    assert engine.result(0).tokens == [solo_generate(MODEL, encode(PROMPTS[0]), 4)[0]]
    assert engine.result(later[0]).tokens == [solo_generate(MODEL, encode("later"), 3)[0]]


def test_a_keyboard_interrupt_in_a_callback_still_completes_the_step():
    expect = expected_tokens()
    engine = new_engine()

    def interrupt(event):
        raise KeyboardInterrupt

    engine.submit(PROMPTS[0], 5, sampling(0))
    engine.submit(PROMPTS[1], 5, sampling(1), on_token=interrupt)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    assert engine.result(1).finish_reasons == ["error"]
    assert_consistent(engine)
    run_to_end(engine)
    assert engine.result(0).tokens == expect[0]
