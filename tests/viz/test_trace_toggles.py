"""Format 3's owner toggles: a change to a shared cell names the owner bits it flips, and a
trace whose toggles contradict its table is refused, naming what is wrong."""

import re

import numpy as np
import pytest

from numbakv import Recorder, Trace
from numbakv.core.errors import TraceError
from numbakv.core.snapshot import SHARED
from numbakv.reference import CellCache

from helpers import Snapshots, small_config, step_with


def shared_trace() -> tuple[Trace, Snapshots]:
    """Every verb recorded: a's two tokens (cells 0, 1), b a clone of both, c of the first,
    then a removed, then b."""
    cache = CellCache(small_config(max_seqs=4, capacity=16))
    recorder, expect = Recorder(cache, every_verb=True), Snapshots(cache, every_verb=True)
    a = cache.seq_new()
    step_with(cache, [a, a])
    b = cache.seq_clone(a)  # frame 4: cells 0, 1 gain b
    cache.seq_clone(a, 1)  # frame 5: cell 0 gains c
    cache.seq_rm(a)  # frame 6: cell 0 loses a (still shared), cell 1 is b's alone
    cache.seq_rm(b)
    return recorder.trace(), expect


def test_toggles_name_the_bits_each_change_to_a_shared_cell_flips():
    trace, expect = shared_trace()
    a = trace.arrays
    assert trace.events[3:8] == ["prepare_step", "seq_clone", "seq_clone", "seq_rm", "seq_rm"]
    frame_of = np.repeat(np.arange(trace.n_frames), np.diff(a["delta_offsets"]))
    toggled = np.repeat(np.arange(len(frame_of)), a["toggle_counts"])
    got = [(int(frame_of[i]), int(a["delta_cells"][i]), int(s))
           for i, s in zip(toggled, a["toggle_seqs"], strict=True)]  # fmt: skip
    assert got == [(4, 0, 1), (4, 1, 1), (5, 0, 2), (6, 0, ~0)]
    assert (a["delta_codes"][a["toggle_counts"] > 0] == SHARED).all()
    assert list(trace.snapshots()) == expect.frames
    assert trace.metrics()["saved"].tolist() == [0, 0, 0, 0, 2, 3, 1, 0]


def with_array(trace: Trace, name: str, edit) -> dict:
    """The trace's arrays with a copy of array `name` edited in place by `edit`."""
    array = trace.arrays[name].copy()
    edit(array)
    return dict(trace.arrays, **{name: array})


def onto_the_first_change(counts: np.ndarray) -> None:
    """The last change's toggle counted for change 0 (a's first token: not shared)."""
    counts[np.flatnonzero(counts)[-1]] -= 1
    counts[0] += 1


def both_of_frame_4_on_cell_0(counts: np.ndarray) -> None:
    """Frame 4's toggles (cell 0 gains 1, cell 1 gains 1) both counted for cell 0."""
    first = np.flatnonzero(counts)[0]
    counts[first], counts[first + 1] = 2, 0


@pytest.mark.parametrize(
    ("name", "edit", "match"),
    [
        ("toggle_counts", onto_the_first_change,
         "frame 3 changes cell 0 to code 0 with toggles; only a change to a shared cell"),
        ("toggle_counts", lambda x: x.__setitem__(np.flatnonzero(x)[0], -1),
         "toggle_counts are negative or add up to other than its 4 toggle_seqs"),
        ("toggle_counts", both_of_frame_4_on_cell_0,
         "frame 4 flips an owner of cell 0 out of order or twice"),
        ("toggle_seqs", lambda x: x.__setitem__(0, 4), "owner 4: an owner id past max_seqs=4"),
        ("toggle_seqs", lambda x: x.__setitem__(0, 0), "gives cell 0 owner 0, which it has"),
        ("toggle_seqs", lambda x: x.__setitem__(2, ~1),
         "frame 5's toggles leave cell 0 1 owners; its code -2 says several"),
        ("toggle_seqs", lambda x: x.__setitem__(2, 3),
         "cell 0 is owned by sequence 3 at frame 5 while that sequence is not live"),
    ],
)  # fmt: skip
def test_toggles_that_contradict_the_table_are_refused(name, edit, match):
    trace, _ = shared_trace()
    with pytest.raises(TraceError) as info:
        Trace(trace.config, with_array(trace, name, edit))
    assert re.search(match, str(info.value)), str(info.value)


def test_a_shared_cell_that_only_moves_position_has_no_toggles():
    cache = CellCache(small_config(max_seqs=4, capacity=16))
    recorder, expect = Recorder(cache), Snapshots(cache)
    a = cache.seq_new()
    step_with(cache, [a])  # cell 0: a at 0
    b = cache.seq_clone(a)
    c = cache.seq_new()
    step_with(cache, [c, c])  # cells 1, 2: c at 0, 1; cell 0 shared by a and b at 0
    state = cache.seq_save(c, start=1)
    cache.seq_rm(a)
    cache.seq_rm(b)
    a = cache.seq_load(state, onto=c)  # id 0 again: c's cell 1, then cell 0 at position 1
    b = cache.seq_clone(a)  # id 1 again: cell 0 shared by 0 and 1 once more
    step_with(cache, [c])
    trace = recorder.trace()
    assert list(trace.snapshots()) == expect.frames
    arrays, f = trace.arrays, 3
    changes = slice(*arrays["delta_offsets"][f : f + 2])
    cells, pos = arrays["delta_cells"][changes], arrays["delta_pos"][changes]
    at = int(np.flatnonzero(cells == 0)[0])
    assert (a, b, pos[at], arrays["delta_codes"][changes][at]) == (0, 1, 1, SHARED)
    assert arrays["toggle_counts"][changes][at] == 0
