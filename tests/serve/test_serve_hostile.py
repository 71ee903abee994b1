"""Hostile arguments to the serving stack's public entry points: each is refused with a
numbakv error naming the bad value, and changes nothing ("snapshot, refused call, snapshot
equal"). Integers are `operator.index`-able non-bools; floats, strings, None, bools and
arrays of the wrong rank are refused wherever an integer or a token id is asked for."""

import copy

import numpy as np
import pytest

from numbakv.core.errors import CacheError, CapacityError, ConfigError, SequenceError, StepError
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.model import Model, ModelConfig
from numbakv.serve.sampling import GREEDY, Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler, Task
from numbakv.serve.tokenizer import ByteTokenizer

from helpers import full_state, solo_generate, stable_id, step_with, tiny_model

MODEL = tiny_model(seed=2)


def new_executor(max_sessions=4) -> Executor:
    cache = CellCache(MODEL.config.cache_config(capacity=128, max_width=8, max_seqs=4))
    return Executor(MODEL, cache, max_sessions, 32)


def executor_state(ex: Executor) -> tuple:
    """The cache (table, pool, storage), the open sessions, each one's position and
    generator state."""
    sessions = ex.sessions
    positions = [ex.length(s) for s in sessions]
    rngs = [ex._open.rng[s].bit_generator.state for s in sessions]
    return full_state(ex.cache), sessions, positions, rngs


def engine_state(engine: Engine) -> tuple:
    return (
        executor_state(engine.executor),
        len(engine._requests),
        [r.id for r in engine._waiting],
        sorted(engine._running),
        engine.scheduler.pending(),
        engine.n_steps,
    )


# -- Engine.submit ---------------------------------------------------------------------

SUBMIT_REFUSALS = [
    (dict(prompt=""), ConfigError, r"tokenizer.encode\(prompt\) is empty"),
    (dict(prompt=[]), ConfigError, "prompt is empty"),
    (dict(prompt=[1, True]), ConfigError, r"prompt\[1\] must be an integer.*True"),
    (dict(prompt=[1.0]), ConfigError, r"prompt\[0\] must be an integer.*1.0"),
    (dict(prompt=["1"]), ConfigError, r"prompt\[0\] must be an integer.*'1'"),
    (dict(prompt=[3, None]), ConfigError, r"prompt\[1\] must be an integer.*None"),
    (dict(prompt=[1, 256]), ConfigError, r"prompt\[1\] = 256 is outside .*\[0, 256\)"),
    (dict(prompt=[-1]), ConfigError, r"prompt\[0\] = -1 is outside"),
    (dict(prompt=[2**70]), ConfigError, "is outside the vocabulary"),
    (dict(prompt=[[1, 2]]), ConfigError, r"prompt\[0\] must be an integer"),
    (dict(prompt=b"hi"), ConfigError, "prompt must be token ids"),
    (dict(prompt={1, 2}), ConfigError, "prompt must be token ids"),
    (dict(prompt=iter([1, 2])), ConfigError, "prompt must be token ids"),
    (dict(prompt=5), ConfigError, "prompt must be token ids"),
    (dict(prompt=None), ConfigError, "prompt must be token ids"),
    (dict(prompt=np.array([[1, 2]])), ConfigError, r"shape \(1, 2\)"),
    (dict(prompt=np.array(7)), ConfigError, r"shape \(\)"),
    (dict(prompt=np.array([1.0, 2.0])), ConfigError, "dtype float64"),
    (dict(prompt=np.array([True])), ConfigError, "dtype bool"),
    (dict(prompt="x", max_new_tokens=0), ConfigError, "max_new_tokens=0 is below"),
    (dict(prompt="x", max_new_tokens=True), ConfigError, "max_new_tokens must be an integer"),
    (dict(prompt="x", max_new_tokens=2.0), ConfigError, "max_new_tokens must be an integer"),
    (dict(prompt="x", max_new_tokens="3"), ConfigError, "max_new_tokens must be an integer"),
    (dict(prompt="x", max_new_tokens=None), ConfigError, "max_new_tokens must be an integer"),
    (dict(prompt="x", max_new_tokens=np.array([3])), ConfigError, "max_new_tokens must be"),
    (dict(prompt="x", n=0), ConfigError, "n=0 is below"),
    (dict(prompt="x", n=True), ConfigError, "n must be an integer"),
    (dict(prompt="x", n=1.5), ConfigError, "n must be an integer"),
    (dict(prompt="x", n=5), CapacityError, "max_sessions=4; ask for n <= 4"),
    (dict(prompt="x", sampling="greedy"), ConfigError, "expected a Sampling"),
    (dict(prompt="x", sampling=None), ConfigError, "expected a Sampling"),
    (dict(prompt="x", sampling=Sampling), ConfigError, "expected a Sampling"),
    (dict(prompt="x", stop_tokens="a"), ConfigError, r"stop_tokens must be .*tokenizer.encode"),
    (dict(prompt="x", stop_tokens=5), ConfigError, r"stop_tokens must be .*e.g. \[2\]"),
    (dict(prompt="x", stop_tokens=object()), ConfigError, r"stop_tokens .*None for the model"),
    (dict(prompt="x", stop_tokens={1: 2}), ConfigError, "stop_tokens must be"),
    (dict(prompt="x", stop_tokens=[True]), ConfigError, "a stop token must be an integer"),
    (dict(prompt="x", stop_tokens=[1.0]), ConfigError, "a stop token must be an integer"),
    (dict(prompt="x", stop_tokens=[3, 256]), ConfigError, r"stop tokens \[256\] are outside"),
    (dict(prompt="x", stop_tokens=np.array(3)), ConfigError, r"shape \(\)"),
    (dict(prompt="x", on_token=5), ConfigError, "on_token must be a callable.*5"),
    (dict(prompt="x", on_token="print"), ConfigError, "on_token must be a callable"),
    (dict(prompt="x" * 30, max_new_tokens=3), CapacityError, "max_session_tokens=32"),
]


