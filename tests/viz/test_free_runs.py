"""The largest free run after each frame (`largest_after`: a segment tree over 64-cell
words, every frame at once) against a scan of every cell after every frame, on random and
adversarial flips; a word's runs against its bits; and a trace's largest free run per
frame against a scan of each frame's table, on random workloads."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv import Recorder
from numbakv.reference import CellCache
from numbakv.trace.free_runs import _word_runs, largest_after
from numbakv.trace.scan import largest_free_run

from helpers import churn, small_config, step_with


def longest_run(free: np.ndarray) -> int:
    """The longest run of True in `free`, scanned cell by cell."""
    best = run = 0
    for is_free in free.tolist():
        run = run + 1 if is_free else 0
        best = max(best, run)
    return best


def largest_by_scan(n_cells: int, frames: list[list[int]]) -> list[int]:
    """The longest free run after each frame, every cell taken at first and each frame's
    cells flipping, scanned cell by cell."""
    free, out = np.zeros(n_cells, dtype=bool), []
    for cells in frames:
        free[cells] = ~free[cells]
        out.append(longest_run(free))
    return out


def as_flips(frames: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(frame, cell) of each flip, by frame then cell: what `largest_after` takes."""
    pairs = [(f, c) for f, cells in enumerate(frames) for c in sorted(cells)]
    return (
        tuple(np.array(x, dtype=np.int64).reshape(-1) for x in zip(*pairs, strict=True))
        if pairs
        else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    )


@settings(max_examples=150, deadline=None)
@given(data=st.data(), n_cells=st.integers(1, 600))
def test_the_largest_run_after_each_frame_is_the_scanned_one(data, n_cells):
    # up to 10 leaves of 64 cells: every level of the tree, and frames that flip nothing
    n_frames = data.draw(st.integers(1, 12))
    cell = st.integers(0, n_cells - 1)
    frames = [sorted(data.draw(st.sets(cell, max_size=n_cells))) for _ in range(n_frames)]
    got = largest_after(*as_flips(frames), n_frames, n_cells)
    assert got.tolist() == largest_by_scan(n_cells, frames)


def test_runs_across_every_node_boundary():
    n = 1 << 10
    free, frames = np.zeros(n, dtype=bool), []
    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 63, 64, 65, 511, 512, 513, 1024):
        for start in (0, 1, n // 2 - 1, n - size):
            cells = np.arange(start, min(start + size, n))
            for value in (True, False):
                frames.append(cells[free[cells] != value].tolist())
                free[cells] = value
        holes = np.unique(rng.integers(0, n, 40))
        frames.append(holes[free[holes]].tolist())
        free[holes] = False
    got = largest_after(*as_flips(frames), len(frames), n)
    assert got.tolist() == largest_by_scan(n, frames)


def test_a_pool_of_more_leaves_than_16_bits_count():
    # over 2^16 leaves: the flips are sorted by leaf without numpy's radix sort
    n = (1 << 22) + 3 * 64
    frames = [[0, 1, n - 1], [n - 2, n - 3, 1 << 21], [1, n - 3], list(range(5, 200))]
    got = largest_after(*as_flips([sorted(f) for f in frames]), len(frames), n)
    free, expect = np.zeros(n, dtype=bool), []
    for cells in frames:
        free[cells] = ~free[cells]
        edges = np.flatnonzero(np.diff(np.concatenate([[0], free.astype(np.int8), [0]])))
        expect.append(int(np.max(edges[1::2] - edges[::2], initial=0)))
    assert got.tolist() == expect == [2, 3, 2, 195]


@pytest.mark.parametrize("seed", range(3))
def test_a_words_runs_are_its_bits(seed):
    rng = np.random.default_rng(seed)
    special = [0, 2**64 - 1, 1, 1 << 63, 0x5555555555555555, (2**64 - 1) >> 1, 2**64 - 2,
               0xFFFF0000FFFF0000, 0x00000000FFFFFFFF, 0x7FFFFFFFFFFFFFFE]  # fmt: skip
    holes = ~(np.uint64(1) << rng.integers(0, 64, 50).astype(np.uint64))  # one cell taken
    random = rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True)
    words = np.concatenate([np.array(special, dtype=np.uint64), random, holes])
    head, tail, best = _word_runs(words)
    for w, h, t, b in zip(words.tolist(), head.tolist(), tail.tolist(), best.tolist(), strict=True):
        bits = [(w >> i) & 1 for i in range(64)]
        free = np.array(bits, dtype=bool)
        runs = "".join(map(str, bits))
        assert (h, t, b) == (len(runs) - len(runs.lstrip("1")), len(runs) - len(runs.rstrip("1")),
                             longest_run(free)), hex(w)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(st.integers(0, 200), min_size=1, max_size=60),
    every_verb=st.booleans(),
    initial=st.sampled_from([1, 4, 40]),
)
def test_a_traces_largest_free_run_is_each_frames_scanned(ops, every_verb, initial):
    cache = CellCache(small_config(capacity=40, initial_cells=initial, max_seqs=5))
    recorder = Recorder(cache, every_verb=every_verb)
    churn(cache, ops)
    trace = recorder.trace()
    expect = []
    for snap in trace.snapshots():
        free = np.ones(snap.rows, dtype=bool)
        free[: snap.read_len] = snap.n_owners == 0
        expect.append(longest_run(free))
    np.testing.assert_array_equal(largest_free_run(trace.arrays), expect)


def test_taking_the_last_free_cell_ends_the_largest_run():
    cache = CellCache(small_config(capacity=8, initial_cells=8))
    recorder = Recorder(cache, every_verb=True)
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a, b, a, a, a, a, a])
    cache.seq_rm(b)  # cell 2 alone is free: the run [2, 3)
    step_with(cache, [a])  # and taken
    trace = recorder.trace()
    runs = largest_free_run(trace.arrays)
    assert (trace.events[-3:], runs[-3:].tolist()) == (
        ["seq_rm", "declare_step", "prepare_step"],
        [1, 1, 0],
    )
