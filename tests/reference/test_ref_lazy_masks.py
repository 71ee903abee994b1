"""The reference computes a step's masks when they are read: the same masks as computing
them all at `prepare_step` (`eager_masks` here), whatever ran in between (`seq_new`,
writes, attends), and a stale step still refuses."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.core.errors import StepError
from numbakv.reference import CellCache
from numbakv.reference.step import window_mask

from helpers import churn, small_config


def eager_masks(cache: CellCache, step) -> dict[int, np.ndarray]:
    """Every window's mask from the table right after `prepare_step` (the old rule)."""
    snap = cache.snapshot()
    return {w: window_mask(snap.pos, snap.owners, step.seq_ids, step.positions, w)
            for w in step.windows}  # fmt: skip


@settings(max_examples=40)
@given(st.lists(st.integers(0, 200), max_size=30), st.lists(st.integers(0, 7), min_size=1,
       max_size=8), st.integers(0, 2))  # fmt: skip
def test_lazy_masks_equal_the_eager_ones(ops, picks, pad):
    cache = CellCache(small_config(windows=(0, 2, 3), n_layers=3))
    churn(cache, ops)
    live = cache.live_seqs or [cache.seq_new()]
    ids = [live[p % len(live)] for p in picks][: min(cache.config.max_width, cache.free_cells)]
    if not ids:
        return
    cache.declare_step(ids)
    step = cache.prepare_step(min(len(ids) + pad, cache.config.max_width))
    expected = eager_masks(cache, step)
    if len(cache.live_seqs) < cache.config.max_seqs:
        cache.seq_new()  # no verb but seq_new makes the step stale
    shape = (step.width, cache.config.n_kv_heads, cache.config.head_dim)
    for layer in range(cache.config.n_layers):
        cache.write(layer, np.ones(shape), np.ones(shape))
        cache.attend(layer, np.ones(shape), mode=("gathered", "masked")[layer % 2])
    for window, mask in expected.items():
        np.testing.assert_array_equal(step.mask(window), mask)
        assert step.mask(window) is not step.mask(window)  # a copy each time
    cache.rewind(ids[0], 0)
    with pytest.raises(StepError, match="stale"):
        step.mask(next(iter(expected)))
