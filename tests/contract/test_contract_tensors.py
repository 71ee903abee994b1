"""Torch tensors in, torch tensors out (docs/contract.md §5.1), on both caches: `attend`
of a torch q returns a torch tensor in q's dtype with the values of the NumPy call (rounded
by torch to q's float16 or bfloat16); a torch `out=` is written and returned as itself;
what cannot hold the result is refused with nothing written. The device cache's `out=` is a
device tensor (a CUDA torch one on a GPU; tests/cache for numba's), so the `out=` tests here
are the reference's."""

import numpy as np
import pytest

from numbakv.core.arrays import as_host
from numbakv.core.errors import StepError
from numbakv.reference import CellCache as ReferenceCache

from helpers import small_config, step_with

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)
K = RNG.standard_normal((3, 1, 4)).astype(np.float32)
Q = RNG.standard_normal((3, 2, 4)).astype(np.float32)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def written(impl=None):
    """A cache (`impl`'s, default the reference) with one step of 3 tokens written on both
    layers, and the float32 result of attending Q on layer 0 (a NumPy q)."""
    cache = ReferenceCache(small_config()) if impl is None else impl.cache()
    step_with(cache, [cache.seq_new()] * 3)
    for layer in range(2):
        cache.write(layer, torch.from_numpy(K), torch.from_numpy(-K))
    return cache, as_host(cache.attend(0, Q))


def rounded(values: np.ndarray, dtype) -> torch.Tensor:
    return torch.from_numpy(values).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_torch_q_gets_a_torch_result_in_its_dtype(impl, dtype):
    cache, expected = written(impl)
    q = torch.from_numpy(Q).to(dtype)
    out = cache.attend(0, q)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == q.device
    exact = as_host(cache.attend(0, q.float().numpy()))  # q's values, widened exactly
    assert torch.equal(out, rounded(exact, dtype))
    if dtype == torch.float32:
        np.testing.assert_array_equal(out.numpy(), expected)


def test_a_strided_torch_view_is_read_through_its_strides(impl):
    cache, expected = written(impl)
    wide = torch.zeros(3, 2, 8)
    wide[..., ::2] = torch.from_numpy(Q)
    np.testing.assert_array_equal(cache.attend(0, wide[..., ::2]).numpy(), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_torch_out_is_written_and_returned_by_the_reference(dtype):
    cache, expected = written()
    out = torch.full((3, 2, 4), 7.0, dtype=dtype)
    assert cache.attend(0, torch.from_numpy(Q), out=out) is out
    assert torch.equal(out, rounded(expected, dtype))


def test_a_numpy_out_is_written_and_returned_by_the_reference():
    cache, expected = written()
    out = np.zeros((3, 2, 4), np.float16)
    assert cache.attend(0, Q, out=out) is out
    np.testing.assert_array_equal(out, expected.astype(np.float16))


@pytest.mark.parametrize(
    "out, match",
    [
        (lambda: torch.zeros(3, 2, 4, dtype=torch.int32), "torch tensor of torch.int32"),
        (lambda: torch.zeros(3, 2, 5), r"out has shape \(3, 2, 5\)"),
        (lambda: read_only(np.zeros((3, 2, 4), np.float32)), "give a writable NumPy float"),
        (lambda: [[0.0]], "give a writable NumPy float array"),
        (lambda: torch.empty(3, 2, 4, device="meta"), "on meta"),
        (lambda: torch.zeros(3, 2, 4, requires_grad=True), "requires_grad=True"),
        (lambda: torch.zeros(1, 2, 4).expand(3, 2, 4), "its elements overlap"),
    ],
)
def test_an_out_that_cannot_hold_the_result_is_refused_by_the_reference(out, match):
    cache, _ = written()
    out = out()
    before = copied(out)
    with pytest.raises(StepError, match=match):
        cache.attend(0, Q, out=out)
    if before is not None:
        np.testing.assert_array_equal(copied(out), before)  # nothing written


def copied(out) -> np.ndarray | None:
    """A host copy of what `out` holds (None: a list, a meta tensor)."""
    if isinstance(out, torch.Tensor):
        return None if out.is_meta else out.detach().numpy().copy()
    return out.copy() if isinstance(out, np.ndarray) else None


def read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def test_a_numba_out_of_the_device_cache_is_returned_for_a_torch_q():
    """The device cache's `out=` (a device array) is what it returns, whatever q's kind."""
    from numbakv import CellCache as DeviceCache
    from numbakv.cache.cuda import cuda

    cache = DeviceCache(small_config())
    step_with(cache, [cache.seq_new()] * 3)
    for layer in range(2):
        cache.write(layer, torch.from_numpy(K), torch.from_numpy(-K))
    out = cuda.device_array((3, 2, 4), np.float32)
    assert cache.attend(0, torch.from_numpy(Q), out=out) is out
    np.testing.assert_array_equal(out.copy_to_host(), as_host(cache.attend(0, Q)))
