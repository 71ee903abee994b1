"""The launch budget of a step (docs/contract.md §8.1), counted in the CUDA simulator
(`numbakv.testing.launches`) on the small cache of `benchmarks.launch_budget.bench` (2 layers
here, windows (0, 8)), by the rules of `benchmarks.launch_budget.rules`:

    declare_step + prepare_step  <= 1 copy, <= 1 launch, 0 allocations
    mask launches in the step    <= 1 with a masked attend or a mask() read, else 0
    each layer (write + attend)  <= 3 launches, 0 copies, 0 allocations, 0 synchronizations
                                 (K, V, q device arrays, `out=` a device array or none: then
                                 lent by the cache), NumPy K, V, q: 3 copies, 0 allocations
                                 (uploaded into lent arrays), once warm
    every launch and copy        on the step's stream: the one given to prepare_step, else
                                 the cache's own, never the legacy default stream
    a second identical step      the same launches: kernel, grid, block, device arrays

The tests of the counting harness itself come first.
"""

import itertools

import numpy as np
import pytest

import numbakv.testing.launches as counting
from benchmarks.launch_budget import bench as budget_bench
from benchmarks.launch_budget import rules
from numbakv.cache.cuda import IS_SIMULATOR, cuda

N_LAYERS = 2  # the simulator is slow: two layers still give two windows

pytestmark = pytest.mark.skipif(
    not IS_SIMULATOR, reason="counts the CUDA simulator's entry points (NUMBAKV_DEVICE=sim)"
)


@cuda.jit
def add_one(x):
    """x[i] += 1 for every i, grid-stride."""
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        x[i] += 1


# -- the counting harness -------------------------------------------------------------------


def test_two_launches_count_two_with_their_grids_and_streams():
    x_d = cuda.to_device(np.zeros(4, np.float32))
    with counting.count_device_calls() as calls:
        stream = cuda.stream()
        add_one[1, 4](x_d)
        add_one[(2,), (2, 1), stream](x_d)
    assert calls.counts == {
        "launches": 2, "copies": 0, "allocations": 0, "synchronizations": 0, "streams": 1,
        "events": 0,
    }  # fmt: skip
    first, second = calls.launches
    assert (first.name, first.grid, first.block, first.stream) == (
        "add_one",
        (1, 1, 1),
        (4, 1, 1),
        0,
    )
    assert (second.grid, second.block) == ((2, 1, 1), (2, 1, 1)) and second.stream is stream
    assert first.arrays == second.arrays and first.arrays[0][2:] == ((4,), (4,), "<f4")
    np.testing.assert_array_equal(x_d.copy_to_host(), [2, 2, 2, 2])


def test_device_function_calls_and_kernel_indexing_are_not_counted():
    x_d = cuda.to_device(np.zeros(3, np.float32))
    with counting.count_device_calls() as calls:
        add_one[1, 3](x_d)
    assert calls.log == [("launches", "add_one")]


def test_to_device_is_one_allocation_and_one_copy():
    x = np.arange(5, dtype=np.int32)
    with counting.count_device_calls() as calls:
        x_d = cuda.to_device(x)
    assert calls.log == [("allocations", "to_device"), ("copies", "to_device")]
    assert calls.calls[1].detail == "h2d"
    with counting.count_device_calls() as calls:
        cuda.to_device(x, to=x_d)  # into an existing array: a copy only
    assert calls.log == [("copies", "to_device")]


