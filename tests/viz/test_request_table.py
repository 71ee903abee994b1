"""The request each sequence id is bound to at each frame (`scan.request_table`, each id's
column painted from its bindings in turn) against a scan of the bindings for every (frame,
id): the last binding in recording order from a frame before it, -1 before any."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.trace.scan import request_table


def bound_by_scan(bindings: list[tuple[int, int, int]], n_frames: int, max_seqs: int):
    table = np.full((n_frames, max_seqs), -1, dtype=np.int64)
    for f in range(n_frames):
        for frame, seq, request in bindings:  # recording order: a later one replaces
            if frame < f:
                table[f, seq] = request
    return table


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n_frames=st.integers(1, 20), max_seqs=st.integers(1, 6))
def test_each_ids_request_is_its_last_binding_before_the_frame(data, n_frames, max_seqs):
    row = st.tuples(st.integers(0, n_frames + 1), st.integers(0, max_seqs - 1), st.integers(0, 5))
    bindings = sorted(data.draw(st.lists(row, max_size=25)), key=lambda b: b[0])  # by frame
    got = request_table(np.array(bindings, np.int64).reshape(-1, 3), n_frames, max_seqs)
    np.testing.assert_array_equal(got, bound_by_scan(bindings, n_frames, max_seqs))
