"""Captured steps (`CellCache.capture`, `StepGraph.replay`): a decode step's per-layer work
kept once and replayed for any later mix of sequences, bit for bit the eager run, until the
pool grows (BindingError: recapture). On the simulator the graph is recorded launches; on a
GPU the same test runs a CUDA graph (`test_a_cuda_graph_replays_like_recorded_launches`)."""

from dataclasses import replace

import numpy as np
import pytest

import numbakv
from numbakv.cache.cuda import IS_SIMULATOR, MODE, cuda
from numbakv.core.errors import BindingError, StepError
from numbakv.reference import CellCache as RefCache

from helpers import assert_close, full_state

WIDTH, N_HEADS = 3, 2  # small: each simulated attention launch costs ~0.1 s
CONFIG = numbakv.CacheConfig(
    n_layers=2, n_kv_heads=1, head_dim=8, windows=(0, 3), capacity=64, max_width=WIDTH,
    max_seqs=5, max_seq_len=12, initial_cells=4,
)  # fmt: skip
MODES = ("gathered", "masked")  # layer 0 gathered, layer 1 masked: the graph writes the masks


class Inputs:
    """The fixed device arrays a captured step reads and writes: the caller's buffers."""

    def __init__(self):
        kv = (WIDTH, CONFIG.n_kv_heads, CONFIG.head_dim)
        self.k, self.v = (cuda.to_device(np.zeros(kv, np.float32)) for _ in range(2))
        self.q = cuda.to_device(np.zeros((WIDTH, N_HEADS, CONFIG.head_dim), np.float32))
        self.out = [cuda.device_array(self.q.shape, np.float32) for _ in MODES]

    def fill(self, cache, k, v, q) -> None:
        for array, x in ((self.k, k), (self.v, v), (self.q, q)):
            array.copy_to_device(x, stream=cache.stream)

    def work(self, cache) -> None:
        for layer, mode in enumerate(MODES):
            cache.write(layer, self.k, self.v)
            cache.attend(layer, self.q, mode=mode, out=self.out[layer])

    def outputs(self) -> list[np.ndarray]:
        return [out.copy_to_host() for out in self.out]


def verb(caches, rng) -> None:
    """One random verb on every cache alike: new, clone (random upto), rewind, rm."""
    live = caches[0].live_seqs
    roll = rng.random()
    if roll < 0.3 and len(live) < CONFIG.max_seqs:
        if live and roll < 0.15:
            src = int(rng.choice(live))
            upto = int(rng.integers(0, caches[0].pos(src) + 1))
            for c in caches:
                c.seq_clone(src, upto)
        else:
            for c in caches:
                c.seq_new()
    elif roll < 0.45 and live:
        seq = int(rng.choice(live))
        position = int(rng.integers(0, caches[0].pos(seq) + 1))
        for c in caches:
            c.rewind(seq, position)
    elif roll < 0.55 and len(live) > 1:
        seq = int(rng.choice(live))
        for c in caches:
            c.seq_rm(seq)


def decode_ids(cache, rng) -> list[int]:
    """One token for each of up to WIDTH of the live sequences, in a random order."""
    live = cache.live_seqs
    return [int(s) for s in rng.choice(live, size=min(WIDTH, len(live)), replace=False)]


def test_replayed_steps_equal_the_eager_run_and_the_reference():
    """50 decode steps over changing mixes of sequences (new, removed, cloned, rewound),
    through growths: the captured cache replays, an identical cache runs each step eagerly
    (bit for bit the same), and the reference checks every step."""
    rng = np.random.default_rng(7)
    replayed, eager, ref = numbakv.CellCache(CONFIG), numbakv.CellCache(CONFIG), RefCache(CONFIG)
    caches = (replayed, eager, ref)
    captured, twin = Inputs(), Inputs()
    replayed.reserve(N_HEADS)
    graph, captures, replays, generations = None, 0, 0, set()
    for i in range(50):
        verb(caches, rng)
        for seq in replayed.live_seqs:  # room for one more token
            if replayed.pos(seq) >= CONFIG.max_seq_len:
                position = int(rng.integers(0, CONFIG.max_seq_len))
                for c in caches:
                    c.rewind(seq, position)
        if not replayed.live_seqs:
            for c in caches:
                c.seq_new()
        ids = decode_ids(replayed, rng)
        k, v = rng.standard_normal((2, WIDTH, CONFIG.n_kv_heads, CONFIG.head_dim), np.float32)
        q = rng.standard_normal((WIDTH, N_HEADS, CONFIG.head_dim), np.float32)
        for c in caches:
            c.declare_step(ids)
            c.prepare_step(WIDTH)
        captured.fill(replayed, k, v, q)
        twin.fill(eager, k, v, q)
        if graph is None or graph.bindings.generation != replayed.generation:
            graph = replayed.capture(lambda: captured.work(replayed))
            captures += 1
        else:
            graph.replay()
            replays += 1
        generations.add(replayed.generation)
        twin.work(eager)
        got = captured.outputs()
        assert all(map(np.array_equal, got, twin.outputs())), (i, ids)
        for layer, mode in enumerate(MODES):
            ref.write(layer, k, v)
            oracle = ref.attend(layer, q, mode=mode)
            assert_close(got[layer], oracle)
        assert replayed.snapshot() == ref.snapshot() == eager.snapshot()
    assert replayed.growth_count >= 2 and captures == len(generations) and replays >= 40


