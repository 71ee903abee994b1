"""`FreeRuns` (the largest free run kept as cells change, its tree brought up to date only
when that run can change) against a scan of every cell after every change, on random and
adversarial changes: few cells at a time (its Python climb) and many (numpy); and a
trace's largest free run per frame against a scan of each frame's table, on random
workloads."""

from unittest.mock import patch

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv import Recorder
from numbakv.reference import CellCache
from numbakv.trace.free_runs import FreeRuns
from numbakv.trace.scan import largest_free_run

from helpers import churn, small_config, step_with


def longest_run(free: np.ndarray) -> int:
    return first_longest(free)[1] - first_longest(free)[0]


def first_longest(free: np.ndarray) -> tuple[int, int]:
    """[start, end) of the first longest run of True in `free`, scanned cell by cell."""
    best, start = (0, 0), 0
    for cell, is_free in enumerate(free.tolist()):
        start = start if is_free else cell + 1
        if is_free and cell + 1 - start > best[1] - best[0]:
            best = (start, cell + 1)
    return best


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    n_cells=st.integers(1, 300),
    block=st.sampled_from([1, 4, 64]),  # cells under a leaf: the tree 1 to 9 levels high
    few=st.sampled_from([0, 3, 16, 1 << 20]),  # numpy levels, Python climb or both
)
def test_the_largest_run_is_the_scanned_one(data, n_cells, block, few):
    with patch.multiple("numbakv.trace.free_runs", BLOCK=block, FEW=few):
        check_random_changes(data, n_cells)


def check_random_changes(data, n_cells: int) -> None:
    runs, free = FreeRuns(n_cells), np.zeros(n_cells, dtype=bool)
    for _ in range(data.draw(st.integers(1, 12))):
        cells = data.draw(st.sets(st.integers(0, n_cells - 1), max_size=n_cells))
        cells = np.array(sorted(cells), dtype=np.int64)
        value = np.array(data.draw(st.lists(st.booleans(), min_size=len(cells),
                                            max_size=len(cells))), dtype=bool)  # fmt: skip
        runs.set(cells, value)
        free[cells] = value
        assert runs.largest == longest_run(free)
        assert runs.longest() == first_longest(free)


def test_runs_across_every_node_boundary():
    n = 1 << 10
    runs, free = FreeRuns(n), np.zeros(n, dtype=bool)
    rng = np.random.default_rng(0)
    for size in (1, 2, 3, 63, 64, 65, 511, 512, 513, 1024):
        for start in (0, 1, n // 2 - 1, n - size):
            cells = np.arange(start, min(start + size, n))
            for value in (True, False):
                runs.set(cells, np.full(len(cells), value))
                free[cells] = value
                assert runs.largest == longest_run(free)
                assert runs.longest() == first_longest(free)
        holes = np.unique(rng.integers(0, n, 40))
        runs.set(holes, np.zeros(len(holes), dtype=bool))
        free[holes] = False
        assert runs.largest == longest_run(free)


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
