"""Mask pixels: a recorded step's, counted from each token's visible slice of its
sequence's cells, equal its whole mask (the mask rule of docs/contract.md §3, evaluated
for every token and cell) binned; a live step's are its own mask binned."""

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv import Recorder
from numbakv.reference import CellCache
from numbakv.reference.step import window_mask
from numbakv.trace.scan import blocks
from numbakv.viz import mask_pixels
from numbakv.viz.pixels import PAIRS_PER_BLOCK

from helpers import churn, small_config, step_with


def binned(mask: np.ndarray, cells: tuple[int, int], cell_bin: int, token_bin: int):
    """[rows, cols] int64: `mask` ([width, read_len]) over cells [cells[0], cells[1])
    summed over blocks of token_bin tokens and cell_bin cells."""
    block = mask[:, cells[0] : cells[1]].astype(np.int64)
    rows = np.add.reduceat(block, np.arange(0, len(block), token_bin), axis=0)
    return np.add.reduceat(rows, np.arange(0, cells[1] - cells[0], cell_bin), axis=1)


@pytest.mark.parametrize(
    ("window", "cells", "cell_bin", "token_bin"),
    [(0, (0, 40), 1, 1), (2, (3, 31), 4, 2), (3, (10, 12), 1, 3)],
)
def test_a_recorded_steps_mask_pixels_are_its_mask_binned(window, cells, cell_bin, token_bin):
    cache = CellCache(small_config(n_layers=3, windows=(0, 2, 3), capacity=64, max_width=8))
    recorder = Recorder(cache)
    a, b = cache.seq_new(), cache.seq_new()
    for ids in ([a] * 5 + [b] * 3, [a, b, b, a], [b] * 6):
        step_with(cache, ids)
    c = cache.seq_clone(a, upto=3)
    live = step_with(cache, [a, c, b, c, c], width=7)
    trace = recorder.trace()
    step = trace.step(trace.step_frames[-1])
    np.testing.assert_array_equal(step.mask(window), live.mask(window))
    hi = min(cells[1], step.read_len)
    pixels = mask_pixels(step, window, (cells[0], hi), cell_bin, token_bin)
    mask = step.mask(window)[:, cells[0] : hi].astype(np.int64)
    rows = np.add.reduceat(mask, np.arange(0, step.width, token_bin), axis=0)
    np.testing.assert_array_equal(
        pixels.attended, np.add.reduceat(rows, np.arange(0, hi - cells[0], cell_bin), axis=1)
    )
    np.testing.assert_array_equal(
        mask_pixels(live, window, (cells[0], hi), cell_bin, token_bin).attended, pixels.attended
    )


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.integers(0, 200), min_size=1, max_size=40),
    max_seqs=st.sampled_from([4, 70]),  # ids past 63 live in a second owner word
    window=st.sampled_from([0, 1, 2, 5]),
    pad=st.integers(0, 3),
    bins=st.tuples(st.integers(1, 5), st.integers(1, 4)),
    cut=st.tuples(st.integers(0, 8), st.integers(0, 8)),
    block=st.sampled_from([3, PAIRS_PER_BLOCK]),
)
def test_mask_pixels_of_random_steps_are_the_mask_binned(
    ops, max_seqs, window, pad, bins, cut, block
):
    config = small_config(n_layers=4, max_seqs=max_seqs, capacity=40, windows=(0, 1, 2, 5))
    cache = CellCache(config)
    recorder = Recorder(cache)
    churn(cache, ops)
    while len(cache.live_seqs) < min(64, max_seqs):
        cache.seq_new()
    if max_seqs > 64:  # id 64 shares a sequence's cells, in a second owner word
        cache.seq_clone(cache.live_seqs[ops[0] % 64])
    live = cache.live_seqs[::-1]
    if n := min(4, cache.free_cells):
        step_with(cache, [live[i % 3] for i in range(n)], width=n + pad)
    trace = recorder.trace()
    for frame in trace.step_frames[-3:]:
        step = trace.step(frame)
        cells = (
            min(cut[0], step.read_len),
            max(min(cut[0], step.read_len), step.read_len - cut[1]),
        )
        mask = window_mask(
            step.snapshot.pos, step.snapshot.owners, step.seq_ids, step.positions, window
        )
        with patch("numbakv.viz.pixels.PAIRS_PER_BLOCK", block):
            pixels = mask_pixels(step, window, cells, *bins)
        assert pixels.attended.sum() == mask[:, cells[0] : cells[1]].sum()
        if cells[1] > cells[0]:
            np.testing.assert_array_equal(pixels.attended, binned(mask, cells, *bins))


def test_blocks_split_the_pairs_in_order_and_never_below_one_token():
    counts = np.array([3, 0, 9, 2, 2, 0, 5])
    split = list(blocks(counts, 4))
    assert [(b.start, b.stop) for b in split] == [(0, 2), (2, 3), (3, 6), (6, 7)]
    assert list(blocks(np.zeros(0, dtype=np.int64), 4)) == []
