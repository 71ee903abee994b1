"""NaN parity, differentially: random workloads whose K, V and q carry NaN and ±inf give the
same NaN/inf pattern (and the same finite values) on the device as on the reference, in
both modes and both kernel shapes."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numbakv
from numbakv.cache.cuda import cuda
from numbakv.cache.kernels.attention import launch_attend_masked
from numbakv.cache.kernels.step_buffer import host_step
from numbakv.reference import CellCache as RefCache
from numbakv.reference.attention import attend_cells
from numbakv.reference.storage import to_storage

from helpers import assert_close, small_config

SPECIALS = np.array([np.nan, np.inf, -np.inf], np.float32)


def sprinkle(x: np.ndarray, rng, rate: float) -> np.ndarray:
    """x with about `rate` of its entries replaced by NaN, inf or -inf."""
    hit = rng.random(x.shape) < rate
    x[hit] = rng.choice(SPECIALS, size=int(hit.sum()))
    return x


def assert_same_specials(got: np.ndarray, expect: np.ndarray, what: str) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expect), err_msg=f"{what}: NaN")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(expect), err_msg=f"{what}: +inf")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expect), err_msg=f"{what}: -inf")
    finite = np.isfinite(expect)
    assert_close(got[finite], expect[finite], what)


# the simulator runs kernels as NumPy scalars, which warn on inf - inf; a GPU does not
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@settings(max_examples=8, deadline=None)
@given(
    dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
    rate=st.sampled_from([0.02, 0.1]),
    plan=st.lists(st.integers(0, 2**16), min_size=2, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_device_propagates_specials_like_the_reference(dtype, rate, plan, seed):
    cfg = small_config(windows=(0, 3), dtype=dtype, capacity=32, max_width=12, max_seqs=3)
    device, reference = numbakv.CellCache(cfg), RefCache(cfg)
    rng = np.random.default_rng(seed)
    for cache in (device, reference):
        for _ in range(3):
            cache.seq_new()
    for op in plan:
        n = 1 + op % 11  # 1 to 11 tokens: decode-shaped up to 8, prefill-shaped past
        seq_ids = [int(s) for s in rng.integers(0, 3, n)]
        width = min(12, n + op % 2)  # sometimes a padded row
        if reference.free_cells < n:
            break
        for cache in (device, reference):
            cache.declare_step(seq_ids)
            cache.prepare_step(width)
        shape = (width, 1, 4)
        k, v = (sprinkle(rng.standard_normal(shape).astype(np.float32), rng, rate) for _ in "kv")
        q = sprinkle(rng.standard_normal((shape[0], 2, 4)).astype(np.float32), rng, rate)
        for layer in range(2):
            for cache in (device, reference):
                cache.write(layer, k, v)
            expect = reference.attend(layer, q)
            for mode in ("gathered", "masked"):
                got = device.attend(layer, q, mode=mode).copy_to_host()
                assert_same_specials(got, expect, f"layer {layer} {mode} width {width}")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize(
    ("kernel", "n_splits"), [("decode", 1), ("decode", 3), ("decode", 32), ("prefill", None)]
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_over_many_tiles_and_splits(kernel, n_splits, dtype):
    # 130 cells: five decode tiles, nine prefill tiles, 3 splits of 44 cells (32 splits: the
    # same 3, since a split takes up to MIN_SPLIT_CELLS cells, and 29 empty). Token 0 sees a
    # NaN key and token 1 an infinite one; token 2 sees neither but sees an inf and a NaN
    # in V (dims 2, 3), and across tiles cells whose weights are small
    rng = np.random.default_rng(5)
    rows, width = 130, 3
    k, v = rng.standard_normal((2, rows, 1, 4)).astype(np.float32) * 3
    k[10, 0, 1], k[100, 0, 0], v[20, 0, 2], v[70, 0, 3] = np.nan, np.inf, np.inf, np.nan
    k_pool, v_pool = to_storage(k, dtype), to_storage(v, dtype)
    q = rng.standard_normal((width, 2, 4)).astype(np.float32)
    mask = (rng.random((width, rows)) < 0.7).astype(np.uint8)
    mask[:, [10, 100, 20, 70]] = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]]
    scale = np.float32(0.5)
    expect = attend_cells(q, k_pool, v_pool, mask, scale, dtype)
    out = cuda.device_array(q.shape, np.float32)
    step = host_step(np.arange(width), np.arange(width), np.zeros(width), read_len=rows)
    launch_attend_masked(
        *(cuda.to_device(x) for x in (q, k_pool, v_pool, mask, step)), width, rows, scale, out,
        kernel=kernel, n_splits=n_splits,
    )  # fmt: skip
    assert np.isnan(expect[0]).all() and np.isnan(expect[1]).any()  # +inf or -inf scores
    assert np.isposinf(expect[2, :, 2]).all() and np.isfinite(expect[2, :, :2]).all()
    assert_same_specials(out.copy_to_host(), expect, f"{kernel} x{n_splits} {dtype}")
