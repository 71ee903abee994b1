"""`DeviceModel.run` is capturable: captured once (`CellCache.capture`, recorded launches on
the simulator), its launches re-issued verbatim after `stage` for a later step of the same
width (other tokens, rows, positions and sequences) give the logits and the K/V of an eager
forward bit for bit; in the simulator, `run` launches only, on the step's stream (no copy,
allocation or synchronization) and `stage` makes one copy.
"""

import numpy as np
import pytest

from numbakv import CellCache, DeviceModel
from numbakv.cache.cuda import IS_SIMULATOR
from numbakv.serve.model import Model, ModelConfig

CONFIG = ModelConfig(
    d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, d_ff=32, windows=(0, 3), vocab_size=40
)
# no growth between the steps: a recorded launch holds the pool's arrays
CACHE = dict(capacity=24, max_width=6, max_seqs=3, initial_cells=24)
OWN_LAUNCHES = {"embed", "qkv_rotary", "residual_matmul", "swiglu", "lm_head"}


def new_pair():
    """(cache, DeviceModel, its two sequences) of one model."""
    model = Model.from_seed(CONFIG, seed=3)
    cache = CellCache(CONFIG.cache_config(**CACHE))
    return cache, DeviceModel(model, cache.config), (cache.seq_new(), cache.seq_new())


def prepared(cache: CellCache, seq_ids, width: int):
    cache.declare_step(seq_ids)
    return cache.prepare_step(width)


def test_recorded_launches_reissued_for_a_later_step_equal_an_eager_forward():
    (cache, dm, (a, b)), (twin, twin_dm, (ta, tb)) = new_pair(), new_pair()
    rng = np.random.default_rng(0)
    # step 1, width 5: recorded on one cache, eager on its twin; both the same
    tokens, rows = rng.integers(0, 40, 5), [3, 1]
    step = prepared(cache, [a, a, a, b], 5)
    dm.stage(cache, step, tokens, rows)
    graph = cache.capture(lambda: dm.run(cache, step))
    recorded = dm.logits(len(rows))
    eager = twin_dm.forward(twin, prepared(twin, [ta, ta, ta, tb], 5), tokens, rows)
    np.testing.assert_array_equal(recorded, eager)
    assert set(graph.kernels) >= OWN_LAUNCHES and "scatter_kv" in graph.kernels  # the cache's
    # step 2, the same width: a new sequence, other positions, tokens and rows, re-issued
    c, tc = cache.seq_new(), twin.seq_new()
    tokens, rows = rng.integers(0, 40, 5), [0, 2, 2, 4]
    step = prepared(cache, [b, c, c, a], 5)
    dm.stage(cache, step, tokens, rows)
    graph.replay()  # BindingError, were the pool to have moved
    reissued = dm.logits(len(rows))
    eager = twin_dm.forward(twin, prepared(twin, [tb, tc, tc, ta], 5), tokens, rows)
    np.testing.assert_array_equal(reissued, eager)
    written = cache.read_len  # the cells placed so far; the rest were never written
    assert written == twin.read_len == 8
    for layer in range(CONFIG.n_layers):
        for got, expect in zip(cache.pool_kv(layer), twin.pool_kv(layer), strict=True):
            np.testing.assert_array_equal(got[:written], expect[:written])


@pytest.mark.skipif(not IS_SIMULATOR, reason="counts the CUDA simulator's entry points")
def test_run_only_launches_and_stage_copies_once():
    from numbakv.testing import launches as counting

    cache, dm, (a, b) = new_pair()
    dm.forward(cache, prepared(cache, [a, b], 3), [1, 2, 3], [0])  # the first use allocates
    step = prepared(cache, [a, b, b], 3)
    with counting.count_device_calls() as calls:
        dm.stage(cache, step, [4, 5, 6], [2, 0])
    assert calls.counts["copies"] == 1 and calls.counts["launches"] == 0
    assert calls.counts["allocations"] == calls.counts["synchronizations"] == 0
    with counting.count_device_calls() as calls:
        dm.run(cache, step)
    assert calls.counts["copies"] == calls.counts["allocations"] == 0
    assert calls.counts["synchronizations"] == 0
    assert all(launch.stream is step.stream for launch in calls.launches)
    own = [launch.name for launch in calls.launches if launch.name in OWN_LAUNCHES]
    per_layer = ["qkv_rotary", "residual_matmul", "swiglu", "residual_matmul"]
    assert own == ["embed", *per_layer * CONFIG.n_layers, "lm_head"]