@pytest.mark.parametrize("kwargs, error, match", SUBMIT_REFUSALS, ids=stable_id)
def test_submit_refusals_change_nothing(kwargs, error, match):
    engine = Engine(new_executor())
    engine.submit("warm", max_new_tokens=4)
    engine.step()  # a session open, a decode queued
    before = engine_state(engine)
    with pytest.raises(error, match=match):
        engine.submit(**kwargs)
    assert engine_state(engine) == before
    assert engine.submit([1]) == 1  # no request id was used


def test_submit_takes_integers_of_any_kind_and_collections_of_stop_tokens():
    engine = Engine(new_executor())
    prompt = [np.int64(104), np.array(105), np.uint8(33)]
    first = engine.submit(prompt, max_new_tokens=np.int32(3), n=np.array(1))
    second = engine.submit(np.array([104, 105, 33], dtype=np.uint8), 3, stop_tokens={1, 2})
    third = engine.submit("hi!", 3, stop_tokens=np.array([7, 9]))
    while engine.is_busy:
        engine.step()
    expect = solo_generate(MODEL, [104, 105, 33], 3)[0]
    for request in (first, second, third):
        assert engine.result(request).prompt == [104, 105, 33]
        assert engine.result(request).tokens == [expect]  # the stop tokens are not sampled


class BadTokenizer(ByteTokenizer):
    def encode(self, text: str) -> list:
        return [1.5]


def test_a_tokenizer_that_returns_no_token_ids_is_refused():
    engine = Engine(new_executor(), tokenizer=BadTokenizer())
    with pytest.raises(ConfigError, match=r"tokenizer.encode\(prompt\)\[0\] must be an integer"):
        engine.submit("text")
    assert not engine.is_busy and engine.submit([1]) == 0


@pytest.mark.parametrize(
    "prompts, match",
    [(["ok", ""], "is empty"), (["ok", [1, 300]], "outside"), ("abc", "list of prompts")],
)
def test_generate_submits_all_or_none(prompts, match):
    engine = Engine(new_executor())
    before = engine_state(engine)
    with pytest.raises(ConfigError, match=match):
        engine.generate(prompts, max_new_tokens=2)
    assert engine_state(engine) == before


