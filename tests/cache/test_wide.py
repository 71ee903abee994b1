"""The primitives of `numbakv.cache.kernels.wide` on the simulator: each simulator definition
against NumPy, and the shuffle definitions a GPU compiles (`_lane_sum4`, `_xor_swap10`)
against the one-exchange simulator ones, in kernels."""

import numpy as np
import pytest

from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels import wide

pytestmark = pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator definitions")


def test_row_reads_float16_and_bfloat16_as_words_and_float32_as_values():
    rng = np.random.default_rng(0)
    halves = rng.standard_normal((3, 2, 16)).astype(np.float16)
    words = wide.row(cuda.to_device(halves), 2, 16 + 8, True)  # head 1, elements 8..15
    expect = halves[2, 1, 8:16].view(np.uint16).astype(np.uint32)
    assert [np.uint32(w.view(np.uint32)) for w in words] == list(expect[0::2] | expect[1::2] << 16)
    assert [wide.half_lo(w) for w in words] == list(halves[2, 1, 8:16:2].astype(np.float32))
    assert [wide.half_hi(w) for w in words] == list(halves[2, 1, 9:16:2].astype(np.float32))
    floats = rng.standard_normal((2, 1, 8)).astype(np.float32)
    assert list(wide.row(cuda.to_device(floats), 1, 0, True)) == list(floats[1, 0])
    assert wide.row(cuda.to_device(floats), 1, 0, False) == (np.float32(0),) * 8  # not read


def test_byte_loads_and_a_block_scale():
    pool = np.arange(2 * 40, dtype=np.uint8).reshape(2, 1, 40)
    pool[1, 0, 4:6] = np.frombuffer(np.float16(-1.5).tobytes(), np.uint8)
    d = cuda.to_device(pool)
    assert [int(w) for w in wide.u16x4(d, 1, 10, True)] == [
        int(pool[1, 0, 10 + 2 * i]) | int(pool[1, 0, 11 + 2 * i]) << 8 for i in range(4)
    ]
    assert [int(np.int32(w).view(np.uint32)) for w in wide.u32x2(d, 0, 8, True)] == [
        int.from_bytes(pool[0, 0, 8:12].tobytes(), "little"),
        int.from_bytes(pool[0, 0, 12:16].tobytes(), "little"),
    ]
    assert wide.half(d, 1, 4, True) == (np.float32(-1.5),)
    assert wide.u16x4(d, 1, 10, False) == (0, 0, 0, 0) and wide.half(d, 1, 4, False) == (0,)


def _bits(word) -> int:
    return int(np.int32(word).view(np.uint32))


def test_byte_arithmetic_signed_bytes_bit_selects_and_byte_permutes():
    word = np.int32(-0x7F0080FF)  # 0x80FF7F01: bytes 0x01, 0x7F, 0xFF, 0x80
    assert [wide.s8(word, shift) for shift in (0, 8, 16, 24)] == [1, 127, -1, -128]
    assert all(type(wide.s8(word, s)) is np.float32 for s in (0, 24))
    # 0x0F0F0F0F picks 0x12345678's low nibbles and 0xABCDEF89's high ones
    picked = wide.select(np.int32(0x0F0F0F0F), np.int32(0x12345678), np.int32(-0x54321077))
    assert _bits(picked) == 0xA2C4E688
    a, b = np.int32(0x44332211), np.int32(-0x778899AB)  # b = 0x88776655
    assert _bits(wide.prmt(a, b, np.int32(0x2107))) == 0x33221188  # b's byte 3, then a's 0..2
    assert _bits(wide.prmt(a, b, np.int32(0x7654))) == 0x88776655  # b itself
    assert _bits(wide.prmt(a, b, np.int32(0x000F))) == 0x111111FF  # b's 0x88 sign, copied
    assert _bits(wide.prmt(a, b, np.int32(0x000B))) == 0x11111100  # a's 0x44: positive


def test_scalar_items_division_and_the_approximations():
    table = np.arange(12, dtype=np.int32).reshape(3, 4)
    d = cuda.to_device(table)
    assert wide.item(d, 2, 3) == 11
    wide.put(d, 1, 2, 99)
    assert d.copy_to_host()[1, 2] == 99
    assert [wide.div(a, b) for a, b in ((7, 2), (0, 3), (2**31 - 1, 7))] == [3, 0, 306783378]
    assert wide.exp2(np.float32(-1)) == np.float32(0.5) and wide.exp2(np.float32(5)) == 1
    assert np.isnan(wide.exp2(np.float32(np.nan))) and wide.rcp(np.float32(4)) == 0.25


@cuda.jit
def _sums(x, lanes, out, out_gpu):
    i = cuda.threadIdx.x
    a, b, c, d = x[i, 0], x[i, 1], x[i, 2], x[i, 3]
    out[i, 0], out[i, 1], out[i, 2], out[i, 3] = wide.lane_sum4(a, b, c, d, lanes)
    s = wide._lane_sum4(a, b, c, d, lanes)
    out_gpu[i, 0], out_gpu[i, 1], out_gpu[i, 2], out_gpu[i, 3] = s


@cuda.jit
def _swaps(x, offset, out, out_gpu):
    i = cuda.threadIdx.x
    values = (x[i, 0], x[i, 1], x[i, 2], x[i, 3], x[i, 4], x[i, 5], x[i, 6], x[i, 7], x[i, 8],
              x[i, 9])  # fmt: skip
    one = wide.xor_swap10(values, offset)
    other = wide._xor_swap10(values, offset)
    for k in range(10):
        out[i, k] = one[k]
        out_gpu[i, k] = other[k]


@pytest.mark.parametrize("lanes", [1, 2, 8, 32])
def test_lane_sums_and_swaps_agree_with_the_shuffles_a_gpu_runs(lanes):
    x = np.arange(32 * 10, dtype=np.float32).reshape(32, 10) / 7
    out, out_gpu = (cuda.to_device(np.zeros((32, 4), np.float32)) for _ in range(2))
    _sums[1, 32](cuda.to_device(x[:, :4].copy()), np.int32(lanes), out, out_gpu)
    groups = x[:, :4].reshape(32 // lanes, lanes, 4).sum(axis=1)
    expect = np.repeat(groups, lanes, axis=0)
    np.testing.assert_allclose(out.copy_to_host(), expect, rtol=1e-6)
    np.testing.assert_array_equal(out.copy_to_host(), out_gpu.copy_to_host())
    swapped, swapped_gpu = (cuda.to_device(np.zeros((32, 10), np.float32)) for _ in range(2))
    _swaps[1, 32](cuda.to_device(x), np.int32(lanes % 32 or 16), swapped, swapped_gpu)
    partner = np.arange(32) ^ (lanes % 32 or 16)
    np.testing.assert_array_equal(swapped.copy_to_host(), x[partner])
    np.testing.assert_array_equal(swapped_gpu.copy_to_host(), x[partner])
