"""Observers that raise, and threads that share a cache, on both caches."""

import threading

import numpy as np
import pytest

from numbakv.core.arrays import as_host
from numbakv.core.errors import AllocationError, CacheError, ConfigError, ObserverError, StepError

from helpers import full_state, step_with


class Boom(RuntimeError):
    pass


def raising_on(event):
    def observer(cache, name, step):
        if name == event:
            raise Boom(name)

    return observer


@pytest.mark.parametrize("verb", ["seq_rm", "rewind", "seq_clone", "clear"])
def test_an_observer_that_raises_leaves_the_verb_complete(cache, verb):
    a = cache.seq_new()
    step_with(cache, [a, a, a])
    heard = []
    cache.add_observer(raising_on(verb))
    cache.add_observer(lambda c, event, step: heard.append(event))  # still hears of it
    call = {
        "seq_rm": lambda: cache.seq_rm(a),
        "rewind": lambda: cache.rewind(a, 1),
        "seq_clone": lambda: cache.seq_clone(a, 2),
        "clear": cache.clear,
    }[verb]
    with pytest.raises(ObserverError) as raised:
        call()
    assert isinstance(raised.value.__cause__, Boom) and raised.value.event == verb
    assert not isinstance(raised.value, CacheError)  # not a refusal: the change stands
    assert heard == [verb]
    cache.check_invariants()
    expected = {"seq_rm": [], "rewind": [a], "seq_clone": [a, 1], "clear": []}[verb]
    assert cache.live_seqs == expected
    if verb == "seq_clone":
        assert raised.value.result == 1 and cache.pos(1) == 2


def test_an_observer_raising_after_prepare_step_hands_over_the_step(cache):
    a = cache.seq_new()
    cache.add_observer(raising_on("prepare_step"))
    cache.declare_step([a, a])
    with pytest.raises(ObserverError) as raised:
        cache.prepare_step()
    step = raised.value.result
    assert step.positions.tolist() == [0, 1]
    k = np.ones((2, 1, 4), np.float32)
    cache.write(0, k, k)
    assert np.isfinite(np.asarray(cache.attend(0, np.ones((2, 2, 4), np.float32))[0])).all()


def test_a_refused_verb_tells_no_observer(cache):
    heard = []
    cache.add_observer(lambda c, event, step: heard.append(event))
    before = full_state(cache)
    with pytest.raises(CacheError):
        cache.seq_rm(0)
    with pytest.raises(StepError):
        cache.prepare_step()
    assert heard == [] and full_state(cache) == before


def test_an_observer_must_be_callable(cache):
    with pytest.raises(ConfigError, match="callable"):
        cache.add_observer("print")


def worker(cache, seed: int, n_ops: int, failures: list) -> None:
    """Random verbs on its own sequences; steps under the cache's lock. Tracks what its
    sequences must hold and checks it after every operation."""
    rng = np.random.default_rng(seed)
    mine: dict[int, int] = {}  # seq -> positions it must hold
    try:
        for _ in range(n_ops):
            op = rng.integers(0, 6)
            if op == 0 or not mine:
                try:
                    seq = cache.seq_new()
                except CacheError:  # every id live: another thread holds them
                    continue
                assert seq not in mine
                mine[seq] = 0
            elif op in (1, 2):
                seqs = [int(s) for s in rng.choice(list(mine), size=int(rng.integers(1, 4)))]
                with cache.lock:  # declare, prepare and write: one step, not interleaved
                    try:
                        step = step_with(cache, seqs)
                    except CacheError:  # full
                        continue
                    k = np.full((step.width, 1, 4), seed, np.float32)
                    cache.write(0, k, k)
                    out = np.asarray(as_host(cache.attend(0, np.ones((step.width, 2, 4)))))
                    assert np.allclose(out, seed, rtol=1e-5)  # a mean of its own values only
                for seq in seqs:
                    mine[seq] += 1
            elif op == 3:
                seq = int(rng.choice(list(mine)))
                mine[seq] = int(rng.integers(0, mine[seq] + 1))
                cache.rewind(seq, mine[seq])
            elif op == 4:
                seq = int(rng.choice(list(mine)))
                try:
                    clone = cache.seq_clone(seq)
                except CacheError:
                    continue
                assert clone not in mine
                mine[clone] = mine[seq]
            else:
                seq = int(rng.choice(list(mine)))
                cache.seq_rm(seq)
                del mine[seq]
            for seq, n in mine.items():
                assert cache.pos(seq) == n, (seq, n)
    except Exception as error:  # reported to the main thread
        failures.append(error)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_threads_sharing_a_cache_keep_it_consistent(impl, seed):
    cache = impl.cache(capacity=64, max_seqs=16, max_width=8)
    n_ops = 40 if impl.name == "device" else 100  # the simulator runs each kernel slowly
    failures: list = []
    threads = [
        threading.Thread(target=worker, args=(cache, 10 * seed + i, n_ops, failures))
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    checks = 0
    while any(thread.is_alive() for thread in threads):
        cache.check_invariants()  # between any two verbs of any thread
        checks += 1
    for thread in threads:
        thread.join()
    assert not failures, failures
    cache.check_invariants()
    assert checks >= 1


def test_a_table_that_cannot_be_allocated_is_an_allocation_error(impl, monkeypatch):
    # max_seqs 10**9 x max_seq_len 1 passes the config's bounds; its tables may not fit
    import numbakv.cache.cellcache as device_module
    import numbakv.reference.cache as reference_module

    def no_memory(config):
        raise MemoryError

    module, name = {
        "reference": (reference_module, "CellTable"),
        "device": (device_module, "HostTable"),
    }[impl.name]
    monkeypatch.setattr(module, name, no_memory)
    with pytest.raises(AllocationError, match="capacity or max_seqs"):
        impl.cache()
