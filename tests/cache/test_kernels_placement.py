"""scatter_kv and prepare_tokens against a plain NumPy expectation, on the simulator or a GPU.

Each test reads `# reference`, `# device`, `# compare`. Everything a kernel must not touch
is poisoned first (garbage pool rows, random owners on unlisted cells, -9 in seq_cells) and
checked byte for byte afterwards; the step buffer's columns past the width hold live-looking
junk (real cells, sequences and positions). Sizes straddle the block the launchers use
(`kernel_inputs.BLOCK`).
"""

import numpy as np
import pytest

from numbakv.cache.kernels.placement import launch_prepare_tokens, launch_scatter_kv
from numbakv.cache.kernels.step_buffer import (
    CELLS,
    POSITIONS,
    READ_LEN,
    ROWS,
    SCALARS,
    SEQ_IDS,
    WIDTH,
    columns,
    host_step,
)

from kernel_inputs import (
    BLOCK,
    CAPACITY,
    MAX_WIDTH,
    OVERFLOW_IN_CAST,
    UINT,
    WIDTHS,
    bit_of,
    garbage,
    random_owners,
    step_buffer,
    step_cells,
    step_inputs,
    to_d,
)

# -- the step buffer -------------------------------------------------------------------


def test_host_step_lays_out_the_rows_and_scalars():
    step = host_step([4, -1, 6], [0, -1, 9], [2, -1, 65], read_len=17, max_width=5)
    assert step.dtype == np.int32 and step.shape == (ROWS, columns(5)) == (4, 5)
    assert step[CELLS].tolist() == [4, -1, 6, -1, -1]  # -1 past the width
    assert step[POSITIONS].tolist() == [0, -1, 9, -1, -1]
    assert step[SEQ_IDS].tolist() == [2, -1, 65, -1, -1]
    assert (step[SCALARS, WIDTH], step[SCALARS, READ_LEN]) == (3, 17)
    assert host_step([7], [0], [0]).shape == (4, 2)  # room for the two scalars
    assert host_step([], [], [], max_width=1)[SCALARS, :2].tolist() == [0, 0]


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
    cells = step_cells(rng, width, rows)  # real cells past the width
    positions, seq_ids = np.arange(MAX_WIDTH, dtype=np.int32), np.zeros(MAX_WIDTH, np.int32)
    step = step_buffer(cells, positions, seq_ids, width)
    # reference
    expect_k, expect_v = k_pool.copy(), v_pool.copy()
    placed = cells[:width][cells[:width] >= 0]
    with np.errstate(over="ignore"):
        expect_k[placed] = k[:width][cells[:width] >= 0].astype(storage)
        expect_v[placed] = v[:width][cells[:width] >= 0].astype(storage)
    # device
    k_pool_d, v_pool_d = to_d(k_pool), to_d(v_pool)
    launch_scatter_kv(to_d(k), to_d(v), k_pool_d, v_pool_d, to_d(step), width)
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
    step = host_step(np.arange(5), np.arange(5), np.zeros(5))
    launch_scatter_kv(to_d(k), to_d(k), k_pool_d, v_pool_d, to_d(step), 5)
    got = k_pool_d.copy_to_host().ravel()
    expect = np.float16([1, 1 + 2**-9, np.inf, -0.0, 2**-24])
    np.testing.assert_array_equal(got.view(np.uint16), expect.view(np.uint16))


def test_scatter_kv_refuses_a_width_past_its_arrays():
    step_d = to_d(host_step(np.zeros(4), np.arange(4), np.zeros(4)))  # 4 columns
    k_d = to_d(np.zeros((4, 1, 1), np.float32))
    with pytest.raises(ValueError, match="width=5"):
        launch_scatter_kv(k_d, k_d, k_d, k_d, step_d, 5)
    k5_d = to_d(np.zeros((5, 1, 1), np.float32))
    with pytest.raises(ValueError, match="width=5"):  # the step buffer is the narrowest
        launch_scatter_kv(k5_d, k5_d, k5_d, k5_d, step_d, 5)
    with pytest.raises(ValueError, match="width=3"):  # k is the narrowest
        launch_scatter_kv(k_d[:2], k_d, k_d, k_d, step_d, 3)


# -- prepare_tokens: the table mirror and the position -> cell table in one launch -----------

MAX_SEQ_LEN = MAX_WIDTH + 5  # room for every token of the step in one sequence


def prepare_inputs(rng, width: int):
    """A step of up to MAX_WIDTH tokens over sequences at owner-word edges, some repeated,
    at distinct positions per sequence; inside the width some rows are padding (cell -1,
    sequence -1), some have a cell and no sequence, some a sequence and no cell. Past the
    width: real cells, sequences and positions. Returns (cells, positions, seq_ids)."""
    cells = step_cells(rng, width, CAPACITY)
    seq_ids = rng.choice([0, 63, 64, 127, 199, 1, 100], MAX_WIDTH).astype(np.int32)
    positions = np.zeros(MAX_WIDTH, np.int32)
    for s in np.unique(seq_ids):  # distinct positions: no two tokens share seq_cells[s, p]
        is_s = seq_ids == s
        positions[is_s] = rng.permutation(MAX_SEQ_LEN)[: np.count_nonzero(is_s)]
    seq_ids[:width][cells[:width] < 0] = -1  # padded rows
    odd = rng.random(width)
    seq_ids[:width][(odd < 0.1) & (cells[:width] >= 0)] = -1  # a cell, no sequence
    cells[:width][(odd > 0.9) & (seq_ids[:width] >= 0)] = -1  # a sequence, no cell
    return cells, positions, seq_ids