@pytest.mark.parametrize(
    "request_id, match",
    [(True, "request must be an integer"), (0.0, "request must be an integer"),
     ("0", "request must be an integer"), (None, "request must be an integer"),
     (7, "no request 7: 1 were submitted")],
)  # fmt: skip
def test_cancel_and_result_refuse_what_is_not_a_request_id(request_id, match):
    engine = Engine(new_executor())
    engine.submit("x", max_new_tokens=3)
    engine.step()
    before = engine_state(engine)
    for call in (engine.cancel, engine.result):
        with pytest.raises(ConfigError, match=match):
            call(request_id)
    assert engine_state(engine) == before


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(scheduler="decode first"), "DecodeFirstScheduler"), (dict(clock=5), "clock")],
)
def test_engine_construction_refusals(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Engine(new_executor(), **kwargs)


# -- Executor --------------------------------------------------------------------------

A, B = 0, 1  # the two sessions each executor test opens
EXECUTE_REFUSALS = [
    (Input(A, 0, [1]), StepError, "takes a list of Inputs"),
    (None, StepError, "takes a list of Inputs"),
    ("abc", StepError, "takes a list of Inputs"),
    ([(A, 0, [1])], StepError, "expected an Input"),
    ([Input(True, 0, [1])], SequenceError, "session must be an integer.*True"),
    ([Input(1.0, 0, [1])], SequenceError, "session must be an integer.*1.0"),
    ([Input("0", 0, [1])], SequenceError, "session must be an integer"),
    ([Input(None, 0, [1])], SequenceError, "session must be an integer"),
    ([Input(np.array([0]), 0, [1])], SequenceError, "session must be an integer"),
    ([Input(3, 0, [1])], SequenceError, r"session 3 is not open \(open: \[0, 1\]\)"),
    ([Input(A, True, [1])], ConfigError, "position must be an integer"),
    ([Input(A, 1.0, [1])], ConfigError, "position must be an integer"),
    ([Input(A, None, [1])], ConfigError, "position must be an integer"),
    ([Input(A, 0, [True])], StepError, r"session 0's tokens\[0\] must be an integer"),
    ([Input(A, 0, [1, 2.0])], StepError, r"tokens\[1\] must be an integer"),
    ([Input(A, 0, "ab")], StepError, "session 0's tokens must be token ids"),
    ([Input(A, 0, 5)], StepError, "session 0's tokens must be token ids"),
    ([Input(A, 0, np.array([[1]]))], StepError, r"shape \(1, 1\)"),
    ([Input(A, 0, np.array([1.0]))], StepError, "dtype float64"),
    ([Input(A, 0, [2**64])], StepError, "outside the vocabulary"),
    ([Input(A, 0, [1], sample="no")], StepError, "sample must be True or False"),
    ([Input(A, 0, [1], sample=None)], StepError, "sample must be True or False"),
    ([Input(A, 0, [1], forks=GREEDY)], StepError, "tuple of Sampling"),
    ([Input(A, 0, [1], forks=(None,))], StepError, "tuple of Sampling"),
    # a valid rewind of A first: it must not be applied either
    ([Input(A, 1, [1]), Input(B, 0, [True])], StepError, "session 1's tokens"),
    ([Input(A, 1, [1]), Input(B, 0.0, [1])], ConfigError, "position"),
]


@pytest.mark.parametrize("inputs, error, match", EXECUTE_REFUSALS, ids=stable_id)
def test_execute_refusals_change_nothing(inputs, error, match):
    ex = new_executor()
    a, b = ex.open_session(Sampling(temperature=1.0, seed=3)), ex.open_session()
    assert (a, b) == (A, B)
    ex.execute([Input(a, 0, [5, 6, 7]), Input(b, 0, [8])])
    before = executor_state(ex)
    with pytest.raises(error, match=match):
        ex.execute(inputs)
    assert executor_state(ex) == before


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda ex: ex.close_session(True), SequenceError, "session must be an integer"),
        (lambda ex: ex.close_session(1.0), SequenceError, "session must be an integer"),
        (lambda ex: ex.close_session(2), SequenceError, "not open"),
        (lambda ex: ex.length("0"), SequenceError, "session must be an integer"),
        (lambda ex: ex.clone(True), SequenceError, "session must be an integer"),
        (lambda ex: ex.clone(0, sampling="greedy"), ConfigError, "Sampling"),
        (lambda ex: ex.open_session(None), ConfigError, "Sampling"),
        (lambda ex: ex.sample(0, np.zeros(10, np.float32)), StepError, r"shape \(10,\)"),
        (lambda ex: ex.sample(0, np.zeros(256, np.int32)), StepError, "dtype int32"),
        (lambda ex: ex.sample(True, np.zeros(256, np.float32)), SequenceError, "integer"),
    ],
)
def test_session_calls_refuse_what_is_not_a_session(call, error, match):
    ex = new_executor()
    ex.open_session(Sampling(temperature=1.0, seed=3))
    ex.execute([Input(ex.open_session(), 0, [1, 2])])
    before = executor_state(ex)
    with pytest.raises(error, match=match):
        call(ex)
    assert executor_state(ex) == before


@pytest.mark.parametrize(
    "model, cache, match",
    [
        ("model", None, "has no config"),
        (MODEL, object(), "expected a cell cache"),
        (MODEL, "cache", "expected a cell cache"),
    ],
)
def test_executor_construction_refusals(model, cache, match):
    cache = cache or CellCache(MODEL.config.cache_config(capacity=64, max_width=8, max_seqs=2))
    with pytest.raises(ConfigError, match=match):
        Executor(model, cache, 2, 32)


@pytest.mark.parametrize(
    "args, match",
    [
        (("executor", None), "executor must be an Executor"),
        ((None, "reference"), "reference must be an Executor"),
        ((None, None, "0.1"), "rtol must be a real number"),
        ((None, None, -1.0), "rtol=-1.0 must be finite and >= 0"),
    ],
)
def test_lockstep_construction_refusals(args, match):
    args = tuple(new_executor() if a is None else a for a in args)
    with pytest.raises(ConfigError, match=match):
        Lockstep(*args)


