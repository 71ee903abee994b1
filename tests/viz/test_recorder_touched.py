"""The recorder reads only the cells the table says its verbs touched: its frames, decoded,
are exactly the changes between whole snapshots of the table taken after each recorded
verb (what 0.11.0's recorder stored, comparing the whole table), on random workloads with
every verb, for both caches; and so is each frame's table built from every change up to it
at once (`Trace.snapshot`)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import numbakv
from numbakv import Recorder
from numbakv.core.snapshot import Snapshot
from numbakv.reference import CellCache as RefCache
from numbakv.trace.scan import TableReplay

from helpers import Snapshots, churn, small_config

CACHES = {"reference": RefCache, "device": numbakv.CellCache}


def whole_table_changes(before: Snapshot | None, after: Snapshot):
    """(cells, pos, owners) where two snapshots' tables differ, ascending: a cell past a
    snapshot's read_len is free, and so is every cell of no snapshot (None)."""
    n = max(0 if before is None else before.read_len, after.read_len)

    def padded(snap: Snapshot | None):
        pos = np.full(n, -1, dtype=np.int32)
        owners = np.zeros((n, after.owners.shape[1]), dtype=np.uint64)
        if snap is not None:
            pos[: snap.read_len], owners[: snap.read_len] = snap.pos, snap.owners
        return pos, owners

    (pos0, owners0), (pos1, owners1) = padded(before), padded(after)
    cells = np.flatnonzero((pos0 != pos1) | (owners0 != owners1).any(axis=1))
    return cells, pos1[cells], owners1[cells]


def workload(cache, ops: list[int]) -> None:
    """`churn` in pieces, with a clear, a saved sequence loaded back and one loaded onto
    another between them."""
    third = len(ops) // 3
    churn(cache, ops[:third])
    if live := cache.live_seqs:
        state = cache.seq_save(live[0])
        cache.seq_rm(live[0])
        if cache.free_cells >= state.n_tokens:
            cache.seq_load(state)
        seq = cache.live_seqs[-1]
        state = cache.seq_save(seq, start=cache.pos(seq) // 2)
        if cache.free_cells >= state.n_tokens and len(cache.live_seqs) < cache.config.max_seqs:
            cache.seq_load(state, onto=seq)
    churn(cache, ops[third : 2 * third])
    cache.clear()
    churn(cache, ops[2 * third :])


def assert_frames_are_the_snapshot_changes(recorder: Recorder, expect: Snapshots) -> None:
    trace = recorder.trace()
    assert trace.n_frames == len(expect.frames) and trace.events == expect.events
    arrays, config = trace.arrays, trace.config
    replay = TableReplay(arrays, config.capacity, config.n_owner_words)
    before = None
    for f, snap in enumerate(expect.frames):
        cells = replay.apply(f)
        for got, want in zip((cells, replay.pos[cells], replay.owners[cells]),
                             whole_table_changes(before, snap), strict=True):  # fmt: skip
            np.testing.assert_array_equal(got, want, err_msg=f"frame {f}")
        n = snap.read_len
        np.testing.assert_array_equal(replay.pos[:n], snap.pos)
        np.testing.assert_array_equal(replay.owners[:n], snap.owners)
        assert (replay.pos[n:] == -1).all()
        assert arrays["read_len"][f] == n and arrays["rows"][f] == snap.rows
        np.testing.assert_array_equal(arrays["live"][f], snap.live)
        at = trace.snapshot(f)  # from every change up to f at once (`scan.table_at`)
        assert (at.read_len, at.rows) == (n, snap.rows)
        np.testing.assert_array_equal(at.pos, snap.pos)
        np.testing.assert_array_equal(at.owners, snap.owners)
        before = snap


@pytest.mark.parametrize("every_verb", [False, True])
@pytest.mark.parametrize("kind", sorted(CACHES))
@settings(max_examples=12, deadline=None)
@given(ops=st.lists(st.integers(0, 120), min_size=10, max_size=60))
def test_recorded_frames_are_the_whole_table_changes(kind, every_verb, ops):
    cache = CACHES[kind](small_config(max_seqs=70, capacity=24, max_width=6, initial_cells=4))
    recorder = Recorder(cache, every_verb=every_verb)
    expect = Snapshots(cache, every_verb)
    workload(cache, ops)
    assert_frames_are_the_snapshot_changes(recorder, expect)


def test_a_recorder_started_mid_workload_and_two_at_once():
    cache = RefCache(small_config(max_seqs=70, capacity=24, max_width=6))
    churn(cache, list(range(0, 200, 7)))
    first, first_expect = Recorder(cache, every_verb=True), Snapshots(cache, every_verb=True)
    churn(cache, list(range(3, 300, 11)))
    second, second_expect = Recorder(cache), Snapshots(cache)
    workload(cache, list(range(5, 400, 13)))
    assert_frames_are_the_snapshot_changes(first, first_expect)
    assert_frames_are_the_snapshot_changes(second, second_expect)
