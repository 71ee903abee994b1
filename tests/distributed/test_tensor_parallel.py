"""Tensor-parallel serving on two gloo ranks of the CPU (docs/contract.md §15.2): tp=2
serves the tokens tp=1 serves, logits within float32's tolerance, with 1, 2 and 4 KV
heads (replicated at 1), the NumPy model over the reference cache and the device model
over the device cache (in lockstep with it); both ranks' tables
stay equal over a random 2 000-call workload with refusals; a planted divergence is
named at the next digest; a rank that dies or stalls ends the other with an error."""

import os
import time

import numpy as np
import pytest

pytest.importorskip("torch")

from numbakv.core.errors import ConfigError, SequenceError, StateError
from numbakv.distributed.group import Group, backend, init, table_digest
from numbakv.distributed.tensor_parallel import TensorParallel, serve, shard_heads, shard_model
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import LOGITS_RTOL, Lockstep
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import Sampling

from helpers import tiny_model
from ranks import on_ranks

PROMPTS = ["tensor parallel", "tensor parallel serving", "two ranks, one table"]
SAMPLINGS = [None, Sampling(0.8, top_p=0.9, seed=7), Sampling(1.0, top_k=20, seed=3)]


def executor_of(model, device: bool, capacity: int = 256) -> Executor | Lockstep:
    """An executor of `model` over the reference cache, or a Lockstep of the device
    model's over the device cache against it."""
    config = model.config.cache_config(capacity=capacity, max_width=16, max_seqs=8)
    reference = Executor(model, CellCache(config), 4, 64)
    if not device:
        return reference
    from numbakv.cache.cellcache import CellCache as DeviceCache
    from numbakv.device_model.model import DeviceModel

    return Lockstep(Executor(DeviceModel(model, config), DeviceCache(config), 4, 64), reference)


def generate(executor, close=None) -> tuple[list, int]:
    """Every prompt's tokens and logits, served by an engine whose prefix cache keeps 4
    cells and offloads the rest to a host tier; then the second prompt again, which
    reloads its prefix from the host tier: (completions, tokens reloaded)."""
    prefix = PrefixCache(executor, max_cells=4, host_bytes=1 << 20)
    engine = Engine(executor, prefix_cache=prefix)
    logits: dict[int, list] = {}
    ids = []
    for prompts, samplings in ((PROMPTS, SAMPLINGS), ([PROMPTS[1] + "!"], [None])):
        ids += [
            engine.submit(p, max_new_tokens=6, sampling=s or Sampling(), n=1 + (p == PROMPTS[1]),
                          on_token=lambda e: logits.setdefault(e.request_id, []).append(e.logits))
            for p, s in zip(prompts, samplings, strict=True)
        ]  # fmt: skip
        while engine.is_busy:
            engine.step()
    if close is not None:
        close()
    completions = [(engine.result(i).tokens, logits[i]) for i in ids]
    return completions, engine.metrics.n_host_cached_tokens


def tp_serving(group, n_kv_heads: int, device: bool):
    """Rank 0: the completions, the capacity agreed; other ranks: their table's digest."""
    shard = shard_model(tiny_model(seed=3, n_kv_heads=n_kv_heads), group)
    capacity = group.agreed_min(256 + 64 * group.rank)  # the ranks propose apart
    executor = executor_of(shard, device, capacity)
    if group.rank:
        serve(executor, group)
        return table_digest(executor.cache), capacity
    tp = TensorParallel(executor, group)
    return generate(tp, tp.close), table_digest(executor.cache), capacity


