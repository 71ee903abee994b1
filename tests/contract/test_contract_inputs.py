"""What `write` and `attend` take, on both caches: any real float array NumPy converts
(float16/32/64, ml_dtypes' bfloat16, lists, any strides or order, tensors that require grad)
and device arrays; every input is rounded to float32 first, then to the storage dtype."""

import ml_dtypes
import numpy as np
import pytest

from numbakv.cache.cuda import cuda
from numbakv.core.arrays import as_host
from numbakv.core.errors import StepError

from helpers import as_storage, full_state, step_with

RNG = np.random.default_rng(7)
K = RNG.standard_normal((3, 1, 4)).astype(np.float32)
Q = RNG.standard_normal((3, 2, 4)).astype(np.float32)


class TensorLike:
    """What a torch CPU tensor that requires grad looks like to NumPy: __array__ refuses
    until detach()."""

    def __init__(self, array, requires_grad=True):
        self.array, self.requires_grad = array, requires_grad

    def detach(self):
        return TensorLike(self.array, requires_grad=False)

    def __array__(self, dtype=None, copy=None):
        if self.requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad.")
        return self.array if dtype is None else self.array.astype(dtype)


class Unconvertible:
    """What a torch bfloat16 tensor looks like to NumPy."""

    def __array__(self, dtype=None, copy=None):
        raise TypeError("Got unsupported ScalarType BFloat16")


def strided(x):
    """x as a non-contiguous view (every other element of a larger array)."""
    wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1]), x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


FORMS = {
    "float32": lambda x: x,
    "float16": lambda x: x.astype(np.float16),
    "float64": lambda x: x.astype(np.float64),
    "bfloat16": lambda x: x.astype(ml_dtypes.bfloat16),
    "list": lambda x: x.tolist(),
    "strided": strided,
    "fortran": np.asfortranarray,
    "tensor": TensorLike,
    "device": lambda x: cuda.to_device(x),
}


def exact(form: str, x: np.ndarray) -> np.ndarray:
    """The float32 values a form carries (float16 and bfloat16 round on the way in)."""
    return np.asarray(as_host(FORMS[form](x)) if form != "tensor" else x, dtype=np.float32)


@pytest.mark.parametrize("storage", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("form", list(FORMS))
def test_write_takes_every_real_float_form(impl, form, storage):
    cache = impl.cache(dtype=storage)
    step_with(cache, [cache.seq_new()] * 3)
    cache.write(0, FORMS[form](K), FORMS[form](-K))
    k_pool, v_pool = cache.pool_kv(0)
    np.testing.assert_array_equal(k_pool[:3], as_storage(exact(form, K), storage))
    np.testing.assert_array_equal(v_pool[:3], as_storage(exact(form, -K), storage))


@pytest.mark.parametrize("form", list(FORMS))
def test_attend_takes_every_real_float_form(impl, form):
    cache = impl.cache()
    step_with(cache, [cache.seq_new()] * 3)
    for layer in range(2):
        cache.write(layer, K, K)
    expect = as_host(cache.attend(0, exact(form, Q)))
    np.testing.assert_array_equal(as_host(cache.attend(0, FORMS[form](Q))), expect)


def test_float64_rounds_to_float32_before_the_storage_dtype(impl):
    # 1 + 2^-11 + 2^-40: rounded directly to float16 it is 1 + 2^-10; through float32 it
    # is the tie 1 + 2^-11, which rounds to even: 1.0
    cache = impl.cache(dtype="float16")
    step_with(cache, [cache.seq_new()])
    k = np.full((1, 1, 4), 1 + 2.0**-11 + 2.0**-40)
    assert k.astype(np.float16)[0, 0, 0] != 1.0
    cache.write(0, k, k)
    assert (cache.pool_kv(0)[0][0] == 1.0).all()


def test_an_unconvertible_object_says_what_to_pass(impl):
    cache = impl.cache()
    step_with(cache, [cache.seq_new()] * 3)
    before = full_state(cache)
    with pytest.raises(StepError, match=r"Unconvertible.*__dlpack__"):
        cache.write(0, K, Unconvertible())
    assert full_state(cache) == before


def test_bfloat16_rounds_to_nearest_even_like_ml_dtypes(impl):
    # ties with an even and an odd kept half, either sign, around 1, at the largest finite
    # value (rounds to inf), subnormals, zeros, infinities and NaN: 32 values, 8 tokens
    ties = [0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x3F807FFF, 0x3F808001]
    edges = [0x7F7FFFFF, 0x7F7F7FFF, 0x00008000, 0x00018000, 0x00000001, 0x80000000]
    rng = np.random.default_rng(3)
    nans = [0x7FC00001, 0xFF800001, 0x7FA00000, 0xFFFFFFFF]  # payloads, either sign
    bits = np.array(ties + edges + [0x7F800000, 0xFF800000, *nans], np.uint32)
    bits = np.concatenate([bits, rng.integers(0, 2**32, 32 - len(bits), dtype=np.uint32)])
    x = bits.view(np.float32).reshape(8, 1, 4)
    cache = impl.cache(dtype="bfloat16")
    step_with(cache, [cache.seq_new()] * 8)
    cache.write(0, x, x)
    got = cache.pool_kv(0)[0][:8]
    np.testing.assert_array_equal(got, as_storage(x, "bfloat16"))  # NaN: 0x7FC0 and sign


def test_bfloat16_rounding_matches_ml_dtypes_on_many_values():
    from numbakv.reference.storage import bfloat16_bits, bfloat16_values

    bits = np.arange(0, 2**32, 997, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    got, expect = bfloat16_bits(x), as_storage(x, "bfloat16")
    np.testing.assert_array_equal(got, expect)
    widened = expect.view(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(bfloat16_values(expect), widened)
