"""`SessionExecutor`: `Executor` and `Lockstep` are both one; the engine needs nothing else
of an executor and serves the same tokens through either."""

from dataclasses import replace

import pytest

import numbakv
from numbakv.core.errors import ConfigError
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.protocol import SessionExecutor
from numbakv.serve.sampling import Sampling
from numbakv.serve.scheduler import DecodeFirstScheduler

from helpers import solo_generate, tiny_model

MODEL = tiny_model(seed=6)
MEMBERS = {
    "vocab_size",
    "max_width",
    "max_sessions",
    "max_session_tokens",
    "free_sessions",
    "open_session",
    "close_session",
    "execute",
}
SAMPLING = Sampling(temperature=0.8, top_k=30, seed=5)


def executor(max_sessions=4, model=MODEL) -> Executor:
    cache = CellCache(model.config.cache_config(capacity=128, max_width=8, max_seqs=4))
    return Executor(model, cache, max_sessions, 32)


class Only:
    """An executor seen through the protocol: its members and nothing else."""

    def __init__(self, executor, members=frozenset(MEMBERS)):
        self._executor, self._members = executor, members

    def __getattr__(self, name):
        if name not in self._members:
            raise AttributeError(f"{name} is not a SessionExecutor member")
        return getattr(self._executor, name)


def serve(ex) -> list[list[list[int]]]:
    """A workload of prompts chunked, decoded and forked; every request's tokens."""
    engine = Engine(ex, DecodeFirstScheduler(8, 3, 4))
    first = engine.submit("a prompt of some length", max_new_tokens=5, sampling=SAMPLING, n=3)
    engine.step()
    later = engine.submit([7, 8, 9], max_new_tokens=4)
    while engine.is_busy:
        engine.step()
    return [engine.result(r).tokens for r in (first, later)]


def test_the_protocol_has_the_members_the_engine_uses():
    assert {name for name in vars(SessionExecutor) if not name.startswith("_")} == MEMBERS
    for name in MEMBERS:
        assert getattr(SessionExecutor, name).__doc__, f"{name} has no docstring"
    assert numbakv.SessionExecutor is SessionExecutor


def test_executor_and_lockstep_are_session_executors():
    ex, lockstep = executor(), Lockstep(executor(), executor())
    assert isinstance(ex, SessionExecutor) and isinstance(lockstep, SessionExecutor)
    for name in ("vocab_size", "max_width", "max_sessions", "max_session_tokens"):
        assert getattr(lockstep, name) == getattr(ex, name)
    assert (ex.vocab_size, ex.max_width, ex.free_sessions) == (256, 8, 4)
    assert not isinstance(object(), SessionExecutor)
    assert not isinstance(Only(ex, MEMBERS - {"execute"}), SessionExecutor)


def test_the_engine_serves_the_same_tokens_through_either():
    plain, lockstep, only = executor(), Lockstep(executor(), executor()), Only(executor())
    got = [serve(ex) for ex in (plain, lockstep, only)]
    assert got[0] == got[1] == got[2]
    assert lockstep.n_steps > 0 and lockstep.max_logit_error == 0.0
    prompt = list(b"a prompt of some length")
    for i, tokens in enumerate(got[0][0]):
        expect, _ = solo_generate(MODEL, prompt, 5, replace(SAMPLING, seed=SAMPLING.seed + i))
        assert tokens == expect
    assert got[0][1] == [solo_generate(MODEL, [7, 8, 9], 4)[0]]


def test_the_engine_refuses_what_is_not_a_session_executor():
    with pytest.raises(ConfigError, match="SessionExecutor"):
        Engine(Only(executor(), MEMBERS - {"vocab_size"}))
    with pytest.raises(ConfigError, match="SessionExecutor"):
        Engine(executor().cache)