@pytest.mark.parametrize("device", [False, True], ids=["reference", "device"])
def test_tp2_serves_the_tokens_of_tp1(device):
    """Three KV-head counts in one pair of ranks: 4 and 2 split, 1 replicated; a host tier
    offloads and reloads a prefix (saved and loaded states of every head)."""
    results = on_ranks(tp_each, device)
    for n_kv_heads, (rank0, rank1) in zip((4, 2, 1), zip(*results, strict=True), strict=True):
        (completions, reloaded), digest, capacity = rank0
        assert rank1 == (digest, 256) and capacity == 256, rank1
        alone, want_reloaded = generate(
            executor_of(tiny_model(seed=3, n_kv_heads=n_kv_heads), False)
        )
        assert reloaded == want_reloaded > 0  # the host tier's hit, loaded on every rank
        for (tokens, logits), (want, want_logits) in zip(completions, alone, strict=True):
            assert tokens == want, n_kv_heads
            for got, expect in zip(logits, want_logits, strict=True):
                scale = max(1.0, float(np.abs(expect).max()))
                assert np.abs(got - expect).max() / scale <= LOGITS_RTOL


def tp_each(group, device: bool) -> list:
    return [tp_serving(group, n, device) for n in (4, 2, 1)]


def random_calls(group, n_calls: int, seed: int):
    """A random workload of calls through TensorParallel, refusals among them; every rank
    returns its final snapshot's arrays and the calls it saw."""
    executor = executor_of(shard_model(tiny_model(seed=1), group), False)
    if group.rank:
        n = serve(executor, group)
        return table_digest(executor.cache), n
    tp, rng, refused = TensorParallel(executor, group), np.random.default_rng(seed), 0
    for _ in range(n_calls):
        sessions = executor.sessions
        kind = rng.choice(["open", "execute", "execute", "clone", "rewind", "close"])
        try:
            if kind == "open" or not sessions:
                tp.open_session()
                continue
            s = int(rng.choice(sessions))
            length = executor.length(s)
            if kind == "execute":
                start = int(rng.integers(0, length + 2))  # past the end: refused
                tokens = rng.integers(0, 256, int(rng.integers(1, 6))).tolist()
                tp.execute([Input(s, start, tokens)])
            elif kind == "clone":
                tp.clone(s, int(rng.integers(0, length + 2)))
            elif kind == "rewind":
                tp.rewind(s, int(rng.integers(0, length + 2)))
            else:
                tp.close_session(s)
        except (ConfigError, SequenceError) as error:
            refused += 1
            assert "CapacityError" not in type(error).__name__
        except Exception as error:  # full: a session or the cells
            refused += 1
            assert type(error).__name__ in ("CapacityError", "StepError"), error
    tp.close()
    return table_digest(executor.cache), refused


def test_both_ranks_hold_one_table_over_2000_random_calls():
    (digest0, refused), (digest1, served) = on_ranks(random_calls, 2000, 11, limit=300)
    assert digest0 == digest1 and served == 2000 and 100 < refused < 1500


class Planted:
    """Rank 1's executor, with its table altered after batch `at` (a sequence cloned
    behind the executor's back), or the rank killed or stalled at batch `at`."""

    def __init__(self, executor, at: int, how: str):
        self.executor, self.at, self.how, self.n = executor, at, how, 0

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def execute(self, inputs):
        if self.n == self.at and self.how == "die":
            os._exit(1)
        if self.n == self.at and self.how == "stall":
            time.sleep(120)
        out = self.executor.execute(inputs)
        if self.n == self.at and self.how == "diverge":
            self.executor.cache.seq_clone(inputs[0].session)
        self.n += 1
        return out


def faulty(group, how: str):
    executor = executor_of(shard_model(tiny_model(seed=2), group), False)
    if group.rank:
        serve(Planted(executor, 3, how), group)
        return "served"
    tp = TensorParallel(executor, group)
    session = tp.open_session()
    start = time.monotonic()
    for i in range(8):
        start = time.monotonic()
        tp.execute([Input(session, i * 2, [1 + i, 2 + i])])
    return "no error", time.monotonic() - start


