"""The reference's own attention pieces: the solo oracle against a plain float64 formula, and
`attend` taking anything with `copy_to_host`. Attention through both caches is in
`tests/contract/test_contract_attention.py`."""

import numpy as np
import pytest

from numbakv.reference import solo_attention

from helpers import solo_expect, step_with


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
