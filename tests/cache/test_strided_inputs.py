"""Device inputs read in place: views of one fused QKV array (strided in every axis but
head_dim), float16 q and K/V, and float16 or strided `out=` give exactly what contiguous
float32 copies give, in both modes and both kernel shapes; what cannot be read in place
(a strided head_dim) is refused with a StepError that says what to pass, changing nothing."""

import numpy as np
import pytest

import numbakv
from numbakv.cache.cuda import cuda
from numbakv.errors import StepError

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


def run(make_inputs, width: int, out_dtype=np.float32, out_view=False) -> list[np.ndarray]:
    """Two steps (a prefill of `width`, then one decode token each) on a new cache; per layer
    and mode the outputs (as float32)."""
    cache, rng, outs = numbakv.CellCache(CONFIG), np.random.default_rng(3), []
    a, b = cache.seq_new(), cache.seq_new()
    for ids in ([a] * (width - 1) + [b], [a, b]):
        cache.declare_step(ids)
        cache.prepare_step()
        qkv, parts = fused(len(ids), rng)
        q, k, v = make_inputs(qkv, parts)
        for layer in range(2):
            cache.write(layer, k, v)
            for mode in ("gathered", "masked"):
                if out_view:  # every other head of a wider array
                    wide = cuda.device_array((len(ids), 2 * N_HEADS, CONFIG.head_dim), out_dtype)
                    out = wide[:, ::2]
                else:
                    out = cuda.device_array((len(ids), N_HEADS, CONFIG.head_dim), out_dtype)
                got = cache.attend(layer, q, mode=mode, out=out)
                outs.append(got.copy_to_host().astype(np.float32))
    return outs


def contiguous(qkv, parts):
    return tuple(cuda.to_device(np.ascontiguousarray(qkv[:, p])) for p in parts)


def views(dtype):
    def make(qkv, parts):
        whole = cuda.to_device(qkv.astype(dtype))  # one array; q, k, v are views into it
        return tuple(whole[:, p] for p in parts)

    return make


@pytest.mark.parametrize("width", [2, 4])  # decode and prefill shapes (GQA 2)
def test_strided_views_give_what_contiguous_copies_give(width):
    expect = run(contiguous, width)
    for got in (run(views(np.float32), width), run(views(np.float32), width, out_view=True)):
        assert all(map(np.array_equal, got, expect))


def test_float16_inputs_and_outputs_read_and_write_in_place():
    def halves(qkv, parts):
        return contiguous(qkv.astype(np.float16).astype(np.float32), parts)

    expect = run(halves, 3)
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
