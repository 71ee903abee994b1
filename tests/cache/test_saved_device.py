"""Saved sequences on the device cache (docs/contract.md §13): states move between the
device cache and the reference with identical bytes; saving is one gather launch per layer
and one copy to the host, loading one copy to the device, one mirror launch and one
scatter per layer, all on the cache's stream (counted in the simulator); and a stateful
workload of steps, removals, saves and loads keeps the two caches equal, pool bytes and
mirror included."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numbakv.testing.launches as counting
from numbakv import CellCache
from numbakv.cache import saving
from numbakv.cache.cuda import IS_SIMULATOR
from numbakv.core.errors import AllocationError, CacheError
from numbakv.reference import CellCache as RefCache
from numbakv.serve.prefix import PrefixCache
from numbakv.testing import Op, run_script

from helpers import full_state, small_config, step_with

# one layer of each storage format: K and V of different formats in most of them
LAYER_DTYPES = (("float32", "q4_0"), ("float16", "fp8_e4m3"), ("bfloat16", "q8_0"),
                ("q8_0", "float16"), ("q4_0", "bfloat16"), ("fp8_e4m3", "float32"))  # fmt: skip
N_LAYERS = len(LAYER_DTYPES)


def config(**overrides):
    fields = dict(n_layers=N_LAYERS, windows=(0, 3) * 3, head_dim=32, layer_dtypes=LAYER_DTYPES,
                  fp8_scales=0.5, capacity=20, initial_cells=2, max_width=5)  # fmt: skip
    fields.update(overrides)
    return small_config(**fields)


def write_step(cache, seq_ids, seed: int) -> None:
    step = step_with(cache, seq_ids)
    rng = np.random.default_rng(seed)
    c = cache.config
    for layer in range(c.n_layers):
        k, v = (rng.standard_normal((step.width, c.n_kv_heads, c.head_dim)).astype(np.float32)
                for _ in range(2))  # fmt: skip
        cache.write(layer, k, v)


def test_states_cross_between_the_caches_byte_for_byte():
    device = CellCache(config())
    a, b = device.seq_new(), device.seq_new()
    write_step(device, [a, b, a, a, b], seed=1)
    device.seq_rm(b)
    write_step(device, [a, a, a], seed=2)  # into b's holes, then past them
    state = device.seq_save(a)
    reference = RefCache(config())
    reference.seq_new()
    write_step(reference, [0, 0], seed=3)
    copy = reference.seq_load(state)
    assert reference.seq_save(copy) == state
    back = device.seq_load(reference.seq_save(copy))
    assert device.seq_save(back) == state
    tail = device.seq_save(a, start=6)
    on_ref = reference.seq_load(tail, onto=copy)
    assert reference.seq_save(on_ref) == state
    device.check_invariants()


@pytest.mark.skipif(not IS_SIMULATOR, reason="counts the CUDA simulator's entry points")
def test_save_and_load_take_one_copy_and_a_launch_per_layer_on_the_cache_stream():
    cache = CellCache(config(capacity=32, initial_cells=32))
    a = cache.seq_new()
    write_step(cache, [a] * 5, seed=4)
    write_step(cache, [a] * 4, seed=5)
    stream = cache.stream
    with counting.count_device_calls() as calls:
        state = cache.seq_save(a)
    assert calls.counts == {"launches": N_LAYERS, "copies": 1, "allocations": 1,
                            "synchronizations": 1, "streams": 0, "events": 0}  # fmt: skip
    assert {call.name for call in calls.launches} == {"gather_rows"}
    assert all(call.stream is stream for call in calls.of("launches", "copies", "allocations"))
    with counting.count_device_calls() as calls:
        copy = cache.seq_load(state)
    assert calls.counts == {"launches": 1 + N_LAYERS, "copies": 1, "allocations": 1,
                            "synchronizations": 0, "streams": 0, "events": 0}  # fmt: skip
    assert [c.name for c in calls.launches] == ["prepare_tokens"] + ["scatter_rows"] * N_LAYERS
    assert not calls.on_default_stream()
    with counting.count_device_calls() as calls:
        cache.seq_load(cache.seq_save(a, start=3), onto=copy)  # the clone in the same launch
    assert calls.counts["launches"] == 2 * N_LAYERS + 1 and calls.counts["copies"] == 2


def test_convert_on_the_device_stores_what_the_reference_stores():
    source = RefCache(config(layer_dtypes=None, dtype="float32"))
    source.seq_new()
    write_step(source, [0] * 4, seed=6)
    state = source.seq_save(0)
    device, reference = CellCache(config()), RefCache(config())
    for cache in (device, reference):
        cache.seq_new()
        write_step(cache, [0, 0, 0], seed=7)
    assert device.seq_save(device.seq_load(state, convert=True)) == reference.seq_save(
        reference.seq_load(state, convert=True)
    )


OPS = st.lists(
    st.tuples(st.sampled_from(["step", "rm", "save", "tail", "new"]), st.integers(0, 2**16)),
    min_size=3,
    max_size=10,
)


@settings(max_examples=12)
@given(OPS)
def test_a_workload_of_saves_and_loads_keeps_the_caches_equal(ops):
    """Steps, removals, whole and partial saves loaded back (into fragmented pools, through
    growth, ids and cells running out): after every op both caches gave the same outcome
    and hold the same table, pool bytes and (device) mirror."""
    pairs = (("q4_0", "float16"), ("bfloat16", "fp8_e4m3"))
    c = config(n_layers=2, windows=(0, 2), layer_dtypes=pairs, capacity=12, max_seqs=3,
               max_width=4, initial_cells=1)  # fmt: skip
    caches = CellCache(c), RefCache(c)
    for verb, arg in ops:
        outcomes = [apply(cache, verb, arg) for cache in caches]
        assert outcomes[0] == outcomes[1], (verb, arg)
        device_state, reference_state = (held_state(cache) for cache in caches)
        assert device_state == reference_state
        caches[0].check_invariants()
        caches[1].check_invariants()


def held_state(cache) -> tuple:
    """The full state but the pool's unwritten rows (garbage on the device, zeros in the
    reference) and the device's mirror: the table, counts and the bytes of every held cell."""
    held = np.flatnonzero(cache.snapshot().pos >= 0)
    kv = [b"".join(x[held].tobytes() for x in cache.pool_kv(layer))
          for layer in range(cache.config.n_layers)]  # fmt: skip
    return (*full_state(cache)[:8], kv)