def check_prepare_tokens(cells, positions, seq_ids, width, seed):
    """launch_prepare_tokens on poisoned tables; compares all four byte for byte."""
    rng = np.random.default_rng(seed)
    cell_pos = rng.integers(-1, 50, CAPACITY, dtype=np.int32)
    cell_owners = random_owners(rng, CAPACITY)
    seq_cells = np.full((200, MAX_SEQ_LEN), -9, np.int32)
    seq_len = rng.integers(0, 8, 200, dtype=np.int32)
    # reference: what place_tokens (position, owner bit) and record_tokens (seq_cells, the
    # longest length) each wrote, for rows t < width with a cell and a sequence
    expect_pos, expect_owners = cell_pos.copy(), cell_owners.copy()
    expect_cells, expect_len = seq_cells.copy(), seq_len.copy()
    for t in range(width):
        cell, seq, p = int(cells[t]), int(seq_ids[t]), int(positions[t])
        if cell >= 0 and seq >= 0:
            expect_pos[cell] = p
            expect_owners[cell, seq // 64] |= bit_of(seq)
            expect_cells[seq, p] = cell
            expect_len[seq] = max(expect_len[seq], p + 1)
    # device
    tables = [to_d(x) for x in (cell_pos, cell_owners, seq_cells, seq_len)]
    step = step_buffer(cells, positions, seq_ids, width)
    launch_prepare_tokens(to_d(step), width, *tables)
    # compare
    for got, expect in zip(
        tables, (expect_pos, expect_owners, expect_cells, expect_len), strict=True
    ):
        np.testing.assert_array_equal(got.copy_to_host(), expect)
    return expect_len - seq_len


@pytest.mark.parametrize("width", [0, *WIDTHS])
def test_prepare_tokens_writes_the_mirror_and_the_position_table(width):
    rng = np.random.default_rng(width)
    grown = check_prepare_tokens(*prepare_inputs(rng, width), width, seed=width + 1)
    assert (grown > 0).any() or width == 0  # the test is not vacuous


def test_prepare_tokens_skips_a_row_without_a_sequence_or_a_cell():
    # a real cell with sequence -1 is not a token: writing only its position would leave a
    # cell with a position and no owner; a sequence without a cell has nothing to record
    cells, positions, seq_ids = ([2, 3, -1, 1], [5, 6, 7, 4], [-1, 0, 0, 1])
    cells, positions, seq_ids = (
        np.array([*x, 0, 0], np.int32) for x in (cells, positions, seq_ids)
    )
    step_d = to_d(step_buffer(cells, positions, seq_ids, 4))  # past the width: cell 0, seq 0
    cell_pos_d = to_d(np.full(4, -1, np.int32))
    cell_owners_d = to_d(np.zeros((4, 1), np.uint64))
    seq_cells_d = to_d(np.full((2, 8), -1, np.int32))
    seq_len_d = to_d(np.zeros(2, np.int32))
    launch_prepare_tokens(step_d, 4, cell_pos_d, cell_owners_d, seq_cells_d, seq_len_d)
    np.testing.assert_array_equal(cell_pos_d.copy_to_host(), [-1, 4, -1, 6])
    np.testing.assert_array_equal(cell_owners_d.copy_to_host().ravel(), [0, 2, 0, 1])
    expect_cells = np.full((2, 8), -1, np.int32)
    expect_cells[0, 6], expect_cells[1, 4] = 3, 1
    np.testing.assert_array_equal(seq_cells_d.copy_to_host(), expect_cells)
    np.testing.assert_array_equal(seq_len_d.copy_to_host(), [7, 5])


@pytest.mark.parametrize("width", [1, BLOCK + 1])
def test_prepare_tokens_keeps_the_longest_length_of_racing_tokens(width):
    # every token of one sequence, in any order: the length is the largest position + 1,
    # and a length already past the step's positions is never lowered
    rng = np.random.default_rng([width, 3])
    positions = rng.permutation(MAX_WIDTH).astype(np.int32) + 5
    cells = rng.permutation(CAPACITY)[:MAX_WIDTH].astype(np.int32)
    seq_ids = np.ones(MAX_WIDTH, np.int32)
    step_d = to_d(step_buffer(cells, positions, seq_ids, width))
    for start in (0, MAX_SEQ_LEN):
        seq_cells_d = to_d(np.full((2, MAX_SEQ_LEN), -1, np.int32))
        seq_len_d = to_d(np.array([0, start], np.int32))
        mirror = to_d(np.full(CAPACITY, -1, np.int32)), to_d(np.zeros((CAPACITY, 1), np.uint64))
        launch_prepare_tokens(step_d, width, *mirror, seq_cells_d, seq_len_d)
        assert seq_len_d.copy_to_host().tolist() == [0, max(start, positions[:width].max() + 1)]
        got = seq_cells_d.copy_to_host()[1]
        np.testing.assert_array_equal(got[positions[:width]], cells[:width])
        assert np.count_nonzero(got >= 0) == width  # past the width: nothing recorded


def test_prepare_tokens_refuses_a_width_past_the_step_buffer():
    step_d = to_d(host_step([0, 1], [0, 1], [0, 0]))
    tables = (
        to_d(np.full(4, -1, np.int32)), to_d(np.zeros((4, 1), np.uint64)),
        to_d(np.full((1, 4), -1, np.int32)), to_d(np.zeros(1, np.int32)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="width=3"):
        launch_prepare_tokens(step_d, 3, *tables)
    launch_prepare_tokens(step_d, 0, *tables)  # width 0: nothing launched, nothing written
    assert (tables[0].copy_to_host() == -1).all() and not tables[3].copy_to_host().any()