@pytest.mark.parametrize("how", ["diverge", "die", "stall"])
def test_a_divergence_a_dead_rank_and_a_stalled_one_end_both_with_an_error(how):
    start = time.monotonic()
    results = on_ranks(faulty, how, timeout=4)
    assert time.monotonic() - start < 60
    kind, message = results[0]
    assert kind == "DistributedError", message
    if how == "diverge":
        assert results[1][0] == "DistributedError"
        for _, text in results:
            assert "after batch 3, rank 1's cell table is not rank 0's" in text
            assert "cell 0: pos 0, owners [0, 1] on rank 1; pos 0, owners [0] on rank 0" in text
    else:
        assert "rank 0 of 2: all_reduce failed" in message
        assert results[1] is None or how == "stall"


def test_heads_are_split_and_replicated_as_vllm_does():
    assert shard_heads(8, 4, 1, 2) == (range(4, 8), range(2, 4))
    assert shard_heads(8, 2, 3, 4) == (range(6, 8), range(1, 2))  # KV head 1 on ranks 2, 3
    assert shard_heads(4, 1, 1, 2) == (range(2, 4), range(0, 1))
    for bad in ((6, 2, 0, 4), (8, 4, 0, 3), (12, 4, 0, 6)):
        with pytest.raises(ConfigError, match="cannot split"):
            shard_heads(*bad)
    for bad, match in [((4, 2, 0, 0), "world=0"), ((4, 0, 0, 2), "n_kv_heads=0"),
                       ((4.0, 2, 0, 2), "n_heads"), ((4, 2, 2, 2), "rank=2 is not below"),
                       ((4, 2, -1, 2), "rank=-1"), ((4, 2, 0, True), "world")]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            shard_heads(*bad)


@pytest.mark.parametrize(
    ("timeout", "match"), [(0.0, "0.1, 1e6"), (1e300, "1e6"), ("5", "timeout")]
)
def test_a_bad_timeout_is_refused_before_anything(timeout, match):
    with pytest.raises(ConfigError, match=match):
        init(timeout=timeout)


def test_the_cpu_meets_on_gloo_and_cuda_tensors_on_nccl():
    assert (backend(False), backend(True)) == ("gloo", "cpu:gloo,cuda:nccl")


def test_peers_and_parts_are_checked_before_any_collective():
    group = Rank(0)
    for rank, match in [(0, "not 0"), (2, r"in \[0, 2\)"), ("1", "dst"), (-1, "dst=-1")]:
        with pytest.raises(ConfigError, match=match):
            group.send("x", rank)
    with pytest.raises(ConfigError, match="an Executor or a Lockstep"):
        TensorParallel("foo", group)
    with pytest.raises(ConfigError, match=r"a numbakv\.distributed Group"):
        TensorParallel(executor_of(tiny_model(seed=1), False), None)


def decode_step_counts(group) -> dict:
    """The collectives of one decode step of 3 sessions (after their prefill), by kind."""
    executor = executor_of(shard_model(tiny_model(seed=1), group), False)
    if group.rank:
        serve(executor, group)
        return {}
    tp = TensorParallel(executor, group)
    sessions = [tp.open_session() for _ in range(3)]
    tp.execute([Input(s, 0, [1, 2, 3]) for s in sessions])
    before = {kind: list(count) for kind, count in group.counts.items()}
    tp.execute([Input(s, 3, [4]) for s in sessions])
    after = {kind: list(count) for kind, count in group.counts.items()}
    tp.close()
    return {k: (n - before.get(k, [0, 0])[0], b - before.get(k, [0, 0])[1])
            for k, (n, b) in after.items()}  # fmt: skip


def test_a_decode_step_costs_one_broadcast_two_all_reduces_a_layer_and_a_digest():
    counts, _ = on_ranks(decode_step_counts)
    width, d_model, n_layers = 3, 16, 2
    assert counts["all_reduce"] == (2 * n_layers, 2 * n_layers * width * d_model * 4)
    assert counts["broadcast"][0] == 1 and counts["all_gather"][0] == 1
    assert set(counts) == {"broadcast", "all_reduce", "all_gather"}


class Rank(Group):
    """A stand-in group of which only the rank is read."""

    def __init__(self, rank: int):
        self.rank, self.world = rank, 2