def apply(cache, verb: str, arg: int):
    """One op of the stateful workload on `cache`: its result or the error's class."""
    live = cache.live_seqs
    try:
        if verb == "new" or not live:
            return cache.seq_new()
        seq = live[arg % len(live)]
        if verb == "step":
            n = 1 + arg % cache.config.max_width
            write_step(cache, [seq] * min(n, max(cache.free_cells, 1)), seed=arg)
        elif verb == "rm":
            cache.seq_rm(seq)
        elif verb == "save":
            return cache.seq_load(cache.seq_save(seq))
        else:
            start = arg % (cache.pos(seq) + 1)
            return cache.seq_load(cache.seq_save(seq, start=start), onto=seq)
    except CacheError as error:
        return type(error).__name__
    return None


def test_a_reload_of_unwritten_cells_is_not_a_divergence():
    """A sequence reloaded while its step is prepared but unwritten copies cells whose K/V
    are undefined (garbage on the device, zeros in the reference): the kit treats the
    copies as unwritten too (found by a hostile review)."""
    c = small_config(n_layers=1, windows=(0,), capacity=8, max_width=4, max_seqs=3,
                     initial_cells=8)  # fmt: skip
    run_script(CellCache, c, [Op("seq_new"), Op("step", ((0, 0), None, 1, 1)),
                              Op("declare", ((0,),)), Op("prepare", (None,)),
                              Op("reload", (0, 0)), Op("step", ((1,), None, 1, 2))])  # fmt: skip


def test_a_refused_staging_allocation_is_an_allocation_error_and_eviction_goes_on(monkeypatch):
    """With no device memory to save in, seq_save raises AllocationError, changing nothing,
    and a prefix cache with a host tier still gives the cells back (without a copy)."""
    cache = CellCache(config(n_layers=1, windows=(0,), layer_dtypes=(("q8_0", "float16"),)))
    seq = cache.seq_new()
    write_step(cache, [seq] * 4, seed=11)
    prefix = PrefixCache(cache, host_bytes=10**6)
    prefix.insert(seq, [1, 2, 3, 4])
    before = full_state(cache)

    def refuse(*args, **kwargs):
        raise MemoryError("out of device memory")

    monkeypatch.setattr(saving.cuda, "device_array", refuse)
    with pytest.raises(AllocationError, match="staging"):
        cache.seq_save(seq)
    assert full_state(cache) == before
    assert prefix.evict(2) == 2 and prefix.host.n_states == 0 and cache.pos(seq) == 2
