"""scatter_kv and place_tokens against a plain NumPy expectation, on the simulator or a GPU.

Each test reads `# reference`, `# device`, `# compare`. Everything a kernel must not touch
is poisoned first (garbage pool rows, random owners on unlisted cells) and checked byte for
byte afterwards. Sizes straddle the block the launchers use (`kernel_inputs.BLOCK`).
"""

import numpy as np
import pytest

from numbakv.cache.kernels.placement import launch_place_tokens, launch_scatter_kv

from kernel_inputs import (
    CAPACITY,
    MAX_WIDTH,
    OVERFLOW_IN_CAST,
    SEQ_IDS,
    UINT,
    WIDTHS,
    bit_of,
    garbage,
    random_owners,
    step_cells,
    step_inputs,
    to_d,
)

# -- scatter_kv ------------------------------------------------------------------


@OVERFLOW_IN_CAST
@pytest.mark.parametrize("shape", [(1, 1), (2, 3)], ids=["1x1", "2x3"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("storage", [np.float32, np.float16], ids=["f32pool", "f16pool"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32in", "f16in"])
def test_scatter_kv_writes_placed_rows_only(dtype, storage, width, shape):
    rng = np.random.default_rng([width, *shape, np.dtype(dtype).num, np.dtype(storage).num])
    rows = MAX_WIDTH + 7  # some rows are in no cell at all
    k, v = step_inputs(rng, dtype, shape), step_inputs(rng, dtype, shape)
    k_pool, v_pool = garbage(rng, (rows, *shape), storage), garbage(rng, (rows, *shape), storage)
    cells = step_cells(rng, width, rows)
    # reference
    expect_k, expect_v = k_pool.copy(), v_pool.copy()
    placed = cells[:width][cells[:width] >= 0]
    with np.errstate(over="ignore"):
        expect_k[placed] = k[:width][cells[:width] >= 0].astype(storage)
        expect_v[placed] = v[:width][cells[:width] >= 0].astype(storage)
    # device
    k_pool_d, v_pool_d = to_d(k_pool), to_d(v_pool)
    launch_scatter_kv(to_d(k), to_d(v), k_pool_d, v_pool_d, to_d(cells), width)
    got_k, got_v = k_pool_d.copy_to_host(), v_pool_d.copy_to_host()
    # compare: bit-exact, garbage rows included
    uint = UINT[np.dtype(storage)]
    np.testing.assert_array_equal(got_k.view(uint), expect_k.view(uint))
    np.testing.assert_array_equal(got_v.view(uint), expect_v.view(uint))


@OVERFLOW_IN_CAST
def test_scatter_kv_rounds_to_nearest_even():
    # ties 1 + 2**-11 (between 1 and 1 + 2**-10) go to even 1; 1 + 3 * 2**-11 goes up
    k = np.float32([1 + 2**-11, 1 + 3 * 2**-11, 65520, -(2**-25), 2**-25 + 2**-40])
    k = k.reshape(5, 1, 1)
    k_pool_d = to_d(np.zeros((5, 1, 1), np.float16))
    v_pool_d = to_d(np.zeros((5, 1, 1), np.float16))
    launch_scatter_kv(to_d(k), to_d(k), k_pool_d, v_pool_d, to_d(np.arange(5, dtype=np.int32)), 5)
    got = k_pool_d.copy_to_host().ravel()
    expect = np.float16([1, 1 + 2**-9, np.inf, -0.0, 2**-24])
    np.testing.assert_array_equal(got.view(np.uint16), expect.view(np.uint16))


def test_scatter_kv_refuses_a_width_past_its_arrays():
    cells_d = to_d(np.zeros(4, np.int32))
    k_d = to_d(np.zeros((4, 1, 1), np.float32))
    with pytest.raises(ValueError, match="width=5"):
        launch_scatter_kv(k_d, k_d, k_d, k_d, cells_d, 5)


# -- place_tokens ----------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
def test_place_tokens_sets_position_and_owner_bit(width):
    rng = np.random.default_rng(width)
    cell_pos = rng.integers(-1, 50, CAPACITY, dtype=np.int32)
    cell_owners = random_owners(rng, CAPACITY)
    cells = step_cells(rng, width, CAPACITY)
    positions = rng.integers(0, 1000, MAX_WIDTH, dtype=np.int32)
    seq_ids = rng.choice([*SEQ_IDS, 1, 100, 150], MAX_WIDTH).astype(np.int32)
    seq_ids[:width][cells[:width] < 0] = -1  # padded rows
    # reference
    expect_pos, expect_owners = cell_pos.copy(), cell_owners.copy()
    for t in range(width):
        if cells[t] >= 0:
            expect_pos[cells[t]] = positions[t]
            expect_owners[cells[t], seq_ids[t] // 64] |= bit_of(seq_ids[t])
    # device
    cell_pos_d, cell_owners_d = to_d(cell_pos), to_d(cell_owners)
    launch_place_tokens(
        to_d(cells), to_d(positions), to_d(seq_ids), width, cell_pos_d, cell_owners_d
    )
    # compare
    np.testing.assert_array_equal(cell_pos_d.copy_to_host(), expect_pos)
    np.testing.assert_array_equal(cell_owners_d.copy_to_host(), expect_owners)


def test_place_tokens_skips_a_row_without_a_sequence():
    # a real cell with seq_id -1 is not a token: writing only its position would leave a
    # cell with a position and no owner
    cell_pos_d = to_d(np.full(4, -1, np.int32))
    cell_owners_d = to_d(np.zeros((4, 1), np.uint64))
    cells, positions, seq_ids = (to_d(np.array(x, np.int32)) for x in ([2, 3], [5, 6], [-1, 0]))
    launch_place_tokens(cells, positions, seq_ids, 2, cell_pos_d, cell_owners_d)
    np.testing.assert_array_equal(cell_pos_d.copy_to_host(), [-1, -1, -1, 6])
    np.testing.assert_array_equal(cell_owners_d.copy_to_host().ravel(), [0, 0, 0, 1])
