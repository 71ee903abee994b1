"""Owner pixels sum what each pixel holds from the stretches of steps the cells of a column
hold a label, as integrals of a count, and find a majority from its bits. Against a dense
count of every (step, column, label) on random stretches: the sums, the label held, and a
majority found only where there is one (bits that name no label, or a label that holds
less than half, are MIXED)."""

import numpy as np
import pytest

from numbakv import Recorder
from numbakv.core.snapshot import FREE
from numbakv.reference import CellCache
from numbakv.viz import owner_pixels, owners_of, pixels
from numbakv.viz.owners import MIXED
from numbakv.viz.pixels import _Integrals, _majority_labels, edges

from helpers import small_config, step_with


def dense(cols, labels, starts, ends, shape, n_steps) -> np.ndarray:
    """[n_steps, cols, labels] int64: how many cells of each column hold each label."""
    counts = np.zeros((n_steps, *shape), dtype=np.int64)
    for col, label, start, end in zip(cols, labels, starts, ends, strict=True):
        counts[start:end, col, label] += 1
    return counts


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("n_labels", [1, 2, 7, 9])
def test_sums_and_majorities_are_the_dense_counts(seed, n_labels):
    rng = np.random.default_rng(seed)
    n_cols, n_steps, step_bin, k = 5, int(rng.integers(1, 40)), int(rng.integers(1, 6)), 60
    cols, labels = rng.integers(0, n_cols, k), rng.integers(0, n_labels, k)
    starts = rng.integers(0, n_steps, k)
    ends = np.minimum(starts + rng.integers(1, 12, k), n_steps)
    step_edges = edges(0, n_steps, step_bin)
    sums = _Integrals(cols * n_labels + labels, starts, ends, (n_cols, n_labels), step_edges,
                      step_bin)  # fmt: skip
    counts = dense(cols, labels, starts, ends, (n_cols, n_labels), n_steps)
    by_row = np.add.reduceat(counts, step_edges[:-1], axis=0)  # [rows, cols, labels]
    total = by_row.sum(axis=2)
    np.testing.assert_array_equal(sums.of(np.ones_like(sums.labels)), total)
    for label in range(n_labels):
        np.testing.assert_array_equal(sums.of(sums.labels == label), by_row[..., label])
    best = by_row.argmax(axis=2)
    want = np.where(2 * by_row.max(axis=2) > total, best, MIXED)
    np.testing.assert_array_equal(_majority_labels(sums, total), want)


def test_bits_that_name_no_label_are_no_majority():
    """Labels 3, 5 and 6 a third each: every bit is a majority bit, and 7 names no label
    (7 of a column is the next column's label 0, which holds everything there)."""
    step_edges = edges(0, 3, 3)
    cols, labels = np.array([0, 0, 0, 1, 1, 1]), np.array([3, 5, 6, 0, 0, 0])
    starts, ends = np.zeros(6, np.int64), np.full(6, 3)
    sums = _Integrals(cols * 7 + labels, starts, ends, (2, 7), step_edges, 3)
    total = sums.of(np.ones_like(sums.labels))
    assert _majority_labels(sums, total).tolist() == [[MIXED, 0]]


def test_cells_never_occupied_are_free_pixels():
    """A range of cells no change occupies has no stretch: no sum, every pixel FREE."""
    cache = CellCache(small_config(capacity=32, initial_cells=8))
    recorder = Recorder(cache)
    step_with(cache, [cache.seq_new()] * 2)
    trace = recorder.trace()
    pixels = owner_pixels(trace, owners_of(trace), (5, 8), (0, trace.n_steps), 1, 1)
    assert pixels.label.tolist() == [[FREE] * 3]
    assert pixels.occupied.tolist() == pixels.shared.tolist() == [[0.0] * 3]


def test_a_steps_range_far_past_the_trace_counts_its_steps():
    """Pixel rows of 2**56 steps over a trace of one: the bits a key gives a step are the
    trace's, not the range's (a key sized by the range's end overflowed int64)."""
    cache = CellCache(small_config(capacity=8, initial_cells=8, max_seqs=1))
    recorder = Recorder(cache)
    step_with(cache, [cache.seq_new()] * 4)
    trace = recorder.trace()
    pixels = owner_pixels(trace, owners_of(trace), (0, 4), (0, 2**58), 1, 2**56)
    assert pixels.label[0].tolist() == [0] * 4 and (pixels.label[1:] == FREE).all()
    assert (pixels.occupied[0] * 2**56).tolist() == [1.0] * 4


@pytest.mark.parametrize(
    ("cells", "steps"), [((3, 3), (0, 2)), ((0, 4), (1, 1)), ((9, 9), (2, 2)), ((5, 3), (0, 2))]
)
def test_an_empty_range_has_no_pixels(cells, steps):
    """No cells (or a reversed range of them) or no steps: pixels with no columns or no
    rows, not an error."""
    cache = CellCache(small_config(capacity=8, initial_cells=8))
    recorder = Recorder(cache)
    step_with(cache, [cache.seq_new()] * 4)
    step_with(cache, [0])
    trace = recorder.trace()
    pixels = owner_pixels(trace, owners_of(trace), cells, steps, 2, 1)
    shape = (steps[1] - steps[0], max(-(-(cells[1] - cells[0]) // 2), 0))
    assert pixels.occupied.shape == pixels.shared.shape == pixels.label.shape == shape
    assert pixels.label.dtype == np.int64 and pixels.occupied.dtype == np.float64


@pytest.mark.parametrize("at_once", [1, 5, 7, 1 << 16])
@pytest.mark.parametrize("seed", range(4))
def test_group_moves_count_each_ids_changes(seed, at_once, monkeypatch):
    """The running count of each id's group changes and the changes themselves, against a
    step-by-step count, whatever the block of steps counted at a time (the frames of the
    steps skip some, as verbs between steps do)."""
    monkeypatch.setattr(pixels, "MOVES_AT_ONCE", at_once)
    rng = np.random.default_rng(seed)
    n_frames, max_seqs = int(rng.integers(1, 40)), int(rng.integers(1, 6))
    seq_groups = rng.integers(0, 3, (n_frames, max_seqs)).astype(np.int32)
    step_frames = np.sort(rng.choice(n_frames, int(rng.integers(0, n_frames + 1)), replace=False))
    span = len(step_frames) + 1
    moves, cuts = pixels._group_moves(seq_groups, step_frames, span)
    groups = seq_groups[step_frames]
    changed = np.zeros(groups.shape, dtype=np.int32)
    changed[1:] = groups[1:] != groups[:-1]
    np.testing.assert_array_equal(moves, np.cumsum(changed, axis=0))
    assert moves.dtype == np.int32
    want = sorted(i * span + t for t, i in zip(*np.nonzero(changed), strict=True))
    assert cuts.tolist() == want
