"""Saved sequences in serving (docs/contract.md §13): an executor's sessions saved and loaded
(a `Lockstep` loads one state into both caches, a device state into the reference), and a
finished conversation carried by `Engine.save` / `Engine.load` to an engine in another
process, which hits all of it and samples what the first engine would have."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import numbakv
from numbakv.core.errors import CapacityError, ConfigError, SequenceError, StateError
from numbakv.core.seq_state import SeqState
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.host_tier import tail
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import Sampling

from helpers import tiny_model

MODEL = tiny_model(seed=5)
PROMPT = [int(t) for t in np.random.default_rng(2).integers(0, 256, 11)]
SAMPLING = Sampling(0.9, top_k=20, seed=3)
TESTS = Path(__file__).resolve().parents[1]


def executor(cache_type=CellCache, sessions=3, capacity=96) -> Executor:
    config = MODEL.config.cache_config(capacity=capacity, max_width=16, max_seqs=4)
    return Executor(MODEL, cache_type(config), sessions, 32)


def decode(ex, session: int, first: int, n: int) -> list[int]:
    """`n` tokens sampled one per batch, the first fed being `first`."""
    tokens = [first]
    for _ in range(n):
        [out] = ex.execute([Input(session, ex.length(session), tokens[-1:])])
        tokens.append(out.token)
    return tokens[1:]


def test_a_saved_session_loads_into_another_executor_and_samples_the_same():
    ex, other = executor(), executor()
    session = ex.open_session(SAMPLING)
    [out] = ex.execute([Input(session, 0, PROMPT)])
    state = ex.save_session(session)
    assert (state.start, state.end) == (0, len(PROMPT))
    loaded = other.load_session(state, sampling=SAMPLING, drawn=1)  # one token was sampled
    assert other.sessions == [loaded] and other.length(loaded) == len(PROMPT)
    assert other.save_session(loaded) == state
    assert decode(other, loaded, out.token, 4) == decode(ex, session, out.token, 4)
    tail_state = ex.save_session(session, 6)  # a tail loads onto a session holding 0 .. 5
    stem = other.clone(loaded, 6)
    again = other.load_session(tail_state, onto=stem)
    assert other.save_session(again, 6) == tail_state and other.length(again) == ex.length(session)


def test_load_session_refusals_change_nothing():
    ex = executor(sessions=2)
    state = ex.save_session(ex.execute([Input(ex.open_session(), 0, PROMPT)])[0].session, 3)
    with pytest.raises(SequenceError, match="not open"):
        ex.save_session(7)
    with pytest.raises(SequenceError, match="onto"):
        ex.load_session(state)  # from position 3: it needs onto=
    with pytest.raises(SequenceError, match="not open"):
        ex.load_session(state, onto=5)
    with pytest.raises(ConfigError, match="drawn"):
        ex.load_session(state, onto=0, drawn=-1)
    with pytest.raises(ConfigError, match="SeqState"):
        ex.load_session("state.npz")
    short = Executor(MODEL, CellCache(ex.cache.config), 2, 8)
    whole = ex.save_session(0)
    with pytest.raises(CapacityError, match="max_session_tokens=8"):
        short.load_session(whole)
    ex.open_session()
    with pytest.raises(CapacityError, match="sessions are open"):
        ex.load_session(whole)
    assert ex.sessions == [0, 1] and ex.length(1) == 0


def test_lockstep_loads_a_device_state_into_the_reference():
    device, reference = executor(numbakv.CellCache), executor()
    lockstep = Lockstep(device, reference)
    session = lockstep.open_session()
    [out] = lockstep.execute([Input(session, 0, PROMPT)])
    state = lockstep.save_session(session)
    assert state == device.save_session(session)
    loaded = lockstep.load_session(state)  # into both caches: the tables stay equal
    assert reference.save_session(loaded) == state
    assert decode(lockstep, loaded, out.token, 1) == decode(lockstep, session, out.token, 1)
    assert lockstep.cache.snapshot() == reference.cache.snapshot()


# -- Engine.save / Engine.load ---------------------------------------------------------


def chat_engine(capacity=128, host_bytes=None, prefix=True) -> Engine:
    config = MODEL.config.cache_config(capacity=capacity, max_width=16, max_seqs=8)
    ex = Executor(MODEL, CellCache(config), 6, 60, oversubscribe=True)
    return Engine(ex, prefix_cache=PrefixCache(ex, host_bytes=host_bytes) if prefix else None)


NEXT = [5, 6, 7]  # the next turn's message

CHILD = """
import json, sys
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.prefix import PrefixCache
from helpers import tiny_model
model = tiny_model(seed=5)
config = model.config.cache_config(capacity=128, max_width=16, max_seqs=8)
executor = Executor(model, CellCache(config), 6, 60, oversubscribe=True)
engine = Engine(executor, prefix_cache=PrefixCache(executor))
loaded = engine.load(sys.argv[1])
[done] = engine.generate([json.loads(sys.argv[2])], max_new_tokens=6)
print(json.dumps([loaded, done.metrics.n_cached_tokens, done.tokens[0]]))
"""


def test_a_saved_conversation_goes_on_in_a_new_process(tmp_path):
    first = chat_engine()
    [done] = first.generate([PROMPT], max_new_tokens=5)
    conversation = done.prompt + done.tokens[0][:-1]  # the last token was never fed
    path = tmp_path / "chat.npz"
    state = first.save(done.request_id, path)
    assert state.tokens.tolist() == conversation and state.n_tokens == len(conversation)
    assert SeqState.load(path) == state  # tokens and all
    prompt = done.prompt + done.tokens[0] + NEXT
    [expect] = first.generate([prompt], max_new_tokens=6)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), json.dumps(prompt)],
        capture_output=True, text=True, timeout=120, cwd=TESTS,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    loaded, cached, tokens = json.loads(child.stdout)
    assert loaded == len(conversation) == cached == expect.metrics.n_cached_tokens
    assert tokens == expect.tokens[0]


def test_a_loaded_state_is_hit_whole_in_the_same_process(tmp_path):
    first = chat_engine()
    [done] = first.generate([PROMPT], max_new_tokens=5)
    state = first.save(done.request_id, tmp_path / "chat.npz")
    second = chat_engine()
    assert second.load(state) == state.n_tokens
    prompt = done.prompt + done.tokens[0] + NEXT
    [got], [expect] = (e.generate([prompt], max_new_tokens=6) for e in (second, first))
    assert got.metrics.n_cached_tokens == state.n_tokens and got.tokens == expect.tokens
    assert second.metrics.n_computed_tokens == len(prompt) - state.n_tokens


def test_engine_save_refusals(tmp_path):
    path = tmp_path / "chat.npz"
    with pytest.raises(ConfigError, match="prefix_cache=PrefixCache"):
        chat_engine(prefix=False).save(0, path)
    e = chat_engine()
    with pytest.raises(ConfigError, match="no request 0"):
        e.save(0, path)
    waiting = e.submit(PROMPT, max_new_tokens=3)
    with pytest.raises(ConfigError, match="not finished"):
        e.save(waiting, path)
    e.step()
    with pytest.raises(ConfigError, match="running"):
        e.save(waiting, path)
    [salted] = e.generate([PROMPT], max_new_tokens=3, cache_salt="user")
    with pytest.raises(ConfigError, match="cache_salt='user'"):
        e.save(salted.request_id, path)
    cancelled = e.submit(PROMPT, max_new_tokens=3)
    e.cancel(cancelled)
    with pytest.raises(ConfigError, match="cancelled"):
        e.save(cancelled, path)
    while e.is_busy:
        e.step()
    e.drop_prefix_cache()
    with pytest.raises(CapacityError, match="keeps no copy"):
        e.save(waiting, path)
    assert not path.exists()


def test_an_evicted_conversation_is_saved_from_the_host_tier(tmp_path):
    e = chat_engine(host_bytes=10**6)
    [done] = e.generate([PROMPT], max_new_tokens=5)
    kept = e.save(done.request_id, tmp_path / "pool.npz")
    e.drop_prefix_cache()
    assert e.prefix_cache.n_cells == 0 and e.save(done.request_id, tmp_path / "host.npz") == kept


def test_engine_load_refusals(tmp_path):
    e = chat_engine()
    [done] = e.generate([PROMPT], max_new_tokens=5)
    state = e.save(done.request_id, tmp_path / "chat.npz")
    with pytest.raises(ConfigError, match="prefix_cache=PrefixCache"):
        chat_engine(prefix=False).load(state)
    with pytest.raises(StateError, match="no tokens"):
        chat_engine().load(tail(state, 0, state.n_tokens))
    with pytest.raises(StateError, match="starts at 4"):
        chat_engine().load(tail(state, 4, state.n_tokens))
    with pytest.raises(StateError):
        chat_engine().load(Path("/nonexistent/chat.npz"))
    config = MODEL.config.cache_config(capacity=8, max_width=8, max_seqs=2)
    small_executor = Executor(MODEL, CellCache(config), 1, 8)
    small = Engine(small_executor, prefix_cache=PrefixCache(small_executor))
    with pytest.raises(CapacityError, match="max_session_tokens=8"):
        small.load(state)
    assert small.prefix_cache.n_cells == 0 and small.executor.sessions == []
    config = MODEL.config.cache_config(capacity=24, max_width=16, max_seqs=4)
    busy_executor = Executor(MODEL, CellCache(config), 3, 24, oversubscribe=True)
    busy = Engine(busy_executor, prefix_cache=PrefixCache(busy_executor))
    busy.submit(list(range(16)), max_new_tokens=4)
    busy.step()  # a running request holds 16 of the 24 cells: none can be given back
    before = (busy.prefix_cache.n_cells, busy_executor.free_cells, busy_executor.sessions)
    with pytest.raises(CapacityError, match=f"no room for a conversation of {state.n_tokens}"):
        busy.load(state)
    assert (busy.prefix_cache.n_cells, busy_executor.free_cells, busy_executor.sessions) == before


def test_a_foreign_conversation_is_refused_before_anything_is_evicted(tmp_path):
    """Engine.load checks the state's geometry before it makes room: a file of another
    model leaves the prefix cache as it was (found by a hostile review)."""
    engine = chat_engine()
    [done] = engine.generate([PROMPT], max_new_tokens=5)
    state = engine.save(done.request_id, tmp_path / "chat.npz")
    other_model = tiny_model(seed=5, windows=(0, 3))
    config = other_model.config.cache_config(capacity=60, max_width=16, max_seqs=8)
    ex = Executor(other_model, CellCache(config), 6, 60, oversubscribe=True)
    other = Engine(ex, prefix_cache=PrefixCache(ex))
    other.generate([list(range(50))], max_new_tokens=3)
    before = (other.prefix_cache.n_cells, ex.free_cells, other.metrics.n_evicted_cells)
    with pytest.raises(ConfigError, match="windows"):
        other.load(state)
    assert (other.prefix_cache.n_cells, ex.free_cells, other.metrics.n_evicted_cells) == before
    bad = dataclasses.replace(state, tokens=np.full(state.end, -3, np.int64))
    with pytest.raises(StateError, match="token ids"):
        engine.load(bad)


def test_a_conversation_past_max_session_tokens_is_refused_before_anything_is_evicted(tmp_path):
    """Engine.load checks the state's length before it makes room (issue 45: a refusal
    after evicting 52 -> 15 cached cells)."""
    engine = chat_engine()
    [done] = engine.generate([PROMPT], max_new_tokens=5)
    state = engine.save(done.request_id, tmp_path / "chat.npz")
    config = MODEL.config.cache_config(capacity=24, max_width=16, max_seqs=8)
    ex = Executor(MODEL, CellCache(config), 6, state.end - 1, oversubscribe=True)
    short = Engine(ex, prefix_cache=PrefixCache(ex))
    short.generate([list(range(9)), list(range(20, 29))], max_new_tokens=3)
    before = (short.prefix_cache.n_cells, ex.free_cells, short.metrics.n_evicted_cells)
    assert before[1] < state.n_tokens <= before[0] + before[1]  # room only by evicting
    with pytest.raises(CapacityError, match=f"max_session_tokens={state.end - 1}"):
        short.load(state)
    assert (short.prefix_cache.n_cells, ex.free_cells, short.metrics.n_evicted_cells) == before


def test_a_request_waiting_for_cells_reloads_nothing_until_it_is_placed():
    """A request whose host-tier hit fits but whose other cells do not waits without
    reloading (and throwing away) its prefix every step (found by a hostile review)."""
    config = MODEL.config.cache_config(capacity=64, max_width=16, max_seqs=8)
    ex = Executor(MODEL, CellCache(config), 4, 60, oversubscribe=True)
    notes = []
    engine = Engine(ex, prefix_cache=PrefixCache(ex, host_bytes=10**7),
                    annotate=lambda kind, **data: notes.append(kind))  # fmt: skip
    rng = np.random.default_rng(0)
    [done] = engine.generate([[int(t) for t in rng.integers(0, 256, 20)]], max_new_tokens=5)
    conversation = done.prompt + done.tokens[0]
    engine.drop_prefix_cache()  # into the host tier
    engine.submit([int(t) for t in rng.integers(0, 256, 10)], max_new_tokens=45)
    for _ in range(12):
        engine.step()
    notes.clear()
    late = engine.submit(conversation + [int(t) for t in rng.integers(0, 256, 30)],
                         max_new_tokens=2)  # fmt: skip
    for _ in range(10):
        engine.step()
    assert not engine.result(late).tokens[0] and engine.metrics.n_reloads == 0
    assert "reload" not in notes
    engine.generate([], max_new_tokens=1)  # the rest runs: then it reloads once
    while engine.is_busy:
        engine.step()
    assert engine.metrics.n_reloads == 1 and engine.result(late).metrics.n_host_cached_tokens
