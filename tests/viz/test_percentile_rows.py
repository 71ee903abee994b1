"""The locality panel's 90th percentile per step, every row at once (`nanpercentile_rows`),
is numpy's `nanpercentile(axis=1)`, bit for bit: on random rows of counts and of floats
spanning magnitudes, with NaNs anywhere (a row of only NaNs included), at any q."""

import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from numbakv.viz.panels import nanpercentile_rows

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
