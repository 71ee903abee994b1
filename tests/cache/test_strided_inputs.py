"""Device inputs read in place: views of one fused QKV array (strided in every axis but
head_dim), float16 q and K/V, float16 or strided `out=`, and tensors exported through DLPack
(float32, float16, bfloat16; `dlpack_tensor`, as a GPU tensor is to a GPU) give exactly what
contiguous float32 copies give, in both modes and both kernel shapes, and a bfloat16 `out=`
their bfloat16 rounding; what cannot be read in place (a strided head_dim, an integer or
vector export) is refused with a StepError that says what to pass, changing nothing."""

import functools

import ml_dtypes
import numpy as np
import pytest
from dlpack_tensor import Tensor, bfloat16_tensor

import numbakv
from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.core.arrays import CPU
from numbakv.core.errors import StepError

from helpers import full_state

CONFIG = numbakv.CacheConfig(n_layers=2, n_kv_heads=2, head_dim=8, windows=(0, 2), capacity=16,
                             max_width=4, max_seqs=2, k_dtype="float16")  # fmt: skip
N_HEADS = 4
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def fused(width: int, rng) -> tuple[np.ndarray, tuple]:
    """A [width, heads of q + k + v, head_dim] float32 "QKV projection" and its q, k, v views."""
    d, kv = CONFIG.head_dim, CONFIG.n_kv_heads
    qkv = rng.standard_normal((width, N_HEADS + 2 * kv, d)).astype(np.float32)
    return qkv, (slice(0, N_HEADS), slice(N_HEADS, N_HEADS + kv), slice(N_HEADS + kv, None))


def run(make_inputs, width: int, out_dtype=np.float32, out_view=False, make_out=None,
        config=CONFIG) -> list[np.ndarray]:  # fmt: skip
    """Two steps (a prefill of `width`, then one decode token each) on a new cache; per layer
    and mode the outputs (as float32; `make_out(shape)` gives the out= to pass, default a
    numba array of out_dtype)."""
    cache, rng, outs = numbakv.CellCache(config), np.random.default_rng(3), []
    a, b = cache.seq_new(), cache.seq_new()
    for ids in ([a] * (width - 1) + [b], [a, b]):
        cache.declare_step(ids)
        cache.prepare_step()
        qkv, parts = fused(len(ids), rng)
        q, k, v = make_inputs(qkv, parts)
        for layer in range(2):
            cache.write(layer, k, v)
            for mode in ("gathered", "masked"):
                shape = (len(ids), N_HEADS, CONFIG.head_dim)
                if make_out is not None:
                    out = make_out(shape)
                elif out_view:  # every other head of a wider array
                    wide = cuda.device_array((len(ids), 2 * N_HEADS, CONFIG.head_dim), out_dtype)
                    out = wide[:, ::2]
                else:
                    out = cuda.device_array(shape, out_dtype)
                got = cache.attend(layer, q, mode=mode, out=out).copy_to_host()
                if got.dtype == np.uint16:  # a bfloat16 out's patterns
                    got = got.view(ml_dtypes.bfloat16)
                outs.append(got.astype(np.float32))
    return outs


def contiguous(qkv, parts):
    return tuple(cuda.to_device(np.ascontiguousarray(qkv[:, p])) for p in parts)


def rounded(dtype):
    """Contiguous float32 copies of what a fused tensor of `dtype` holds."""

    def make(qkv, parts):
        return contiguous(qkv.astype(dtype).astype(np.float32), parts)

    return make


@functools.cache
def expected(dtype, width: int) -> list[np.ndarray]:
    """`run(rounded(dtype), width)`, once per (dtype, width): several tests compare with
    the same outputs (`run` is deterministic), and a run is ~1 s of simulator."""
    return run(rounded(dtype), width)


def views(dtype):
    def make(qkv, parts):
        whole = cuda.to_device(qkv.astype(dtype))  # one array; q, k, v are views into it
        return tuple(whole[:, p] for p in parts)

    return make


@pytest.mark.parametrize("width", [2, 4])  # decode and prefill shapes (GQA 2)
def test_strided_views_give_what_contiguous_copies_give(width):
    expect = expected(np.float32, width)
    for got in (run(views(np.float32), width), run(views(np.float32), width, out_view=True)):
        assert all(map(np.array_equal, got, expect))