def started(cache, ids=(0, 0, 1)):
    """A cache with two sequences and a prepared step of WIDTH (padded) rows."""
    while len(cache.live_seqs) < 2:
        cache.seq_new()
    cache.declare_step(list(ids))
    return cache.prepare_step(WIDTH)


def test_replay_after_growth_raises_binding_error_and_a_recapture_works():
    cache, inputs = numbakv.CellCache(CONFIG), Inputs()
    cache.reserve(N_HEADS)
    started(cache)
    graph = cache.capture(lambda: inputs.work(cache))
    assert graph.n_launches == 2 + 1 + 2  # 2 scatters, 1 mask launch, 2 attends (1 split: no merge)
    assert (graph.width, graph.layers, graph.writes_masks) == (WIDTH, {0, 1}, True)
    while cache.generation == graph.bindings.generation:
        started(cache, [0, 1, 1])
    with pytest.raises(BindingError, match="pool grew"):
        graph.replay()
    again = cache.capture(lambda: inputs.work(cache))
    started(cache, [1])
    again.replay()
    assert cache.attend(0, np.zeros((WIDTH, N_HEADS, CONFIG.head_dim))).shape[0] == WIDTH


def test_replay_refuses_a_stale_or_missing_step_or_another_width():
    cache, inputs = numbakv.CellCache(replace(CONFIG, initial_cells=32)), Inputs()
    cache.reserve(N_HEADS)
    started(cache)
    graph = cache.capture(lambda: inputs.work(cache))
    cache.rewind(0, 1)  # the step is stale
    with pytest.raises(StepError, match="no prepared step"):
        graph.replay()
    cache.declare_step([0, 1])
    cache.prepare_step()  # width 2, not WIDTH
    before = full_state(cache)
    with pytest.raises(StepError, match=f"width 2; this graph was captured at width {WIDTH}"):
        graph.replay()
    assert full_state(cache) == before
    started(cache)
    graph.replay()  # a step of the graph's width: it runs


@pytest.mark.skipif(not IS_SIMULATOR, reason="counts the CUDA simulator's entry points")
def test_a_replay_makes_the_captured_launches_and_nothing_else():
    from numbakv.testing import launches as counting

    cache, inputs = numbakv.CellCache(replace(CONFIG, initial_cells=32)), Inputs()
    cache.reserve(N_HEADS)
    started(cache)
    with counting.count_device_calls() as captured:
        graph = cache.capture(lambda: inputs.work(cache))
    step = started(cache, [1, 0])
    with counting.count_device_calls() as replayed:
        graph.replay()
    assert len(replayed.launches) == len(captured.launches) == graph.n_launches
    assert [launch.name for launch in replayed.launches] == [
        launch.name for launch in captured.launches
    ]
    assert all(launch.stream is step.stream for launch in replayed.launches)
    counts = replayed.counts
    assert counts["copies"] == counts["allocations"] == counts["synchronizations"] == 0


REFUSED_IN_FN = {  # what fn does -> what the StepError says
    "host k": ("write(0, host array, v)", "device arrays only"),
    "no out": ("attend(0, q) without out=", "needs out="),
    "unreserved": ("decode attend before reserve", "reserve"),
    "a verb": ("seq_new()", r"seq_new\(\) inside capture\(fn\)"),
    "a host copy": ("step.mask(3)", r"read_mask\(\) inside capture\(fn\)"),
    "a reserve": ("reserve(8)", r"reserve\(\) inside capture\(fn\)"),
    "a replay": ("another graph's replay()", r"replay\(\) inside capture\(fn\)"),
    "another cache": ("another cache's write", "another cache's capture"),
}


@pytest.mark.parametrize("case", [*REFUSED_IN_FN, "used step"])
def test_capture_refuses_what_a_graph_cannot_hold_and_changes_nothing(case):
    roomy = replace(CONFIG, initial_cells=32)  # no growth in this test
    cache, inputs, other = numbakv.CellCache(roomy), Inputs(), numbakv.CellCache(roomy)
    if case != "unreserved":
        cache.reserve(N_HEADS)
    other.reserve(N_HEADS)
    started(other)
    other_graph = other.capture(lambda: Inputs().work(other))
    started(other)
    step = started(cache)
    work = {
        "host k": lambda: cache.write(0, np.zeros(inputs.k.shape), inputs.v),
        "no out": lambda: (cache.write(0, inputs.k, inputs.v), cache.attend(0, inputs.q)),
        "unreserved": lambda: inputs.work(cache),
        "used step": lambda: inputs.work(cache),
        "a verb": cache.seq_new,
        "a host copy": lambda: step.mask(3),
        "a reserve": lambda: cache.reserve(8),
        "a replay": other_graph.replay,
        "another cache": lambda: other.write(0, inputs.k, inputs.v),
    }[case]
    if case == "used step":
        cache.write(0, inputs.k, inputs.v)
    before, other_before = full_state(cache), full_state(other)
    match = "fresh step" if case == "used step" else REFUSED_IN_FN[case][1]
    with pytest.raises(StepError, match=match):
        cache.capture(work)
    assert not step.is_stale and full_state(other) == other_before
    if case not in ("no out", "unreserved"):  # those wrote layer 0 (ran: the simulator)
        assert full_state(cache) == before
    if case != "unreserved":
        inputs.work(cache)  # the step is still usable
        other_graph.replay()  # and so is the other cache's graph


