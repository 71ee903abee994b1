"""The locality panel's figures, every row at once and without float copies, are numpy's
NaN-ignoring ones bit for bit: the 90th percentile per step (`nanpercentile_rows`) on
random rows of counts and of floats spanning magnitudes, with NaNs anywhere (a row of only
NaNs included), at any q; the lines and the map's blocks of the runs with 0 as NaN."""

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from numbakv.viz.panels import _held_lines, _mean_blocks, nanpercentile_rows

values = st.one_of(
    st.integers(1, 9).map(float),  # run counts, as the panel has them
    st.floats(-1e12, 1e12, allow_nan=False),
    st.just(np.nan),
)


@settings(max_examples=200, deadline=None)
@given(
    rows=arrays(np.float64, st.tuples(st.integers(1, 12), st.integers(1, 12)), elements=values),
    q=st.one_of(st.sampled_from([0.0, 50.0, 90.0, 100.0]), st.floats(0, 100)),
)
def test_every_rows_percentile_is_numpys(rows, q):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's all-NaN row
        want = np.nanpercentile(rows, q, axis=1)
    np.testing.assert_array_equal(nanpercentile_rows(rows, q), want)


def test_a_row_of_nans_and_a_row_of_one_value():
    rows = np.array([[np.nan, np.nan], [np.nan, 3.0], [2.0, 7.0]])
    np.testing.assert_array_equal(nanpercentile_rows(rows, 90), [np.nan, 3.0, 6.5])


@settings(max_examples=150, deadline=None)
@given(
    runs=arrays(
        np.int32, st.tuples(st.integers(1, 15), st.integers(1, 12)), elements=st.integers(0, 6)
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