def test_float16_inputs_and_outputs_read_and_write_in_place():
    expect = expected(np.float16, 3)
    assert all(map(np.array_equal, run(views(np.float16), 3), expect))
    written = run(views(np.float16), 3, out_dtype=np.float16)
    assert all(np.array_equal(w, e.astype(np.float16).astype(np.float32))
               for w, e in zip(written, expect, strict=True))  # fmt: skip


def test_a_strided_head_dim_is_refused_and_nothing_changes():
    cache = numbakv.CellCache(CONFIG)
    cache.declare_step([cache.seq_new()])
    cache.prepare_step()
    wide = cuda.to_device(np.zeros((1, 2, 2 * CONFIG.head_dim), np.float32))
    before = full_state(cache)
    with pytest.raises(StepError, match="last axis"):
        cache.write(0, wide[:, :, ::2], wide[:, :, ::2])
    assert full_state(cache) == before


def exported(dtype: str):
    """q, k, v as DLPack exports of views into one fused tensor of `dtype`."""

    def make(qkv, parts):
        whole = qkv.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        return tuple(Tensor(whole[:, p], dtype=dtype) for p in parts)

    return make


@pytest.mark.parametrize("width", [2, 4])
def test_dlpack_tensors_read_in_place_give_what_float32_copies_give(width):
    for dtype, host in (("float32", np.float32), ("float16", np.float16),
                        ("bfloat16", ml_dtypes.bfloat16)):  # fmt: skip
        expect = expected(host, width)
        assert all(map(np.array_equal, run(exported(dtype), width), expect)), dtype