def test_allocations_copies_and_their_directions():
    x = np.ones((2, 3), np.float32)
    with counting.count_device_calls() as calls:
        stream = cuda.stream()
        a_d = cuda.device_array((2, 3), np.float32)
        b_d = cuda.device_array_like(a_d)  # one allocation, not two (it calls device_array)
        a_d.copy_to_device(x, stream=stream)
        b_d.copy_to_device(a_d)
        got = b_d.copy_to_host(stream=stream)
        b_d[0, 0] = 5.0  # one element from the host: a copy
        element = b_d[0, 0]  # and back
        b_d[:1].copy_to_host()  # a view, then a copy
    np.testing.assert_array_equal(got, x)
    assert element == 5.0
    assert calls.log == [
        ("streams", "stream"),
        ("allocations", "device_array"),
        ("allocations", "device_array_like"),
        ("copies", "copy_to_device"),
        ("copies", "copy_to_device"),
        ("copies", "copy_to_host"),
        ("copies", "setitem"),
        ("copies", "getitem"),
        ("copies", "copy_to_host"),
    ]
    copies = calls.of("copies")
    assert [c.detail for c in copies] == ["h2d", "d2d", "d2h", "h2d", "d2h", "d2h"]
    assert copies[0].stream is stream and copies[2].stream is stream
    assert [counting.is_default_stream(c.stream) for c in copies] == [False, True, False] + [
        True
    ] * 3


def test_a_launch_with_numpy_arguments_counts_the_simulators_transfers():
    x = np.zeros(4, np.float32)
    with counting.count_device_calls() as calls:
        add_one[1, 4](x)
    assert calls.log == [
        ("launches", "add_one"),
        ("allocations", "to_device"),
        ("copies", "to_device"),
        ("copies", "copy_to_host"),
    ]
    assert calls.launches[0].args[0][0] == "host"
    np.testing.assert_array_equal(x, 1)


def test_synchronizations_and_events():
    with counting.count_device_calls() as calls:
        stream = cuda.stream()
        event = cuda.event()
        event.record(stream)
        event.wait(stream)
        event.synchronize()
        stream.synchronize()
        with stream.auto_synchronize():
            pass
        cuda.synchronize()
    assert calls.of("synchronizations") == [
        counting.Call("synchronizations", "event.wait", stream),
        counting.Call("synchronizations", "event.synchronize"),
        counting.Call("synchronizations", "stream.synchronize", stream),
        counting.Call("synchronizations", "stream.auto_synchronize", stream),
        counting.Call("synchronizations", "synchronize"),
    ]
    assert calls.log[:3] == [("streams", "stream"), ("events", "event"), ("events", "event.record")]


def test_default_streams_are_told_from_made_streams():
    with counting.count_device_calls() as calls:
        made = cuda.stream()
        defaults = [cuda.default_stream(), cuda.legacy_default_stream()]
        defaults.append(cuda.per_thread_default_stream())
    assert [c.name for c in calls.of("streams")] == [
        "stream", "default_stream", "legacy_default_stream", "per_thread_default_stream"
    ]  # fmt: skip
    assert [c.stream for c in calls.of("streams")] == [made, *defaults]
    assert all(counting.is_default_stream(s) for s in [0, None, *defaults])
    assert not counting.is_default_stream(made) and counting.stream_kind(made) == "stream"
    assert counting.stream_kind(cuda.stream()) == "unknown"  # made while no counter was active
    assert isinstance(made, cuda.stream) and isinstance(defaults[0], cuda.stream)


def test_the_patches_are_restored_even_after_an_error_and_blocks_nest():
    before = counting.entry_points()
    with pytest.raises(KeyError, match="inside"), counting.count_device_calls() as outer:
        during = counting.entry_points()
        with counting.count_device_calls() as inner:
            cuda.device_array(3, np.float32)
        assert counting.entry_points() == during  # the inner block left the patches on
        cuda.device_array(3, np.float32)
        raise KeyError("an error inside the block")
    after = counting.entry_points()
    assert [name for name in before if after[name] is not before[name]] == []
    assert after.keys() == before.keys()
    assert any(during[name] is not before[name] for name in before)  # it did patch
    assert (inner["allocations"], outer["allocations"]) == (1, 2)
    with counting.count_device_calls() as idle:
        pass
    cuda.device_array(3, np.float32)  # outside any block: nobody counts it
    assert idle.log == []


