"""NaN and inf in what a token sees, on both caches: float32 softmax arithmetic, as the
reference computes it (docs/contract.md §5); what a token does not see never matters."""

import numpy as np
import pytest

from numbakv.core.arrays import as_host

from helpers import step_with

MODES = ("gathered", "masked")
INF, NAN = np.float32(np.inf), np.float32(np.nan)


def attend_after(impl, mode, poison, width=3):
    """Output [width, 2, 4] of a, b, a (a at 0, 1; b at 0) after `poison(k, v, q)` edits the
    step's arrays in place; K/V elsewhere are small positive numbers, q all ones."""
    cache = impl.cache(windows=(0, 0), max_width=12)
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a, b][:width] if width <= 3 else [a, b, a] + [b] * (width - 3))
    k = np.full((width, 1, 4), 0.25, np.float32)
    v = np.arange(width * 4, dtype=np.float32).reshape(width, 1, 4) / 8
    q = np.ones((width, 2, 4), np.float32)
    poison(k, v, q)
    for layer in range(2):
        cache.write(layer, k, v)
    return as_host(cache.attend(0, q, mode=mode))


def expect_finite_rows(out, rows):
    for t in rows:
        assert np.isfinite(out[t]).all(), (t, out[t])


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_key_a_token_sees_makes_its_rows_nan(impl, mode):
    out = attend_after(impl, mode, lambda k, v, q: k.__setitem__((0, 0, 2), NAN))
    assert np.isnan(out[:2]).all()  # a@0 and a@1 see cell 0
    expect_finite_rows(out, [2])  # b never sees it


@pytest.mark.parametrize("mode", MODES)
def test_an_infinite_score_makes_the_row_nan(impl, mode):
    out = attend_after(impl, mode, lambda k, v, q: k.__setitem__((1, 0, 0), INF))
    expect_finite_rows(out, [0, 2])  # a@0 does not see a@1
    assert np.isnan(out[1]).all()


@pytest.mark.parametrize("mode", MODES)
def test_a_minus_inf_score_weighs_nothing(impl, mode):
    out = attend_after(impl, mode, lambda k, v, q: k.__setitem__((0, 0, 0), -INF))
    np.testing.assert_allclose(out[1], np.broadcast_to(np.arange(4, 8) / 8, (2, 4)), rtol=1e-6)
    assert np.isnan(out[0]).all()  # a@0 sees only that -inf score


@pytest.mark.parametrize("mode", MODES)
def test_nan_and_inf_in_values_spread_into_their_dimension(impl, mode):
    def poison(k, v, q):
        v[0, 0, 1] = NAN
        v[1, 0, 3] = INF

    out = attend_after(impl, mode, poison)
    assert np.isnan(out[:2, :, 1]).all() and np.isfinite(out[:2, :, [0, 2]]).all()
    assert np.isposinf(out[1, :, 3]).all() and np.isfinite(out[0, :, 3]).all()
    expect_finite_rows(out, [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_query_head_makes_only_that_head_nan(impl, mode):
    out = attend_after(impl, mode, lambda k, v, q: q.__setitem__((1, 1, 0), NAN))
    assert np.isnan(out[1, 1]).all() and np.isfinite(out[1, 0]).all()
    expect_finite_rows(out, [0, 2])


@pytest.mark.parametrize("mode", MODES)
def test_values_near_the_float32_maximum_do_not_overflow(impl, mode):
    # the weights are normalised before the product: a mean of 2e38s is 2e38, not inf
    out = attend_after(impl, mode, lambda k, v, q: v.__setitem__(slice(None), 2e38))
    np.testing.assert_allclose(out, 2e38, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_a_prefill_shaped_step_keeps_the_rules(impl, mode):
    # 10 tokens: past the decode kernels' width; a at 0, 1 (rows 0, 2) and b at 0 .. 7
    out = attend_after(impl, mode, lambda k, v, q: k.__setitem__((0, 0, 2), NAN), width=10)
    assert np.isnan(out[[0, 2]]).all()
    expect_finite_rows(out, [1, *range(3, 10)])
