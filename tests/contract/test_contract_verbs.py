"""The verbs of docs/contract.md §2 on both implementations: each effect, each refusal
(nothing changed), and the worked cases."""

import numpy as np
import pytest

from numbakv.core.errors import CapacityError, SequenceError, StepError

from helpers import full_state, step_with


def owners(cache) -> list[list[int]]:
    """Owner ids of each cell in [0, read_len)."""
    snap = cache.snapshot()
    return [snap.owners_of(c) for c in range(snap.read_len)]


def positions(cache) -> list[int]:
    return cache.snapshot().pos.tolist()


# -- effects -------------------------------------------------------------------


def test_new_cache_is_empty(cache):
    assert (cache.read_len, cache.used_cells, cache.free_cells) == (0, 0, 16)
    assert cache.live_seqs == [] and cache.rows == 0 and cache.allocated_bytes == 0
    snap = cache.snapshot()
    assert snap.pos.shape == (0,) and snap.owners.shape == (0, 1) and not snap.live.any()
    assert (snap.capacity, snap.rows, snap.read_len) == (16, 0, 0)


def test_seq_new_takes_lowest_free_id(cache):
    assert [cache.seq_new() for _ in range(3)] == [0, 1, 2]
    cache.seq_rm(1)
    assert cache.seq_new() == 1
    assert cache.pos(1) == 0


def test_seq_clone_shares_prefix_without_cells(cache):
    a = cache.seq_new()
    step_with(cache, [a] * 5)
    used = cache.used_cells
    c = cache.seq_clone(a, upto=3)
    assert cache.pos(c) == 3 and cache.used_cells == used
    assert owners(cache) == [[a, c]] * 3 + [[a]] * 2
    d = cache.seq_clone(a)  # default upto = pos(a)
    assert cache.pos(d) == 5
    e = cache.seq_clone(a, upto=0)
    assert cache.pos(e) == 0


def test_clone_shares_until_last_owner_leaves(cache):
    # worked case: a clone shares every cell of its source until its last owner leaves
    a = cache.seq_new()
    step_with(cache, [a] * 4)
    c = cache.seq_clone(a)
    cache.seq_rm(a)
    assert owners(cache) == [[c]] * 4 and cache.used_cells == 4
    assert positions(cache) == [0, 1, 2, 3]
    cache.seq_rm(c)
    assert cache.used_cells == 0 and cache.read_len == 0


def test_seq_rm_frees_and_trims(cache):
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a, b, b])
    cache.seq_rm(b)
    assert cache.read_len == 2 and positions(cache) == [0, 1]
    assert cache.live_seqs == [a]
    snap = cache.snapshot()  # cells past read_len are free, so a snapshot stops there
    assert snap.pos.shape == (2,) and snap.owners.shape == (2, 1) and snap.owners_of(3) == []


def test_rewind_drops_tail_keeps_id(cache):
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, b, a, b, a])
    cache.rewind(a, 1)
    assert cache.pos(a) == 1 and cache.live_seqs == [a, b]
    assert positions(cache) == [0, 0, -1, 1]
    assert cache.read_len == 4
    cache.rewind(b, 0)
    assert cache.pos(b) == 0 and cache.read_len == 1
    cache.rewind(a, 1)  # position == pos(a) is a no-op
    assert cache.pos(a) == 1


def test_rewind_a_clone_leaves_the_source(cache):
    a = cache.seq_new()
    step_with(cache, [a] * 4)
    c = cache.seq_clone(a)
    cache.rewind(c, 1)
    assert cache.pos(a) == 4 and cache.pos(c) == 1
    assert owners(cache) == [[a, c], [a], [a], [a]]


def test_clear_frees_everything_and_keeps_storage(cache):
    a = cache.seq_new()
    step_with(cache, [a] * 6)
    rows, generation = cache.rows, cache.generation
    cache.clear()
    assert cache.used_cells == 0 and cache.read_len == 0 and cache.live_seqs == []
    assert (cache.rows, cache.generation) == (rows, generation)
    with pytest.raises(StepError):
        cache.prepare_step()
    assert cache.seq_new() == 0


# -- worked cases of the issue ---------------------------------------------------


def test_two_prefills_then_decode(cache):
    a, b = cache.seq_new(), cache.seq_new()
    step = step_with(cache, [a, a, a, b, b])
    assert step.cells.tolist() == [0, 1, 2, 3, 4]
    assert step.positions.tolist() == [0, 1, 2, 0, 1]
    assert step.read_len == 5
    causal = np.tril(np.ones((3, 3), np.uint8))
    expect = np.zeros((5, 5), np.uint8)
    expect[:3, :3] = causal
    expect[3:, 3:] = causal[:2, :2]
    np.testing.assert_array_equal(step.mask(0), expect)
    step = step_with(cache, [b, a])
    assert step.cells.tolist() == [5, 6]
    assert step.positions.tolist() == [2, 3]


def test_removed_hole_refills_first(cache):
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, b, b, b])  # a holds cell 0, b holds cell 3
    cache.seq_rm(a)
    assert cache.read_len == 4
    step = step_with(cache, [b])
    assert step.cells.tolist() == [0] and cache.read_len == 4