def test_counting_is_deterministic():
    x_d = cuda.to_device(np.zeros(8, np.int32))

    def work():
        with counting.count_device_calls() as calls:
            add_one[1, 8](x_d)
            x_d[2:4].copy_to_device(np.ones(2, np.int32))
            x_d.copy_to_host()
        return calls

    first, second = work(), work()
    assert first.log == second.log and first.launches == second.launches
    assert [c.detail for c in first.of("copies")] == [c.detail for c in second.of("copies")]


def test_counting_needs_the_simulator(monkeypatch):
    import numba  # after numbakv.cache.cuda, which chose the simulator before importing it

    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 0)
    with pytest.raises(RuntimeError, match="NUMBAKV_DEVICE=sim"), counting.count_device_calls():
        pass


# -- the budget of a step ------------------------------------------------------------------

CASES = list(rules.CASES)


@pytest.fixture(scope="module")
def bench():
    return budget_bench.build(n_layers=N_LAYERS)


@pytest.fixture(scope="module")
def measured(bench) -> dict:
    """Every case of launch_budget, measured once, in order."""
    return {case: bench.measure(case) for case in CASES}


def explain(calls) -> str:
    """The calls, one a line: category, name, stream, and a launch's grid and block."""
    lines = ["calls:"]
    for c in calls.calls:
        shape = f" grid={c.detail.grid} block={c.detail.block}" if c.category == "launches" else ""
        direction = f" {c.detail}" if c.category == "copies" else ""
        lines.append(f"{c.category} {c.name} stream={calls.label(c.stream)}{shape}{direction}")
    return "\n  ".join(lines)


def test_the_cache_takes_a_stream_and_out(bench):
    assert bench.takes_stream, "prepare_step(width=None, *, stream=None) takes no stream"
    assert bench.takes_out, "attend(layer, q, scale=None, mode=..., *, out=None) takes no out"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_prepare_step_is_one_copy_one_launch_no_allocation(measured, case):
    prepare = measured[case].prepare
    assert rules.non_mask_launches(prepare) <= rules.PREPARE_LAUNCHES, explain(prepare)
    assert prepare["copies"] <= rules.PREPARE_COPIES, explain(prepare)
    assert prepare["allocations"] == 0, explain(prepare)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_step_launches_one_mask_kernel_only_when_it_needs_a_mask(measured, case):
    m = measured[case]
    most = rules.STEP_MASK_LAUNCHES if case.has_mask_work else 0
    assert m.mask_launches <= most, explain(m.calls)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_a_layer_is_three_launches_and_nothing_else(measured, case):
    for layer, calls in enumerate(measured[case].layers):
        got = (
            rules.non_mask_launches(calls) <= rules.LAYER_LAUNCHES,
            calls["copies"], calls["allocations"], calls["synchronizations"],
        )  # fmt: skip
        copies = rules.HOST_LAYER_COPIES if case.inputs == "host" else 0
        assert got == (True, copies, 0, 0), f"layer {layer}: " + explain(calls)


@pytest.mark.parametrize("case", [c for c in CASES if c.read_mask], ids=lambda case: case.name)
def test_reading_a_mask_copies_it_back_and_allocates_nothing(measured, case):
    read = measured[case].mask_read
    assert read["copies"] <= rules.MASK_READ_COPIES and read["allocations"] == 0, explain(read)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_launch_budget_script_agrees(measured, case):
    assert measured[case].breaches() == []


def test_host_inputs_cross_the_bus_in_each_layer(bench):
    # NumPy K, V and q are uploaded by write and attend, each copy host to device
    m = bench.measure(rules.Case("decode", "gathered", "host"))
    for calls in m.layers:
        assert [c.detail for c in calls.of("copies")] == ["h2d"] * 3, explain(m.calls)


