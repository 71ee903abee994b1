"""Quantized storage on the device (docs/contract.md §4.1): the write kernel stores exactly
the reference's bytes for every format, from float32 and float16 inputs, on random and
adversarial blocks (NaN, inf, zero blocks, rounding midpoints, amax blocks, fp8
saturation); the float16 and e4m3 bit arithmetic equals NumPy's on every class of input;
and the device cache passes the kit's table comparison (pool bytes, attention over the
dequantized values, clones, rewinds and growth) over quantized and mixed configs."""

import ml_dtypes
import numpy as np
import pytest

from numbakv import CellCache
from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import quant
from numbakv.cache.kernels.placement import launch_scatter_kv
from numbakv.cache.kernels.step_buffer import host_step
from numbakv.core.formats import BLOCK, row_width
from numbakv.reference import quant as ref_quant
from numbakv.reference.storage import to_storage
from numbakv.testing import QUANTIZED_CONFIGS, Op, check_cache, run_script

QUANTIZED = ("q8_0", "q4_0", "fp8_e4m3")
KINDS = {"float32": "float", "float16": "float", "bfloat16": "bfloat16"}
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's NumPy scalars


def adversarial(rng: np.random.Generator, n_heads: int, head_dim: int) -> np.ndarray:
    """[tokens, n_heads, head_dim] float32: per block of 32, one of zeros, a lone NaN, a lone
    ±inf, q8_0 midpoints, a negative amax, tiny and huge magnitudes, fp8's saturation."""
    kinds = []
    for amax in (1.0, -8.0, 1e-7, 6e4, 9e6):
        midpoints = (np.arange(BLOCK) - 16 + 0.5) * abs(amax) / 127
        midpoints[0] = amax
        kinds.append(midpoints)
    kinds += [np.zeros(BLOCK), np.full(BLOCK, 500.0), np.linspace(-460, 460, BLOCK)]
    kinds.append(np.array([1e-38, -1e-38, 5e-39] + [0.0] * (BLOCK - 3)))  # 1 / d overflows
    for special in (np.nan, np.inf, -np.inf):
        block = rng.standard_normal(BLOCK)
        block[int(rng.integers(BLOCK))] = special
        kinds.append(block)
    blocks = np.array(
        kinds + [rng.standard_normal(BLOCK) * 10.0 ** rng.uniform(-6, 6) for _ in range(8)]
    )
    rows = blocks[rng.integers(len(blocks), size=(6, n_heads, head_dim // BLOCK))]
    return rows.reshape(6, n_heads, head_dim).astype(np.float32)


@pytest.mark.parametrize("k_format", QUANTIZED)
@pytest.mark.parametrize("v_format", (*QUANTIZED[:1], "float16"))
@pytest.mark.parametrize("input_dtype", ["float32", "float16", "bfloat16"])
def test_the_write_kernel_stores_the_reference_s_bytes(k_format, v_format, input_dtype):
    # bfloat16 inputs arrive as their uint16 patterns (storage.IO_KINDS)
    rng = np.random.default_rng([QUANTIZED.index(k_format), len(v_format)])
    n_heads, head_dim, rows = 2, 64, 8
    k, v = adversarial(rng, n_heads, head_dim), adversarial(rng, n_heads, head_dim)
    dtype = ml_dtypes.bfloat16 if input_dtype == "bfloat16" else input_dtype
    k, v = k.astype(dtype), v.astype(dtype)
    inputs = [x.view(np.uint16) if input_dtype == "bfloat16" else x for x in (k, v)]
    scales = np.array([[0.25, 3.0], [2.0, 0.5]], np.float32)  # [K, V] x heads
    cells = np.array([3, -1, 0, 7, 5, 1], np.int32)  # a padded row is skipped
    before = [
        np.full(
            (rows, n_heads, row_width(fmt, head_dim)),
            0xAB,
            np.float16 if fmt == "float16" else np.uint8,
        )
        for fmt in (k_format, v_format)
    ]
    pools = [cuda.to_device(b) for b in before]
    step = cuda.to_device(host_step(cells, np.arange(6), np.zeros(6), 6, rows))
    kinds = tuple(KINDS.get(f, f) for f in (k_format, v_format))
    launch_scatter_kv(
        cuda.to_device(inputs[0]),
        cuda.to_device(inputs[1]),
        *pools,
        step,
        6,
        kinds=kinds,
        kv_scales=cuda.to_device(scales),
    )
    untouched = np.setdiff1d(np.arange(rows), cells)
    for which, (x, fmt, pool) in enumerate(zip((k, v), (k_format, v_format), pools, strict=True)):
        got = pool.copy_to_host()
        expect = to_storage(x.astype(np.float32), fmt, scales[which])
        placed = cells >= 0
        np.testing.assert_array_equal(
            got[cells[placed]].view(np.uint8), expect[placed].view(np.uint8), err_msg=fmt
        )
        np.testing.assert_array_equal(got[untouched], before[which][untouched])


@cuda.jit
def bits_kernel(x, half, e4m3, half_back, e4m3_back):
    i = cuda.grid(1)
    if i < x.shape[0]:
        half[i] = quant.half_bits(x[i])
        e4m3[i] = quant.e4m3_bits(x[i])
        half_back[i] = quant.half_value(np.int32(i % 65536))
        e4m3_back[i] = quant.e4m3_value(np.int32(i % 256))


def test_float16_and_e4m3_bit_arithmetic_equals_numpy():
    rng = np.random.default_rng(5)
    n = 4096
    magnitudes = np.concatenate(
        [
            2.0 ** rng.uniform(-30, 20, n - 16),  # float16 subnormals to overflow
            [
                0.0,
                65504.0,
                65519.99,
                65520.0,
                1e30,
                2.0**-24,
                2.0**-25,
                3 * 2.0**-26,
                448.0,
                464.0,
                2.0**-9,
                2.0**-10,
                2.0**-6,
                np.inf,
                np.nan,
                1.0,
            ],
        ]
    )
    x = (magnitudes * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    out = [cuda.device_array(n, np.int32) for _ in range(2)]
    back = [cuda.device_array(n, np.float32) for _ in range(2)]
    bits_kernel[32, 128](cuda.to_device(x), *out, *back)
    half, e4m3 = (o.copy_to_host() for o in out)
    np.testing.assert_array_equal(half, ref_quant.half_bits(x).astype(np.int32))
    np.testing.assert_array_equal(e4m3, ref_quant.e4m3_bits(x).astype(np.int32))
    half_back, e4m3_back = (b.copy_to_host() for b in back)
    patterns = np.arange(n) % 65536
    np.testing.assert_array_equal(half_back, ref_quant.half_values(patterns.astype(np.uint16)))
    np.testing.assert_array_equal(
        e4m3_back, ref_quant.e4m3_values((np.arange(n) % 256).astype(np.uint8))
    )


def test_the_device_cache_holds_to_the_reference_over_quantized_pools():
    hazards = ("fork-partial-then-append", "growth-mid-step")
    report = check_cache(CellCache, compare="table", configs=QUANTIZED_CONFIGS, max_examples=4,
                         max_ops=12, hazards=hazards, report=True)  # fmt: skip
    assert report.growths > 0 and report.verbs["seq_clone"] > 0


def test_rewinds_and_clones_keep_quantized_cells_byte_for_byte():
    new, rewind = Op("seq_new"), Op("rewind", (0, 1))
    ops = [
        new,
        Op("step", ((0, 0, 0), None, 2, 0)),
        Op("seq_clone", (0, 2)),
        rewind,
        Op("step", ((1, 0), None, 2, 1)),
        Op("seq_rm", (1,)),
        Op("step", ((0, 0), 4, 1, 2)),
    ]
    for config in QUANTIZED_CONFIGS[1:3]:  # K q4_0 / V q8_0 windowed; fp8, two layers
        run_script(CellCache, config, ops, compare="table")