@pytest.mark.parametrize("width", [2, 4])  # the merge's and the prefill kernel's write
def test_a_bfloat16_out_holds_the_float32_output_rounded_to_nearest_even(width):
    expect = expected(ml_dtypes.bfloat16, width)
    wide = []

    def strided_out(shape):  # every other head of a wider bfloat16 tensor
        t, h, d = shape
        wide.append(np.full((t, 2 * h, d), 7, ml_dtypes.bfloat16))
        return Tensor(wide[-1][:, ::2], dtype="bfloat16")

    written = run(exported("bfloat16"), width, make_out=strided_out)
    for got, e, whole in zip(written, expect, wide, strict=True):
        np.testing.assert_array_equal(got, e.astype(ml_dtypes.bfloat16).astype(np.float32))
        np.testing.assert_array_equal(whole[:, 1::2].astype(np.float32), 7)  # untouched


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "q8_0", "fp8_e4m3"])
def test_bfloat16_k_and_v_are_stored_as_their_float32_values_are(fmt):
    config = numbakv.CacheConfig(n_layers=1, n_kv_heads=2, head_dim=32, capacity=8,
                                 max_width=4, max_seqs=1, dtype=fmt)  # fmt: skip
    rng = np.random.default_rng(len(fmt))
    x = rng.standard_normal((2, 4, 2, 32)).astype(np.float32) * 3
    x[0, 1, 0, :5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    pools = []
    for wrap in (lambda a: bfloat16_tensor(a), lambda a: cuda.to_device(
            a.astype(ml_dtypes.bfloat16).astype(np.float32))):  # fmt: skip
        cache = numbakv.CellCache(config)
        cache.declare_step([cache.seq_new()] * 4)
        cache.prepare_step()
        cache.write(0, wrap(x[0]), wrap(x[1]))
        placed = cache.snapshot().pos >= 0  # the unwritten cells hold what the allocator left
        pools.append([a[: len(placed)][placed].tobytes() for a in cache.pool_kv(0)])
    assert pools[0] == pools[1]


def test_cuda_exports_are_asked_for_no_synchronization():
    cache = numbakv.CellCache(CONFIG)
    cache.declare_step([cache.seq_new()])
    cache.prepare_step()
    k, v = (bfloat16_tensor(np.ones((1, 2, CONFIG.head_dim))) for _ in range(2))
    cache.write(0, k, v)
    assert k.streams == v.streams == [-1]


def test_a_host_bfloat16_tensor_is_widened_exactly_on_both_caches():
    x = np.random.default_rng(5).standard_normal((1, 2, CONFIG.head_dim)).astype(np.float32)
    widened = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    for make in (numbakv.CellCache, numbakv.reference.CellCache):
        pools = []
        for k in (bfloat16_tensor(x, device=CPU), widened):
            cache = make(CONFIG)
            cache.declare_step([cache.seq_new()])
            cache.prepare_step()
            cache.write(0, k, widened)
            pools.append(cache.pool_kv(0)[0].tobytes())
        assert pools[0] == pools[1], make


def unreadable(heads: int) -> dict[str, object]:
    """Device tensors [1, heads, head_dim] the kernels cannot read in place, by what their
    StepError names."""
    d = CONFIG.head_dim
    wide = np.ones((1, heads, 2 * d), ml_dtypes.bfloat16)
    return {
        "int32": Tensor(np.ones((1, heads, d), np.int32)),
        "2 lanes": Tensor(np.ones((1, heads, d), np.float32), lanes=2),
        "last axis": Tensor(wide[:, :, ::2], dtype="bfloat16"),
        "uint16": cuda.to_device(np.ones((1, heads, d), np.uint16)),  # no export: not bf16
    }


def one_token_step() -> numbakv.CellCache:
    cache = numbakv.CellCache(CONFIG)
    cache.declare_step([cache.seq_new()])
    cache.prepare_step()
    return cache


@pytest.mark.parametrize("match", ["int32", "2 lanes", "last axis", "uint16", "one dtype",
                                   "host array beside a bfloat16"])  # fmt: skip
def test_k_and_v_the_kernels_cannot_read_are_refused_and_nothing_changes(match):
    ones = np.ones((1, 2, CONFIG.head_dim), np.float32)
    pairs = {"one dtype": cuda.to_device(ones), "host array beside a bfloat16": ones}
    if match in pairs:
        k, v = bfloat16_tensor(ones), pairs[match]
    else:
        k = v = unreadable(2)[match]
    cache = one_token_step()
    before = full_state(cache)
    with pytest.raises(StepError, match=match):
        cache.write(0, k, v)
    assert full_state(cache) == before


@pytest.mark.parametrize("match", ["int32", "2 lanes", "last axis", "uint16"])
def test_q_and_out_the_kernels_cannot_read_are_refused_and_nothing_changes(match):
    cache = one_token_step()
    ones = np.ones((1, 2, CONFIG.head_dim), np.float32)
    cache.write(0, ones, ones)
    bad = unreadable(N_HEADS)[match]
    before = full_state(cache)
    with pytest.raises(StepError, match=match):
        cache.attend(0, bad)
    with pytest.raises(StepError, match=match):
        cache.attend(0, np.ones((1, N_HEADS, CONFIG.head_dim), np.float32), out=bad)
    assert full_state(cache) == before


class GpuTensor(Tensor):
    """A real GPU tensor's look: its `__cuda_array_interface__` raises, as torch's does for
    bfloat16; its memory is a GPU's, which the simulator must not read as host memory."""

    @property
    def __cuda_array_interface__(self):
        raise TypeError("bfloat16 has no typestr")


@pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's refusal of GPU memory")
def test_the_simulator_refuses_a_gpu_tensor_and_nothing_changes():
    cache = one_token_step()
    k = GpuTensor(np.ones((1, 2, CONFIG.head_dim), ml_dtypes.bfloat16), dtype="bfloat16")
    before = full_state(cache)
    with pytest.raises(StepError, match="simulator cannot read"):
        cache.write(0, k, k)
    assert full_state(cache) == before


def test_an_export_of_memory_the_host_cannot_read_is_refused_by_the_reference():
    cache = numbakv.reference.CellCache(CONFIG)
    cache.declare_step([cache.seq_new()])
    cache.prepare_step()
    metal = Tensor(np.ones((1, 2, CONFIG.head_dim), ml_dtypes.bfloat16), device=8,
                   dtype="bfloat16")  # fmt: skip
    before = full_state(cache)
    with pytest.raises(StepError, match="device type 8"):
        cache.write(0, metal, metal)
    assert full_state(cache) == before
