"""Thread safety: `Engine` and `Executor` may be shared; several threads submit and cancel
while one steps, and every request ends with the tokens it gets alone."""

import sys
import threading

import numpy as np
import pytest

from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.sampling import Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler

from helpers import solo_generate, tiny_model

MODEL = tiny_model(seed=7)
N_THREADS, PER_THREAD = 4, 4
TIMEOUT = 20  # seconds a thread may take before the test calls it a hang


def new_executor(max_sessions=4) -> Executor:
    cache = CellCache(MODEL.config.cache_config(capacity=128, max_width=8, max_seqs=4))
    return Executor(MODEL, cache, max_sessions, 32)


def job(thread: int, k: int) -> tuple[list[int], int, Sampling]:
    """(prompt, max_new_tokens, sampling) of request k of submitting thread `thread`."""
    prompt = [(7 * thread + 3 * k + i) % 256 for i in range(1 + (thread + k) % 4)]
    return prompt, 2 + k % 2, Sampling(temperature=1.0, seed=thread * 10 + k)


@pytest.fixture
def often():
    """Threads switch every 10 microseconds: they interleave inside the engine's calls."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(interval)


def test_threads_submit_and_cancel_while_one_steps(often):
    engine = Engine(new_executor(), DecodeFirstScheduler(8, 4, 4))
    heard: dict[int, list[int]] = {}
    submitted: dict[int, tuple] = {}  # request -> its job
    cancelled: set[int] = set()
    start = threading.Barrier(N_THREADS + 1)
    n_done = []

    def submitter(thread: int) -> None:
        start.wait()
        for k in range(PER_THREAD):
            prompt, max_new, sampling = job(thread, k)
            tokens: list[int] = []
            request = engine.submit(
                prompt, max_new, sampling, on_token=lambda e, t=tokens: t.append(e.token)
            )
            heard[request], submitted[request] = tokens, (prompt, max_new, sampling)
            if k == 3 and engine.cancel(request):  # False when it finished already
                cancelled.add(request)
        n_done.append(thread)

    def stepper() -> None:
        start.wait()
        while len(n_done) < N_THREADS or engine.is_busy:
            engine.step()

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(N_THREADS)]
    threads.append(threading.Thread(target=stepper))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a thread hung"
    assert sorted(submitted) == list(range(N_THREADS * PER_THREAD))  # ids unique, none lost
    for request, (prompt, max_new, sampling) in submitted.items():
        done = engine.result(request)
        expect, _ = solo_generate(MODEL, prompt, max_new, sampling)
        assert done.tokens[0] == heard[request]  # every token was heard, in order
        if request in cancelled:
            assert done.finish_reasons == ["cancelled"]
            assert done.tokens[0] == expect[: len(done.tokens[0])]
        else:
            assert done.finish_reasons == ["length"] and done.tokens[0] == expect
    ex = engine.executor
    assert not engine.is_busy and ex.sessions == [] and ex.cache.used_cells == 0
    ex.cache.check_invariants()


def test_a_submit_waits_while_a_step_runs():
    engine = Engine(new_executor())
    seen: dict[str, object] = {}

    def on_token(event):  # runs inside the step, with the engine's lock held
        if "thread" in seen:
            return
        seen["thread"] = threading.Thread(target=lambda: seen.setdefault("id", engine.submit("b")))
        seen["thread"].start()
        seen["thread"].join(0.05)
        seen["waited"] = seen["thread"].is_alive() and "id" not in seen

    engine.submit("first", max_new_tokens=2, on_token=on_token)
    engine.step()
    seen["thread"].join(TIMEOUT)
    assert seen["waited"]  # the submit waited for the step to end
    assert seen["id"] == 1  # then it went through


def test_an_executor_serves_threads_one_call_at_a_time():
    ex = new_executor()
    forward = ex.model.forward
    inside = threading.Event()
    go_on = threading.Event()

    def slow_forward(*args):
        inside.set()
        go_on.wait(TIMEOUT)
        return forward(*args)

    session = ex.open_session()
    ex.model = type("Slow", (), {"forward": staticmethod(slow_forward), "config": MODEL.config})()
    runner = threading.Thread(target=lambda: ex.execute([Input(session, 0, [1, 2, 3])]))
    runner.start()
    assert inside.wait(TIMEOUT)
    opener = threading.Thread(target=ex.open_session)
    opener.start()
    opener.join(0.05)
    assert opener.is_alive()  # open_session waits for the batch
    go_on.set()
    for thread in (runner, opener):
        thread.join(TIMEOUT)
    assert ex.sessions == [0, 1] and ex.length(session) == 3
    ex.model = MODEL
    logits = ex.execute([Input(session, 3, [4])])[0].logits
    np.testing.assert_allclose(logits, solo_generate(MODEL, [1, 2, 3, 4], 1)[1][0], 1e-5, 1e-4)
