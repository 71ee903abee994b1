"""write_masks against the mask rule spelled out by hand and against the reference's
window_mask; only rows < width and columns < read_len are written (0xAB elsewhere), both
read from the step buffer, whose columns past the width hold live-looking junk."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.cache.kernels.masks import launch_write_masks
from numbakv.reference.step import window_mask

from helpers import churn
from kernel_inputs import (
    BLOCK,
    CAPACITY,
    MAX_WIDTH,
    POISON,
    SEQ_IDS,
    WIDTHS,
    bit_of,
    cache_with_ids,
    check_write_mask,
    mirror_of,
    random_owners,
    ref_config,
    sees_by_hand,
    step_buffer,
    to_d,
)

# -- write_mask ------------------------------------------------------------------


def mask_inputs(rng, capacity: int = CAPACITY):
    """A random table and step, adversarial: seq ids at word edges, padding rows.

    Token 0 is real, and every real token owns a cell below BLOCK at its own position, so
    a row with read_len >= BLOCK always sees something.
    """
    cell_pos = rng.integers(-1, 40, capacity, dtype=np.int32)
    cell_owners = random_owners(rng, capacity)
    seq_ids = rng.choice([*SEQ_IDS, -1], MAX_WIDTH).astype(np.int32)
    seq_ids[0] = rng.choice(SEQ_IDS)
    positions = rng.integers(0, 40, MAX_WIDTH, dtype=np.int32)
    positions[seq_ids < 0] = -1
    for c in np.flatnonzero(rng.random(capacity) < 0.5):  # many cells of the step's seqs
        seq = seq_ids[rng.integers(MAX_WIDTH)]
        if seq >= 0:
            cell_owners[c, seq // 64] |= bit_of(seq)
    cells = rng.integers(0, BLOCK, MAX_WIDTH)
    for t in reversed(range(MAX_WIDTH)):  # token 0's cell last, so no later token takes it
        seq, position, c = seq_ids[t], positions[t], cells[t]
        if seq >= 0:
            cell_pos[c] = position
            cell_owners[c, seq // 64] |= bit_of(seq)
    return cell_pos, cell_owners, seq_ids, positions


@pytest.mark.parametrize("window", [0, 1, 2, 5, 1000])
@pytest.mark.parametrize("width", WIDTHS)
def test_write_mask_matches_the_rule(width, window):
    rng = np.random.default_rng([width, window])
    read_len = int(rng.integers(BLOCK + 1, CAPACITY))  # rarely a multiple of the block
    got = check_write_mask(*mask_inputs(rng), width, read_len, window)
    assert got[0, :read_len].any()  # the test is not vacuous


@pytest.mark.parametrize("read_len", [1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 3, CAPACITY])
def test_write_mask_writes_read_len_columns_only(read_len):
    rng = np.random.default_rng(read_len)
    check_write_mask(*mask_inputs(rng), BLOCK + 1, read_len, 3)


def test_write_mask_padding_rows_are_zero():
    rng = np.random.default_rng(7)
    cell_pos, cell_owners, seq_ids, positions = mask_inputs(rng)
    cell_owners[:] = ~np.uint64(0)  # every cell owned by everyone
    seq_ids[::2] = -1
    positions[::2] = 1000  # a padding row's position must not matter
    got = check_write_mask(cell_pos, cell_owners, seq_ids, positions, MAX_WIDTH, CAPACITY, 0)
    assert not got[::2].any()


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    width=st.integers(1, MAX_WIDTH),
    read_len=st.integers(1, CAPACITY),
    window=st.sampled_from([0, 1, 2, 3, 7, 10_000]),
)
def test_write_mask_random(seed, width, read_len, window):
    rng = np.random.default_rng(seed)
    check_write_mask(*mask_inputs(rng), width, read_len, window)


@settings(max_examples=15, deadline=None)
@given(
    ops=st.lists(st.integers(0, 400), min_size=5, max_size=40),
    window=st.sampled_from([0, 1, 2, 3, 5, 10_000]),
    seed=st.integers(0, 2**32 - 1),
)
def test_write_mask_matches_the_reference_window_mask(ops, window, seed):
    cache = cache_with_ids(ref_config())
    churn(cache, ops)
    snap = cache.snapshot()
    live = cache.live_seqs
    if snap.read_len == 0 or not live:
        return
    # a query step: tokens of live sequences at any position they could hold, then padding
    rng = np.random.default_rng(seed)
    width = int(rng.integers(1, MAX_WIDTH + 1))
    seq_ids = np.full(MAX_WIDTH, -1, np.int32)
    positions = np.full(MAX_WIDTH, -1, np.int32)
    n_tokens = int(rng.integers(1, width + 1))
    seq_ids[:n_tokens] = rng.choice(live, n_tokens)
    positions[:n_tokens] = [rng.integers(0, cache.pos(s) + 2) for s in seq_ids[:n_tokens]]
    # reference
    expect = window_mask(snap.pos, snap.owners, seq_ids[:width], positions[:width], window)
    # device
    cell_pos, cell_owners = mirror_of(cache)
    cell_pos[snap.read_len :] = 0  # past read_len: cells every token would see, if read
    cell_owners[snap.read_len :] = ~np.uint64(0)
    got = check_write_mask(cell_pos, cell_owners, seq_ids, positions, width, snap.read_len, window)
    # compare
    np.testing.assert_array_equal(got[:width, : snap.read_len], expect)


def launch_one(mask_d, cell_pos_d, cell_owners_d, step_d, width, window=0):
    """launch_write_masks over a stack of one mask, `mask_d` [1, max_width, capacity]."""
    windows_d = to_d(np.array([window], np.int32))
    launch_write_masks(mask_d, windows_d, cell_pos_d, cell_owners_d, step_d, width)


def test_write_masks_refuses_bad_extents_and_width_zero_writes_nothing():
    rng = np.random.default_rng(11)
    cell_pos, cell_owners, seq_ids, positions = mask_inputs(rng)
    cells = np.zeros(MAX_WIDTH, np.int32)
    step_d = to_d(step_buffer(cells, positions, seq_ids, 4, CAPACITY))
    mask = np.full((1, MAX_WIDTH, CAPACITY), POISON, np.uint8)
    mask_d, cell_pos_d, cell_owners_d = to_d(mask), to_d(cell_pos), to_d(cell_owners)
    tall_d = to_d(np.zeros((1, MAX_WIDTH + 2, CAPACITY), np.uint8))
    with pytest.raises(ValueError, match=f"width={MAX_WIDTH + 1}"):  # past the step buffer
        launch_one(tall_d, cell_pos_d, cell_owners_d, step_d, MAX_WIDTH + 1)
    with pytest.raises(ValueError, match="width=5"):  # past the mask's rows
        launch_one(to_d(mask[:, :4]), cell_pos_d, cell_owners_d, step_d, 5)
    for pos_d, owners_d in (
        (to_d(cell_pos[:-1]), cell_owners_d),
        (cell_pos_d, to_d(cell_owners[:-1])),
    ):
        with pytest.raises(ValueError, match="capacity"):  # the grid covers the capacity
            launch_one(mask_d, pos_d, owners_d, step_d, 4)
    with pytest.raises(ValueError, match="capacity"):
        launch_one(to_d(mask[:, :, :-1]), cell_pos_d, cell_owners_d, step_d, 4)
    with pytest.raises(ValueError, match="2 windows for 1 masks"):
        windows_d = to_d(np.array([0, 2], np.int32))
        launch_write_masks(mask_d, windows_d, cell_pos_d, cell_owners_d, step_d, 4)
    empty_d = to_d(step_buffer(cells, positions, seq_ids, 0, CAPACITY))
    launch_one(mask_d, cell_pos_d, cell_owners_d, empty_d, 0)
    np.testing.assert_array_equal(mask_d.copy_to_host(), mask)


def test_write_masks_reads_read_len_from_the_step_buffer_and_caps_it():
    # one launch per width serves any read_len: the same arguments, several step buffers;
    # a read_len past the capacity writes no column past it
    rng = np.random.default_rng(12)
    cell_pos, cell_owners, seq_ids, positions = mask_inputs(rng)
    cells = np.zeros(MAX_WIDTH, np.int32)
    mask_d = to_d(np.full((1, MAX_WIDTH, CAPACITY), POISON, np.uint8))
    cell_pos_d, cell_owners_d = to_d(cell_pos), to_d(cell_owners)
    for read_len in (BLOCK + 3, 5, 0, CAPACITY + 7):
        step_d = to_d(step_buffer(cells, positions, seq_ids, 3, read_len))
        launch_one(mask_d, cell_pos_d, cell_owners_d, step_d, 3, window=2)
        got = mask_d.copy_to_host()[0]
        for t in range(3):
            row = sees_by_hand(cell_pos, cell_owners, seq_ids[t], positions[t], 2)
            np.testing.assert_array_equal(got[t, :read_len], row[:read_len])
        if read_len <= CAPACITY:  # columns past read_len keep the widest write's, or poison
            np.testing.assert_array_equal(got[:3, max(BLOCK + 3, read_len) :], POISON)
        np.testing.assert_array_equal(got[3:], POISON)