@pytest.mark.skipif(MODE != "gpu", reason="CUDA graphs need a GPU; the simulator twin is above")
def test_a_cuda_graph_replays_like_recorded_launches():
    rng = np.random.default_rng(1)
    caches = [numbakv.CellCache(CONFIG) for _ in range(2)]
    inputs = [Inputs() for _ in caches]
    graphs = [None, None]
    for i, backend in ((1, "record"), (0, "graph")):  # every kernel runs before the capture
        cache, x = caches[i], inputs[i]
        cache.reserve(N_HEADS)
        started(cache)
        graphs[i] = cache.capture(lambda c=cache, x=x: x.work(c), backend=backend)
    assert graphs[0].kind == "CUDA graph" and graphs[1].kind == "recorded launches"
    for _ in range(5):
        k, v = rng.standard_normal((2, WIDTH, CONFIG.n_kv_heads, CONFIG.head_dim), np.float32)
        q = rng.standard_normal((WIDTH, N_HEADS, CONFIG.head_dim), np.float32)
        for cache, x, graph in zip(caches, inputs, graphs, strict=True):
            started(cache, [0, 1, 1])
            x.fill(cache, k, v, q)
            graph.replay()
        for a, b in zip(inputs[0].outputs(), inputs[1].outputs(), strict=True):
            assert np.array_equal(a, b)


def test_a_captured_step_replays_over_quantized_pools():
    """Layer 0 K q8_0 / V q4_0 (gathered), layer 1 fp8 with per-head scales (masked): 6 decode
    steps replayed bit for bit as the eager run, the reference's within float32 rounding."""
    formats = (("q8_0", "q4_0"), "fp8_e4m3")
    scales = [[[1.0, 1.0], [1.0, 1.0]], [[0.5, 2.0], [0.25, 4.0]]]
    config = replace(CONFIG, head_dim=32, n_kv_heads=2, initial_cells=32, layer_dtypes=formats,
                     fp8_scales=scales)  # fmt: skip
    replayed, eager, ref = (cls(config) for cls in (numbakv.CellCache, numbakv.CellCache, RefCache))
    n_heads, rng = 4, np.random.default_rng(11)
    kv = (WIDTH, config.n_kv_heads, config.head_dim)
    shapes = (kv, kv, (WIDTH, n_heads, 32))
    inputs = [[cuda.to_device(np.zeros(shape, np.float32)) for shape in shapes] for _ in "re"]
    outs = [[cuda.device_array((WIDTH, n_heads, 32), np.float32) for _ in MODES] for _ in range(2)]

    def work(cache, i):
        k, v, q = inputs[i]
        for layer, mode in enumerate(MODES):
            cache.write(layer, k, v)
            cache.attend(layer, q, mode=mode, out=outs[i][layer])

    for c in (replayed, eager, ref):
        for _ in range(3):
            c.seq_new()
    replayed.reserve(n_heads)
    replayed.declare_step([0, 1, 2])
    replayed.prepare_step(WIDTH)  # grows the pool once, before the capture
    for c in (eager, ref):
        c.declare_step([0, 1, 2])
        c.prepare_step(WIDTH)
    graph = None
    for step in range(6):
        if step:
            for c in (replayed, eager, ref):
                c.declare_step([0, 1, 2])
                c.prepare_step(WIDTH)
        k, v = rng.standard_normal((2, *kv), np.float32) * 3
        q = rng.standard_normal((WIDTH, n_heads, 32), np.float32)
        for i, cache in enumerate((replayed, eager)):
            for array, x in zip(inputs[i], (k, v, q), strict=True):
                array.copy_to_device(x, stream=cache.stream)
        if graph is None:
            graph = replayed.capture(lambda: work(replayed, 0))
        else:
            graph.replay()
        work(eager, 1)
        for layer, mode in enumerate(MODES):
            got, twin = outs[0][layer].copy_to_host(), outs[1][layer].copy_to_host()
            assert np.array_equal(got, twin), (step, layer)
            ref.write(layer, k, v)
            assert_close(got, ref.attend(layer, q, mode=mode))
    n = ref.read_len  # the cells written; the rest of a device pool is uninitialised
    for layer in range(2):
        for have, want in zip(replayed.pool_kv(layer), ref.pool_kv(layer), strict=True):
            assert np.array_equal(have[:n], want[:n])