def test_lent_arrays_are_made_once_a_kind_and_never_while_held(bench):
    cache, held = bench.cache, []
    seq = cache.seq_new()  # width 1: a kind of block no other step used
    k, v, q = bench.host_inputs(1)
    made = []
    for _ in range(2):
        with counting.count_device_calls() as calls:
            cache.declare_step([seq])
            cache.prepare_step()
            marks = [calls.mark()]
            for layer in range(N_LAYERS):
                cache.write(layer, k, v)
                held.append(cache.attend(layer, q))  # a result held is never lent again
                marks.append(calls.mark())
        made.append([calls.since(a, b)["allocations"] for a, b in itertools.pairwise(marks)])
        held.clear()  # the step's results dropped: their blocks go back
    # step 1, layer 0: K, V (one kind), q, out (one kind): 4 blocks; layer 1: its out only
    assert made == [[4, 1], [0, 0]]


# a masked decode with mask() read: the step's launches, its lazy mask and the copy back
STREAM_CASE = rules.Case("decode", "masked", read_mask=True)


def test_a_step_runs_on_the_caches_own_stream(bench):
    m = bench.measure(STREAM_CASE)
    streams = m.calls.streams()
    assert m.calls.on_default_stream() == [], explain(m.calls)
    assert [m.stream_name(s) for s in streams] == ["own"], explain(m.calls)
    assert counting.stream_kind(streams[0]) == "stream"  # made with cuda.stream()


def test_a_step_runs_on_the_stream_given_to_prepare_step(bench):
    assert bench.takes_stream, "prepare_step takes no stream"
    with counting.count_device_calls():
        stream = cuda.stream()
    m = bench.measure(STREAM_CASE, stream=stream)
    elsewhere = [c for c in m.calls.of("launches", "copies") if c.stream is not stream]
    assert elsewhere == [], f"{len(elsewhere)} not on the given stream; " + explain(m.calls)


@pytest.mark.parametrize("shape", ["decode", "prefill"])
def test_a_second_identical_step_makes_the_same_launches(bench, shape):
    case = rules.Case(shape, "gathered")
    seq_ids = bench.seq_ids(shape)  # the same tokens of the same sequences, twice
    first, second = bench.measure(case, seq_ids=seq_ids), bench.measure(case, seq_ids=seq_ids)
    assert len(first.replay_keys) == len(second.replay_keys)
    for i, (a, b) in enumerate(zip(first.replay_keys, second.replay_keys, strict=True)):
        moved = [x for x, y in zip(a[3], b[3], strict=False) if x != y]
        assert a == b, f"launch {i} ({a[0]}): grid, block {a[1:3]} then {b[1:3]}; moved {moved}"


def test_reserve_makes_the_workspace_so_the_first_decode_attend_allocates_nothing():
    from numbakv import CellCache
    from numbakv.cache.cuda import cuda
    from numbakv.core.errors import StepError

    cfg = budget_bench.build(2).cache.config
    for reserved in (False, True):
        cache = CellCache(cfg)
        seqs = [cache.seq_new() for _ in range(2)]
        if reserved:
            before = cache.bindings()
            with counting.count_device_calls() as made:
                cache.reserve(4)
            assert made["allocations"] == 3  # part_acc, part_m, part_l: once
            cache.check_bindings(before)  # a new workspace invalidates nothing recorded
        cache.declare_step(seqs)
        step = cache.prepare_step()
        k = cuda.to_device(np.zeros((step.width, cfg.n_kv_heads, cfg.head_dim), np.float32))
        q = cuda.to_device(np.zeros((step.width, 4, cfg.head_dim), np.float32))
        out = cuda.device_array(q.shape, np.float32)
        cache.write(0, k, k)
        with counting.count_device_calls() as calls:
            cache.attend(0, q, out=out)
        assert calls["allocations"] == (0 if reserved else 3)
    for bad, named in ((3, "n_heads=3"), (0, "n_heads=0"), (True, "n_heads"), (2.0, "n_heads")):
        with pytest.raises(StepError, match=named):
            cache.reserve(bad)