# -- scheduler -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s: s.submit(Task(0, "decode", 1)), "list of Tasks"),
        (lambda s: s.submit(None), "list of Tasks"),
        (lambda s: s.submit([Task(True, "decode", 1)]), "session must be an integer"),
        (lambda s: s.submit([Task(0.0, "decode", 1)]), "session must be an integer"),
        (lambda s: s.submit([Task(0, "prefill", None)]), "n_tokens must be an integer"),
        (lambda s: s.submit([Task(0, "prefill", 2.0)]), "n_tokens must be an integer"),
        (lambda s: s.submit([Task(0, "refill", 1)]), "'decode' or 'prefill'"),
        (lambda s: s.cancel(True), "session must be an integer"),
        (lambda s: s.cancel(1.0), "session must be an integer"),
        (lambda s: s.pending("1"), "session must be an integer"),
    ],
)
def test_scheduler_refusals_change_nothing(call, match):
    sched = DecodeFirstScheduler(8, 2, 4)
    sched.submit([Task(1, "prefill", 6), Task(0, "decode", 1)])
    sched.next_batch()
    before = copy.deepcopy((sched._queues, sched._rotation, sched._n_arrived))
    with pytest.raises(ConfigError, match=match):
        call(sched)
    assert (sched._queues, sched._rotation, sched._n_arrived) == before


# -- model and sampling ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(windows=5), "windows must be a tuple"),
        (dict(windows="04"), "windows must be a tuple"),
        (dict(windows=(0, 2.0)), "window must be an integer"),
        (dict(windows=(True, 0)), "window must be an integer"),
        (dict(rope_theta="1e4"), "rope_theta must be a real number"),
        (dict(rope_theta=float("inf")), "finite"),
        (dict(norm_eps=None), "norm_eps must be a real number"),
        (dict(norm_eps=True), "norm_eps must be a real number"),
        (dict(d_model=True), "d_model must be an integer"),
        (dict(n_heads=4.0), "n_heads must be an integer"),
    ],
)
def test_model_config_refuses_what_is_not_a_number(fields, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**fields)


def bad_weights(name: str, value) -> dict:
    return dict(MODEL.weights) | {name: value}


@pytest.mark.parametrize(
    "config, weights, match",
    [
        ("config", dict(MODEL.weights), "expected a ModelConfig"),
        (MODEL.config, list(MODEL.weights.values()), "dict of name -> array"),
        (MODEL.config, bad_weights("embed", np.full((256, 16), "a")), "dtype <U1"),
        (MODEL.config, bad_weights("lm_head", np.ones((16, 256), complex)), "dtype complex"),
        (MODEL.config, bad_weights("embed", np.ones((256, 16), bool)), "dtype bool"),
        (MODEL.config, bad_weights("final_norm", np.full(16, np.nan)), "NaN or inf"),
        (MODEL.config, bad_weights("layers.0.wq", np.full((16, 16), 1e39)), "NaN or inf"),
    ],
)
def test_model_refuses_weights_that_are_not_finite_reals(config, weights, match):
    with pytest.raises(ConfigError, match=match):
        Model(config, weights)


@pytest.mark.parametrize(
    "tokens, logits_at, match",
    [
        ([True, 1], [0], r"tokens\[0\] must be an integer"),
        ([1.0, 1], [0], r"tokens\[0\] must be an integer"),
        ([1, 2], [0.5], "logits_at must be a list of ints"),
        ([1, 2], [[0]], "logits_at must be a list of ints"),
        ([1, 2], [2], r"must lie in \[0, step width=2\)"),
        ([1, 2], [-1], r"must lie in \[0, step width=2\)"),
    ],
)
def test_forward_refuses_tokens_and_logits_at_that_are_not_indices(tokens, logits_at, match):
    cache = CellCache(MODEL.config.cache_config(capacity=16, max_width=8, max_seqs=1))
    step = step_with(cache, [cache.seq_new()] * 2)
    with pytest.raises(StepError, match=match):
        MODEL.forward(cache, step, tokens, logits_at)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(temperature="1"), "temperature must be a real number"),
        (dict(temperature=True), "temperature must be a real number"),
        (dict(temperature=float("inf")), "finite"),
        (dict(top_p="0.5"), "top_p must be a real number"),
        (dict(top_p=None), "top_p must be a real number"),
        (dict(seed=1.0), "seed must be an integer"),
        (dict(top_k=None), "top_k must be an integer"),
    ],
)
def test_sampling_refuses_what_is_not_a_number(fields, match):
    with pytest.raises(ConfigError, match=match):
        Sampling(**fields)


def test_every_refusal_is_a_numbakv_error():
    assert all(issubclass(error, CacheError) for _, error, _ in SUBMIT_REFUSALS)
    assert all(issubclass(error, CacheError) for _, error, _ in EXECUTE_REFUSALS)
