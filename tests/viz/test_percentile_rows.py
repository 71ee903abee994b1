"""The locality panel's figures, every row at once and without float copies, are numpy's
NaN-ignoring ones of the runs with 0 as NaN, bit for bit: the mean, 90th percentile
(numpy loops over the rows in Python) and largest per step, and the map's blocks; a step
or a block where no id holds a cell included."""

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from numbakv.viz.panels import _held_lines, _mean_blocks


@settings(max_examples=150, deadline=None)
@given(
    runs=arrays(
        np.int32,
        st.tuples(st.integers(1, 15), st.integers(1, 12)),
        elements=st.one_of(st.integers(0, 6), st.integers(0, 10**5)),
    ),
    rows=st.integers(1, 5),
    cols=st.integers(1, 5),
)
def test_the_locality_lines_and_blocks_are_numpys_nan_figures(runs, rows, cols):
    """The runs with 0 as NaN: the lines are nanmean, nanpercentile and nanmax of each step
    and the map nanmean of each block (padded with NaN), bit for bit."""
    held = np.where(runs > 0, runs, np.nan)
    n, m = held.shape
    padded = np.full((-(-n // rows) * rows, -(-m // cols) * cols), np.nan)
    padded[:n, :m] = held
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row or a block of NaNs
        want = {"mean": np.nanmean(held, axis=1), "p90": np.nanpercentile(held, 90, axis=1),
                "max": np.nanmax(held, axis=1)}  # fmt: skip
        blocks = np.nanmean(padded.reshape(len(padded) // rows, rows, -1, cols), axis=(1, 3))
    got = _held_lines(runs)
    assert got.keys() == want.keys()
    for name, values in want.items():
        np.testing.assert_array_equal(got[name], values)
    np.testing.assert_array_equal(_mean_blocks(runs, rows, cols), blocks)


def test_a_step_of_no_runs_one_run_and_two():
    runs = np.array([[0, 0], [0, 3], [2, 7]], dtype=np.int32)
    lines = _held_lines(runs)
    np.testing.assert_array_equal(lines["p90"], [np.nan, 3.0, 6.5])
    np.testing.assert_array_equal(lines["mean"], [np.nan, 3.0, 4.5])
    np.testing.assert_array_equal(lines["max"], [np.nan, 3.0, 7.0])