def test_window_two_sees_only_previous_position(impl):
    cache = impl.cache(windows=(2, 2))
    a = cache.seq_new()
    step = step_with(cache, [a] * 4)
    expect = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], np.uint8)
    np.testing.assert_array_equal(step.mask(2), expect)


# -- bitsets -----------------------------------------------------------------------


def fill_every_id(impl, max_seqs: int):
    """A cache where every id is live and sequence s holds one token in cell s."""
    cache = impl.cache(max_seqs=max_seqs, capacity=2 * max_seqs, max_width=2, initial_cells=1)
    for _ in range(max_seqs):
        step_with(cache, [cache.seq_new()])
    return cache


@pytest.mark.parametrize("max_seqs", [1, 64, 65, 200])
def test_every_id_owns_its_cell(impl, max_seqs):
    cache = fill_every_id(impl, max_seqs)
    snap = cache.snapshot()
    assert snap.owners.shape == (max_seqs, -(-max_seqs // 64))
    assert [snap.owners_of(c) for c in range(max_seqs)] == [[s] for s in range(max_seqs)]
    assert cache.live_seqs == list(range(max_seqs))
    with pytest.raises(CapacityError):
        cache.seq_clone(max_seqs - 1)


@pytest.mark.parametrize("max_seqs", [64, 65, 200])
def test_clone_of_the_highest_id_shares_its_cell(impl, max_seqs):
    cache = fill_every_id(impl, max_seqs)
    last = max_seqs - 1
    cache.seq_rm(0)
    assert cache.seq_clone(last) == 0
    assert cache.snapshot().owners_of(last) == [0, last]
    cache.seq_rm(last)
    assert cache.snapshot().owners_of(last) == [0]
    assert cache.used_cells == max_seqs - 1  # cell 0 freed, the clone keeps cell `last`


# -- refusals: the right error, and nothing changed --------------------------------


def refusals(cache):
    """(label, call, error) for every refusal of docs/contract.md §2 on a cache holding a, b."""
    a, b = 0, 1
    return [
        ("rm dead", lambda: cache.seq_rm(3), SequenceError),
        ("rm out of range", lambda: cache.seq_rm(99), SequenceError),
        ("rm negative", lambda: cache.seq_rm(-1), SequenceError),
        ("rm non-int", lambda: cache.seq_rm("a"), SequenceError),
        ("clone dead", lambda: cache.seq_clone(3), SequenceError),
        ("clone upto > pos", lambda: cache.seq_clone(a, upto=4), SequenceError),
        ("clone upto < 0", lambda: cache.seq_clone(a, upto=-1), SequenceError),
        ("rewind dead", lambda: cache.rewind(3, 0), SequenceError),
        ("rewind past pos", lambda: cache.rewind(b, 2), SequenceError),
        ("rewind negative", lambda: cache.rewind(b, -1), SequenceError),
        ("pos dead", lambda: cache.pos(3), SequenceError),
        ("declare empty", lambda: cache.declare_step([]), StepError),
        ("declare too wide", lambda: cache.declare_step([a] * 9), StepError),
        ("declare dead id", lambda: cache.declare_step([a, 3]), SequenceError),
        ("prepare nothing declared", lambda: cache.prepare_step(), StepError),
        ("write without step", lambda: cache.write(0, None, None), StepError),
        ("attend without step", lambda: cache.attend(0, None), StepError),
    ]


@pytest.mark.parametrize("index", range(17))
def test_refusal_changes_nothing(impl, index):
    cache = impl.cache()
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a, a, b])
    cache.seq_rm(cache.seq_new())  # a released id, 2, below the dead id 3
    label, call, error = refusals(cache)[index]
    before = full_state(cache)
    with pytest.raises(error):
        call()
    assert full_state(cache) == before, label


def test_declare_more_than_free_cells_changes_nothing(impl):
    cache = impl.cache(capacity=8, initial_cells=8)
    a = cache.seq_new()
    step_with(cache, [a] * 6)
    before = full_state(cache)
    with pytest.raises(CapacityError, match="2 of 8 cells are free"):
        cache.declare_step([a, a, a])
    assert full_state(cache) == before
    step_with(cache, [a, a])  # exactly the free cells
    assert cache.free_cells == 0


def test_seq_new_refused_when_every_id_is_live(impl):
    cache = impl.cache(max_seqs=2)
    cache.seq_new(), cache.seq_new()
    before = full_state(cache)
    with pytest.raises(CapacityError, match="all 2 sequence ids are live"):
        cache.seq_new()
    assert full_state(cache) == before


def test_second_seq_rm_raises(cache):
    a = cache.seq_new()
    cache.seq_rm(a)
    with pytest.raises(SequenceError):
        cache.seq_rm(a)


def test_refused_verb_keeps_the_step_valid(cache):
    a = cache.seq_new()
    step = step_with(cache, [a])
    with pytest.raises(SequenceError):
        cache.seq_rm(3)
    assert not step.is_stale and step.cells.tolist() == [0]
