"""The device model's kernels alone against NumPy (`numbakv.serve.model`'s functions), on
shapes past one tile of rows (TILE) and one chunk of K (CHUNK), with more items than threads
and grids of several blocks on both axes, so that every grid-stride loop turns."""

import numpy as np
import pytest

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels.step_buffer import host_step
from numbakv.device_model import kernels
from numbakv.device_model.kernels import LIVE, LOGITS_AT, TOKENS
from numbakv.device_model.tiles import CHUNK, THREADS, TILE, tile_grid
from numbakv.device_model.weights import rotary_table
from numbakv.serve.model import ModelConfig, rms_norm, rotate, silu

WIDTH = TILE + 2  # two row tiles, the second partial
K = CHUNK + 6  # two chunks, the second partial
EPS = np.float32(1e-5)
GRIDS = ["tile_grid", (2, 3)]  # the model's geometry, and several blocks on x and y


def floats(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def identity(width: int) -> np.ndarray:
    """The token map of every token of a step of `width`: [width, 0, 1, .., width - 1]."""
    return np.array([width, *range(width)], np.int32)


def grid_of(grid, n_rows: int, n_items: int):
    return tile_grid(n_rows, n_items) if grid == "tile_grid" else (grid, THREADS)


def close(got, expect):
    np.testing.assert_allclose(got, expect, rtol=2e-5, atol=2e-5 * np.abs(expect).max())


def test_embed_gathers_the_tokens_rows():
    rng = np.random.default_rng(0)
    table, tokens = floats(rng, 11, 5), rng.integers(0, 11, 7)
    inputs = np.zeros((3, 8), np.int32)
    inputs[TOKENS, :7] = tokens
    inputs[LIVE, 0] = 6  # the last row is padding no one asked for: untouched
    x = cuda.to_device(np.full((7, 5), 3.0, np.float32))
    kernels.embed[(1, 1), 4](cuda.to_device(inputs), cuda.to_device(table), x)
    got = x.copy_to_host()
    np.testing.assert_array_equal(got[:6], table[tokens[:6]])
    assert (got[6] == 3).all()


@pytest.mark.parametrize("grid", GRIDS)
def test_qkv_rotary_is_norm_projection_and_rotary_at_the_positions(grid):
    rng = np.random.default_rng(1)
    n_q, n_kv, head_dim, max_seq_len = 2, 1, 4, 12
    x, norm_w = floats(rng, WIDTH, K), floats(rng, K)
    w = floats(rng, K, (n_q + 2 * n_kv) * head_dim)
    positions = rng.integers(0, max_seq_len, WIDTH)
    positions[[3, WIDTH - 1]] = -1  # padding rotates as position 0
    step = host_step(np.zeros(WIDTH), positions, np.zeros(WIDTH))
    rot = rotary_table(ModelConfig(head_dim=head_dim), max_seq_len)
    q = cuda.device_array((WIDTH, n_q, head_dim), np.float32)
    k, v = (cuda.device_array((WIDTH, n_kv, head_dim), np.float32) for _ in range(2))
    launch = grid_of(grid, WIDTH, (n_q + 2 * n_kv) * head_dim // 2)
    kernels.qkv_rotary[launch](
        cuda.to_device(x), cuda.to_device(identity(WIDTH)), cuda.to_device(norm_w), EPS,
        cuda.to_device(w), cuda.to_device(rot), cuda.to_device(step), q, k, v,
    )  # fmt: skip
    h = rms_norm(x, norm_w, EPS) @ w
    at = np.maximum(positions, 0)
    cos, sin = rot[0, at][:, None], rot[1, at][:, None]
    split = np.split(h, [n_q * head_dim, (n_q + n_kv) * head_dim], axis=1)
    q_expect, k_expect, v_expect = (s.reshape(WIDTH, -1, head_dim) for s in split)
    close(q.copy_to_host(), rotate(q_expect, cos, sin))
    close(k.copy_to_host(), rotate(k_expect, cos, sin))
    close(v.copy_to_host(), v_expect)


@pytest.mark.parametrize("grid", GRIDS)
def test_residual_matmul_adds_in_place(grid):
    rng = np.random.default_rng(2)
    a, w, x = floats(rng, WIDTH, K), floats(rng, K, 9), floats(rng, WIDTH, 9)
    x_d = cuda.to_device(x)
    live = identity(WIDTH)
    live[0] = WIDTH - 1  # the last row is padding no one asked for: untouched
    kernels.residual_matmul[grid_of(grid, WIDTH, 9)](
        cuda.to_device(a), cuda.to_device(live), cuda.to_device(w), x_d
    )
    got = x_d.copy_to_host()
    close(got[:-1], (x + a @ w)[:-1])
    np.testing.assert_array_equal(got[-1], x[-1])


@pytest.mark.parametrize("grid", GRIDS)
def test_a_shards_matmul_then_add_rows_is_the_residual_matmul(grid):
    """A tensor-parallel shard's two halves of residual_matmul: y = a @ w, then x += y,
    each for the live rows only."""
    rng = np.random.default_rng(5)
    a, w, x = floats(rng, WIDTH, K), floats(rng, K, 9), floats(rng, WIDTH, 9)
    stale = floats(rng, WIDTH, 9)
    x_d, y_d = cuda.to_device(x), cuda.to_device(stale)
    live = identity(WIDTH)
    live[0] = WIDTH - 1
    kernels.matmul[grid_of(grid, WIDTH, 9)](
        cuda.to_device(a), cuda.to_device(live), cuda.to_device(w), y_d
    )
    y = y_d.copy_to_host()
    close(y[:-1], (a @ w)[:-1])
    np.testing.assert_array_equal(y[-1], stale[-1])
    kernels.add_rows[(2, 1), 8](cuda.to_device(live), y_d, x_d)  # a 1-d grid, as embed's
    got = x_d.copy_to_host()
    np.testing.assert_array_equal(got[:-1], x[:-1] + y[:-1])
    np.testing.assert_array_equal(got[-1], x[-1])


@pytest.mark.parametrize("grid", GRIDS)
def test_swiglu_is_silu_gate_times_up_of_the_normed_rows(grid):
    rng = np.random.default_rng(3)
    x, norm_w = floats(rng, WIDTH, K), floats(rng, K)
    w_gate, w_up = floats(rng, K, 6), floats(rng, K, 6)
    h = cuda.device_array((WIDTH, 6), np.float32)
    kernels.swiglu[grid_of(grid, WIDTH, 6)](
        cuda.to_device(x), cuda.to_device(identity(WIDTH)), cuda.to_device(norm_w), EPS,
        cuda.to_device(w_gate), cuda.to_device(w_up), h,
    )  # fmt: skip
    normed = rms_norm(x, norm_w, EPS)
    close(h.copy_to_host(), silu(normed @ w_gate) * (normed @ w_up))


@pytest.mark.parametrize("grid", GRIDS)
def test_lm_head_reads_only_the_tokens_of_logits_at(grid):
    rng = np.random.default_rng(4)
    x, norm_w, w = floats(rng, WIDTH, K), floats(rng, K), floats(rng, K, 7)
    logits_at = rng.integers(0, WIDTH, TILE + 1)  # two row tiles, repeats likely
    inputs = np.zeros((3, 24), np.int32)
    inputs[LOGITS_AT, 0] = len(logits_at)
    inputs[LOGITS_AT, 1 : 1 + len(logits_at)] = logits_at
    out = cuda.to_device(np.full((20, 7), 7.0, np.float32))
    inputs_d = cuda.to_device(inputs)
    kernels.lm_head[grid_of(grid, WIDTH, 7)](
        cuda.to_device(x), inputs_d[LOGITS_AT], cuda.to_device(norm_w), EPS, cuda.to_device(w),
        out,
    )  # fmt: skip
    got = out.copy_to_host()
    close(got[: len(logits_at)], rms_norm(x[logits_at], norm_w, EPS) @ w)
    assert (got[len(logits_at) :] == 7).all()  # rows past the count are untouched