def test_tensor_parallel_reads_rank_0s_executor_and_says_what_it_does_not_serve():
    executor = executor_of(tiny_model(seed=1), False)
    tp = TensorParallel(executor, Rank(0))
    assert (tp.vocab_size, tp.max_width, tp.cache) == (256, 16, executor.cache)
    for name, why in [("sample", "on rank 0 alone")]:
        with pytest.raises(AttributeError, match=why):
            getattr(tp, name)
    with pytest.raises(ConfigError, match="rank 1 runs serve"):
        TensorParallel(executor, Rank(1))
    with pytest.raises(ConfigError, match="rank 0 schedules"):
        serve(executor, Rank(0))


def tp_saving(group, n_kv_heads: int, folder: str):
    """Rank 0: a session's state saved under tp (every KV head), loaded back as a new
    session, that session's next token and logits; the refusals of states that are no
    state or of another head count, met on rank 0 before anything moves; and a
    conversation saved by the engine, dropped and loaded again (`Engine.load`)."""
    executor = executor_of(shard_model(tiny_model(seed=3, n_kv_heads=n_kv_heads), group), False)
    if group.rank:
        serve(executor, group)
        return table_digest(executor.cache)
    tp = TensorParallel(executor, group)
    refusals = []
    other = executor_of(tiny_model(seed=3, n_kv_heads=4), False)
    s = other.open_session()
    other.execute([Input(s, 0, [1, 2, 3])])
    for bad in ("not a state", other.save_session(s)):
        try:
            tp.load_session(bad)
        except (ConfigError, StateError) as error:
            refusals.append(f"{type(error).__name__}: {error}")
    engine = Engine(tp, prefix_cache=PrefixCache(tp))
    [done] = engine.generate(["a conversation to keep"], max_new_tokens=2)
    engine.save(done.request_id, f"{folder}/chat.npz")
    engine.drop_prefix_cache()
    n_loaded = engine.load(f"{folder}/chat.npz")
    [again] = engine.generate(["a conversation to keep, again"], max_new_tokens=1)
    result = saving(tp)  # closes it
    return (
        *result,
        refusals,
        n_loaded,
        again.metrics.n_cached_tokens,
        table_digest(executor.cache),
    )


def saving(front):
    s = front.open_session()
    front.execute([Input(s, 0, [3, 1, 4, 1, 5, 9, 2, 6])])
    state = front.save_session(s)
    [out] = front.execute([Input(front.load_session(state), 8, [5])])
    if isinstance(front, TensorParallel):
        front.close()
    return state, out.token, out.logits


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_a_state_saved_under_tp_holds_every_head_and_loads_anywhere(n_kv_heads, tmp_path):
    """Saved on two ranks (each its heads; at 1 KV head both hold it), it is the state one
    process saves, within float32's tolerance, and loads back on the ranks alike; so does
    the engine's saved conversation; a state of another head count is refused."""
    rank0, digest1 = on_ranks(tp_saving, n_kv_heads, str(tmp_path))
    state, token, logits, refusals, n_loaded, n_cached, digest0 = rank0
    assert digest0 == digest1
    assert refusals == [
        "StateError: expected a SeqState, got str",
        f"ConfigError: the state has n_kv_heads=4; this model has {n_kv_heads} (every rank's "
        "heads together)",
    ]
    assert n_loaded == len("a conversation to keep") + 1 and n_cached == n_loaded - 1
    alone_executor = executor_of(tiny_model(seed=3, n_kv_heads=n_kv_heads), False)
    want, want_token, want_logits = saving(alone_executor)
    assert state.geometry == want.geometry and state.n_tokens == want.n_tokens == 8
    for got, expect in zip(state.k + state.v, want.k + want.v, strict=True):
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    assert token == want_token
    np.testing.assert_allclose(logits, want_logits, rtol=LOGITS_RTOL, atol=LOGITS_RTOL)
    alone_executor.load_session(state)  # a tp state loads into one process
