"""attend through cells and the solo oracle, each against a plain float64 formula."""

import numpy as np
import pytest

from numbakv.errors import StepError
from numbakv.reference import CellCache, solo_attention

from helpers import full_state, small_config, step_with


def plain_attention(q, k, v, scale):
    """float64 softmax(q·kᵀ·scale)·v for one query head over its visible keys: [head_dim]."""
    scores = np.array([np.dot(q, key) for key in k], dtype=np.float64) * scale
    weights = np.exp(scores - scores.max())
    return (weights[:, None] * v).sum(axis=0) / weights.sum()


def solo_expect(q, k_hist, v_hist, positions, window, scale):
    """solo attention spelled out token by token, head by head, in float64."""
    q, k_hist, v_hist = (np.asarray(x, np.float64) for x in (q, k_hist, v_hist))
    n_heads, n_kv_heads = q.shape[1], k_hist.shape[1]
    out = np.zeros(q.shape)
    for i, p in enumerate(positions):
        seen = [j for j in range(p + 1) if window == 0 or j > p - window]
        for h in range(n_heads):
            kv = h * n_kv_heads // n_heads
            out[i, h] = plain_attention(q[i, h], k_hist[seen, kv], v_hist[seen, kv], scale)
    return out


@pytest.mark.parametrize("window", [0, 1, 2, 3, 7, 50])
@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(2, 2), (4, 2), (4, 1), (8, 2)])
def test_solo_attention_matches_the_formula(window, n_heads, n_kv_heads):
    rng = np.random.default_rng(window * 10 + n_heads)
    length, head_dim = 9, 6
    k, v = rng.standard_normal((2, length, n_kv_heads, head_dim))
    q = rng.standard_normal((4, n_heads, head_dim))
    positions = [0, 3, 7, 8]
    got = solo_attention(q, k, v, positions, window)
    expect = solo_expect(q, k, v, positions, window, 1 / np.sqrt(head_dim))
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    assert got.dtype == np.float32


def test_gqa_head_h_reads_kv_head_h_over_group():
    # each KV head holds a constant value; query head h must return KV head h // 2's value
    cache = CellCache(small_config(n_kv_heads=2, windows=(0, 0)))
    a = cache.seq_new()
    step_with(cache, [a, a])
    k = np.zeros((2, 2, 4), np.float32)
    v = np.zeros((2, 2, 4), np.float32)
    v[:, 1] = 1.0
    cache.write(0, k, v)
    got = cache.attend(0, np.ones((2, 4, 4), np.float32))
    np.testing.assert_array_equal(got[:, :, 0], [[0, 0, 1, 1], [0, 0, 1, 1]])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("scale", [None, 0.1])
def test_attend_matches_the_formula(dtype, scale):
    rng = np.random.default_rng(1)
    cache = CellCache(small_config(n_kv_heads=2, head_dim=5, windows=(0, 2), dtype=dtype))
    a, b = cache.seq_new(), cache.seq_new()
    history = {a: [], b: []}
    for seq_ids in ([a, a, b], [b, a], [a, b, b, a]):
        step = step_with(cache, seq_ids)
        k, v = rng.standard_normal((2, step.width, 2, 5)).astype(np.float32)
        q = rng.standard_normal((step.width, 4, 5)).astype(np.float32)
        for layer in range(2):
            cache.write(layer, k, v)
        for t, seq in enumerate(seq_ids):
            history[seq].append((k[t].astype(dtype), v[t].astype(dtype)))
        for layer, window in enumerate((0, 2)):
            got = cache.attend(layer, q, scale)
            for t, (seq, p) in enumerate(zip(seq_ids, step.positions.tolist(), strict=True)):
                hist = np.array(history[seq], dtype=np.float64)  # [length, 2, kv, d]
                s = 1 / np.sqrt(5) if scale is None else scale
                expect = solo_expect(q[t : t + 1], hist[:, 0], hist[:, 1], [p], window, s)
                np.testing.assert_allclose(got[t], expect[0], rtol=1e-5, atol=1e-6)


def test_free_and_foreign_cells_are_never_read():
    cache = CellCache(small_config(windows=(0, 0)))
    a, b, c = cache.seq_new(), cache.seq_new(), cache.seq_new()
    step = step_with(cache, [b, a, b, c, a])
    k = np.ones((5, 1, 4), np.float32)
    k[[0, 2, 3]] = np.nan  # b's and c's rows
    cache.write(0, k, k)
    cache.seq_rm(b)  # b's NaN cells are now free holes below read_len
    step = step_with(cache, [a])
    cache.write(0, np.ones((1, 1, 4)), np.ones((1, 1, 4)))
    got = cache.attend(0, np.ones((1, 2, 4)))
    assert step.cells.tolist() == [0]
    np.testing.assert_array_equal(got, np.ones((1, 2, 4)))


def test_padding_rows_attend_to_nothing_and_give_zero(cache):
    a = cache.seq_new()
    step_with(cache, [a], width=4)
    cache.write(0, np.ones((4, 1, 4)), np.ones((4, 1, 4)))
    got = cache.attend(0, np.full((4, 2, 4), np.nan))
    assert np.isnan(got[0]).all()  # a real row reads its NaN query
    np.testing.assert_array_equal(got[1:], 0)


class FakeDeviceArray:
    """Anything with copy_to_host is taken as a device array."""

    def __init__(self, array):
        self.array = array

    def copy_to_host(self):
        return self.array.copy()


def test_accepts_device_like_arrays(cache):
    a = cache.seq_new()
    step_with(cache, [a])
    x = FakeDeviceArray(np.full((1, 1, 4), 2.0, np.float32))
    cache.write(0, x, x)
    got = cache.attend(0, FakeDeviceArray(np.ones((1, 1, 4), np.float32)))
    np.testing.assert_array_equal(got, np.full((1, 1, 4), 2.0))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c: c.write(0, np.ones((3, 1, 4)), np.ones((2, 1, 4))), "shape"),
        (lambda c: c.write(0, np.ones((2, 2, 4)), np.ones((2, 2, 4))), "shape"),
        (lambda c: c.write(2, np.ones((2, 1, 4)), np.ones((2, 1, 4))), "n_layers"),
        (lambda c: c.write(-1, np.ones((2, 1, 4)), np.ones((2, 1, 4))), "n_layers"),
        (lambda c: c.attend(1, np.ones((2, 2, 4))), "before write"),
        (lambda c: c.attend(0, np.ones((2, 2, 5))), "shape"),
        (lambda c: c.attend(0, np.ones((2, 4))), "shape"),
        (lambda c: c.attend(0, np.ones((2, 0, 4))), "multiple"),
    ],
)
def test_bad_write_and_attend_refused(call, match):
    cache = CellCache(small_config())
    a = cache.seq_new()
    step = step_with(cache, [a, a])
    cache.write(0, np.ones((2, 1, 4)), np.ones((2, 1, 4)))
    before = full_state(cache)
    with pytest.raises(StepError, match=match):
        call(cache)
    assert full_state(cache) == before and not step.is_stale


def test_n_heads_must_be_a_multiple_of_n_kv_heads():
    cache = CellCache(small_config(n_kv_heads=2))
    a = cache.seq_new()
    step_with(cache, [a])
    cache.write(0, np.ones((1, 2, 4)), np.ones((1, 2, 4)))
    with pytest.raises(StepError, match="multiple of n_kv_heads=2"):
        cache.attend(0, np.ones((1, 3, 4)))
