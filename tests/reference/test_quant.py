"""The reference's quantized formats (docs/contract.md §4.1) against oracles written apart:
ggml's C quantizers transliterated value by value with float32 scalars (q8_0, q4_0) and
ml_dtypes' float8_e4m3fn (fp8), on random and adversarial blocks; the per-element error
bounds; what non-finite input becomes."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.core.formats import BLOCK, bits_per_value, head_bytes
from numbakv.reference import quant

F32 = np.float32


def ggml_q8_0(x: np.ndarray) -> bytes:
    """quantize_row_q8_0_ref of ggml-quants.c, one value at a time."""
    out = bytearray()
    for block in x.reshape(-1, BLOCK):
        amax = F32(0)
        for v in block:
            amax = max(amax, abs(F32(v)))
        d = F32(amax / F32(127))
        inv = F32(F32(1) / d) if d != 0 else F32(0)
        with np.errstate(over="ignore"):  # fp16 overflows to inf, as in C
            out += np.float16(d).tobytes()
        for v in block:
            y = F32(F32(v) * inv)
            t = F32(np.trunc(y))
            q = t + (np.sign(y) if abs(F32(y - t)) >= 0.5 else 0)  # roundf
            out += np.int8(q).tobytes()
    return bytes(out)


def ggml_q4_0(x: np.ndarray) -> bytes:
    """quantize_row_q4_0_ref of ggml-quants.c, one value at a time."""
    out = bytearray()
    for block in x.reshape(-1, BLOCK):
        amax, largest = F32(0), F32(0)
        for v in block:
            if amax < abs(F32(v)):
                amax, largest = abs(F32(v)), F32(v)
        d = F32(largest / F32(-8))
        inv = F32(F32(1) / d) if d != 0 else F32(0)
        with np.errstate(over="ignore"):
            out += np.float16(d).tobytes()
        for j in range(BLOCK // 2):
            x0 = F32(F32(F32(block[j]) * inv) + F32(8.5))
            x1 = F32(F32(F32(block[j + 16]) * inv) + F32(8.5))
            out += bytes([min(15, int(x0)) | (min(15, int(x1)) << 4)])
    return bytes(out)


def adversarial_blocks(rng: np.random.Generator) -> np.ndarray:
    """[n, 32] float32: zero blocks, one-hot blocks, ties at every rounding midpoint of q8_0
    and q4_0, blocks whose amax is negative, tiny and huge scales, float16 subnormal scales."""
    blocks = [np.zeros(BLOCK), np.eye(BLOCK)[3], -np.eye(BLOCK)[0] * 7]
    for amax in (127.0, 8.0, -8.0, 1e-6, 3e-8, 6e4, 8e6, 1e9):
        halves = (np.arange(BLOCK) - 16 + 0.5) * abs(amax) / 127
        block = halves.copy()
        block[0] = amax
        blocks.append(block)
    blocks.append(rng.integers(-16, 17, BLOCK) / 2.0)  # exact halves of a d of 1/2
    blocks.append(np.full(BLOCK, 0.1))
    return np.array(blocks, F32)


def random_blocks(rng: np.random.Generator, n: int) -> np.ndarray:
    scales = np.exp(rng.uniform(-20, 12, (n, 1)))
    return (rng.standard_normal((n, BLOCK)) * scales).astype(F32)


@pytest.mark.parametrize(
    ("ours", "ggml"), [(quant.q8_0_bytes, ggml_q8_0), (quant.q4_0_bytes, ggml_q4_0)]
)
def test_blocks_equal_ggml_byte_for_byte(ours, ggml):
    rng = np.random.default_rng(0)
    x = np.concatenate([adversarial_blocks(rng), random_blocks(rng, 200)])
    assert ours(x[:212].reshape(-1, 2, 2 * BLOCK)).tobytes() == ggml(x[:212])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e7, 1e7, width=32), min_size=BLOCK, max_size=BLOCK))
def test_any_finite_block_equals_ggml(values):
    x = np.array(values, F32)
    assert quant.q8_0_bytes(x).tobytes() == ggml_q8_0(x)
    assert quant.q4_0_bytes(x).tobytes() == ggml_q4_0(x)


def stored_scale(stored: np.ndarray) -> np.ndarray:
    """[n] float32: the float16 scale of each block of [n, block bytes] uint8."""
    return (
        (stored[:, 0].astype(np.uint16) | (stored[:, 1].astype(np.uint16) << 8))
        .view(np.float16)
        .astype(F32)
    )


def test_q8_0_error_is_at_most_half_a_step_plus_the_scales_rounding():
    rng = np.random.default_rng(1)
    x = np.concatenate([adversarial_blocks(rng)[:-5], random_blocks(rng, 500)])
    stored = quant.q8_0_bytes(x)
    d16 = stored_scale(stored.reshape(-1, 34))[:, None]
    d = (np.abs(x).max(axis=1) / F32(127))[:, None]
    codes = stored.reshape(-1, 34)[:, 2:].view(np.int8).astype(F32)
    error = np.abs(x - quant.q8_0_values(stored).reshape(x.shape))
    # |x - q d| <= d/2 (plus x * (1/d)'s rounding), and d is stored as fp16(d)
    assert (error <= d / 2 + np.abs(codes) * np.abs(d - d16) + 1e-6 * d).all()
    normal = (d16 >= 2**-14)[:, 0]  # fp16 rounds d by at most 2^-11 of it: 127 such steps
    assert (error[normal] <= 0.57 * d16[normal]).all()


def test_q4_0_error_is_half_a_step_but_a_step_at_the_unreachable_extreme():
    rng = np.random.default_rng(2)
    x = random_blocks(rng, 500)
    x = x[np.abs(x).max(axis=1) > 8 * 2**-14]  # scales that are normal float16s
    stored = quant.q4_0_bytes(x).reshape(-1, 18)
    d16 = np.broadcast_to(np.abs(stored_scale(stored))[:, None], x.shape)
    error = np.abs(x - quant.q4_0_values(stored).reshape(x.shape))
    first_max = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
    beyond = x / (first_max / F32(-8)) > 7.5  # code 16 would be needed: clipped to 15
    slack = 1 + 8 * 2**-11  # 8 steps of fp16's rounding of d
    assert (error[~beyond] <= 0.5 * slack * d16[~beyond]).all()
    assert (error <= slack * d16).all() and beyond.any()


def test_e4m3_equals_ml_dtypes_on_every_float_near_its_grid():
    grid = np.arange(256, dtype=np.uint8)
    values = quant.e4m3_values(grid)
    np.testing.assert_array_equal(values, grid.view(ml_dtypes.float8_e4m3fn).astype(F32))
    finite = values[np.isfinite(values)]
    midpoints = (np.sort(finite)[1:] + np.sort(finite)[:-1]) / 2
    near = np.concatenate([finite, midpoints, np.nextafter(midpoints, F32(np.inf)),
                           np.nextafter(midpoints, F32(-np.inf))]).astype(F32)  # fmt: skip
    rng = np.random.default_rng(3)
    x = np.concatenate([near, (rng.standard_normal(20000) * 50).astype(F32), [0.0, -0.0]])
    x = x[np.abs(x) <= 448].astype(F32)
    expect = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(quant.e4m3_bits(x), expect)


def test_e4m3_saturates_and_keeps_nan():
    x = np.array([449, 464, 480, 1e30, np.inf, -500, -np.inf, np.nan], F32)
    assert quant.e4m3_bits(x).tolist() == [0x7E] * 5 + [0xFE, 0xFE, 0x7F]


def test_e4m3_error_is_half_an_ulp():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(50000) * np.exp(rng.uniform(-12, 6, 50000))).astype(F32)
    x = x[np.abs(x) <= 448]
    error = np.abs(x - quant.e4m3_values(quant.e4m3_bits(x)))
    exponent = np.maximum(np.floor(np.log2(np.abs(x) + 1e-45)), -6)  # subnormals: 2^-9 steps
    assert (error <= np.exp2(exponent - 3) / 2).all()


def test_fp8_scales_divide_on_store_and_multiply_on_read():
    x = np.array([[[1.0, -3.0], [96.0, 0.5]]], F32)  # [1 token, 2 heads, 2]
    scales = np.array([0.5, 4.0], F32)
    stored = quant.fp8_bytes(x, scales)
    np.testing.assert_array_equal(stored[0, 0], quant.e4m3_bits(np.array([2.0, -6.0], F32)))
    np.testing.assert_array_equal(quant.fp8_values(stored, scales), x)


def test_a_block_with_nan_or_inf_reads_back_as_nan_and_leaves_its_neighbours():
    x = np.ones((2, 3 * BLOCK), F32)
    x[0, 5], x[1, 70] = np.nan, -np.inf
    for to_bytes, to_values in ((quant.q8_0_bytes, quant.q8_0_values),
                                (quant.q4_0_bytes, quant.q4_0_values)):  # fmt: skip
        values, alone = to_values(to_bytes(x)), to_values(to_bytes(np.ones(BLOCK, F32)))
        assert np.isnan(values[0, :BLOCK]).all() and np.isnan(values[1, 2 * BLOCK :]).all()
        assert (values[0, BLOCK:].reshape(2, BLOCK) == alone).all()
        assert (values[1, : 2 * BLOCK].reshape(2, BLOCK) == alone).all()


def test_bytes_per_value_are_ggml_s():
    assert [bits_per_value(f) for f in ("float32", "float16", "bfloat16", "q8_0", "q4_0",
                                        "fp8_e4m3")] == [32, 16, 16, 8.5, 4.5, 8]  # fmt: skip
    assert head_bytes("q8_0", 128) == 4 * 34 and head_bytes("q4_0", 128) == 4 * 18
