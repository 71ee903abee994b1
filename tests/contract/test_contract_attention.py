"""Attention through either cache, in both modes, against a plain float64 formula; what it
never reads; padding; refused writes and attends."""

import numpy as np
import pytest

from numbakv.core.arrays import as_host
from numbakv.core.errors import StepError

from helpers import as_stored, full_state, solo_expect, step_with

MODES = ("gathered", "masked")


@pytest.mark.parametrize("mode", MODES)
def test_gqa_head_h_reads_kv_head_h_over_group(impl, mode):
    # each KV head holds a constant value; query head h must return KV head h // 2's value
    cache = impl.cache(n_kv_heads=2, windows=(0, 0))
    a = cache.seq_new()
    step_with(cache, [a, a])
    k = np.zeros((2, 2, 4), np.float32)
    v = np.zeros((2, 2, 4), np.float32)
    v[:, 1] = 1.0
    cache.write(0, k, v)
    got = as_host(cache.attend(0, np.ones((2, 4, 4), np.float32), mode=mode))
    np.testing.assert_array_equal(got[:, :, 0], [[0, 0, 1, 1], [0, 0, 1, 1]])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("scale", [None, 0.1])
def test_attend_matches_the_formula(impl, dtype, scale):
    rng = np.random.default_rng(1)
    cache = impl.cache(n_kv_heads=2, head_dim=5, windows=(0, 2), dtype=dtype)
    a, b = cache.seq_new(), cache.seq_new()
    history = {a: [], b: []}
    for seq_ids in ([a, a, b], [b, a], [a, b, b, a]):
        step = step_with(cache, seq_ids)
        k, v = rng.standard_normal((2, step.width, 2, 5)).astype(np.float32)
        q = rng.standard_normal((step.width, 4, 5)).astype(np.float32)
        for layer in range(2):
            cache.write(layer, k, v)
        for t, seq in enumerate(seq_ids):
            history[seq].append((as_stored(k[t], dtype), as_stored(v[t], dtype)))
        for (layer, window), mode in zip(enumerate((0, 2)), MODES, strict=True):
            got = as_host(cache.attend(layer, q, scale, mode=mode))
            for t, (seq, p) in enumerate(zip(seq_ids, step.positions.tolist(), strict=True)):
                hist = np.array(history[seq], dtype=np.float64)  # [length, 2, kv, d]
                s = 1 / np.sqrt(5) if scale is None else scale
                expect = solo_expect(q[t : t + 1], hist[:, 0], hist[:, 1], [p], window, s)
                np.testing.assert_allclose(got[t], expect[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_free_and_foreign_cells_are_never_read(impl, mode):
    cache = impl.cache(windows=(0, 0))
    a, b, c = cache.seq_new(), cache.seq_new(), cache.seq_new()
    step = step_with(cache, [b, a, b, c, a])
    k = np.ones((5, 1, 4), np.float32)
    k[[0, 2, 3]] = np.nan  # b's and c's rows
    cache.write(0, k, k)
    cache.seq_rm(b)  # b's NaN cells are now free holes below read_len
    step = step_with(cache, [a])
    cache.write(0, np.ones((1, 1, 4)), np.ones((1, 1, 4)))
    got = as_host(cache.attend(0, np.ones((1, 2, 4)), mode=mode))
    assert step.cells.tolist() == [0]
    np.testing.assert_array_equal(got, np.ones((1, 2, 4)))


@pytest.mark.parametrize("mode", MODES)
def test_padding_rows_attend_to_nothing_and_give_zero(impl, mode):
    cache = impl.cache()
    a = cache.seq_new()
    step_with(cache, [a], width=4)
    cache.write(0, np.full((4, 1, 4), 2.0), np.full((4, 1, 4), 3.0))
    got = as_host(cache.attend(0, np.ones((4, 2, 4)), mode=mode))
    np.testing.assert_array_equal(got[0], 3.0)  # the real row sees its own V
    np.testing.assert_array_equal(got[1:], 0)


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_query_gives_nan(impl, mode):
    cache = impl.cache()
    a = cache.seq_new()
    step_with(cache, [a], width=2)
    cache.write(0, np.ones((2, 1, 4)), np.ones((2, 1, 4)))
    got = as_host(cache.attend(0, np.full((2, 2, 4), np.nan), mode=mode))
    assert np.isnan(got[0]).all()  # the real row reads its NaN query
    np.testing.assert_array_equal(got[1], 0)  # the padded row reads nothing


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
        (lambda c: c.attend(0, np.ones((2, 2, 4)), mode="dense"), "mode"),
    ],
)
def test_bad_write_and_attend_refused(impl, call, match):
    cache = impl.cache()
    a = cache.seq_new()
    step = step_with(cache, [a, a])
    cache.write(0, np.ones((2, 1, 4)), np.ones((2, 1, 4)))
    before = full_state(cache)
    with pytest.raises(StepError, match=match):
        call(cache)
    assert full_state(cache) == before and not step.is_stale


def test_n_heads_must_be_a_multiple_of_n_kv_heads(impl):
    cache = impl.cache(n_kv_heads=2)
    a = cache.seq_new()
    step_with(cache, [a])
    cache.write(0, np.ones((1, 2, 4)), np.ones((1, 2, 4)))
    with pytest.raises(StepError, match="multiple of n_kv_heads=2"):
        cache.attend(0, np.ones((1, 3, 4)))
