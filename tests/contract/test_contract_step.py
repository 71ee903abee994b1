"""The step of docs/contract.md §3 on both implementations: declaration, placement, masks,
padding and stale steps."""

import numpy as np
import pytest

from numbakv.core.arrays import as_host
from numbakv.core.errors import CapacityError, StepError

from helpers import full_state, step_with


def test_positions_continue_each_sequence(cache):
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a])
    step = step_with(cache, [b, a, b, a, a])
    assert step.positions.tolist() == [0, 2, 1, 3, 4]
    assert step.seq_ids.tolist() == [b, a, b, a, a]
    assert (cache.pos(a), cache.pos(b)) == (5, 2)


def test_masks_for_every_distinct_window(impl):
    cache = impl.cache(n_layers=3, windows=(0, 3, 0))
    a, b = cache.seq_new(), cache.seq_new()
    step = step_with(cache, [a, b, a, b, a, a])  # a at cells 0 2 4 5, b at 1 3
    assert step.windows == (0, 3)
    expect_global = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [0, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [0, 1, 0, 1, 0, 0],
            [1, 0, 1, 0, 1, 0],
            [1, 0, 1, 0, 1, 1],
        ],
        np.uint8,
    )
    np.testing.assert_array_equal(step.mask(0), expect_global)
    expect_window = expect_global.copy()
    expect_window[5, 0] = 0  # a@3 sees positions 1..3 only
    np.testing.assert_array_equal(step.mask(3), expect_window)
    with pytest.raises(StepError, match="windows are"):
        step.mask(2)


def test_mask_keys_off_position_not_cell_index(cache):
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [b, a, a, a])  # a@0..2 in cells 1..3
    cache.rewind(a, 0)  # cells 1..3 free; read_len 1
    cache.seq_rm(b)
    c = cache.seq_new()
    step_with(cache, [c, c, c])  # c@0..2 in cells 0..2
    cache.rewind(c, 1)  # c keeps cell 0
    step = step_with(cache, [a, a, c, a])  # a@0 -> 1, a@1 -> 2, c@1 -> 3, a@2 -> 4
    assert step.cells.tolist() == [1, 2, 3, 4]
    expect = np.array(
        [[0, 1, 0, 0, 0], [0, 1, 1, 0, 0], [1, 0, 0, 1, 0], [0, 1, 1, 0, 1]], np.uint8
    )
    np.testing.assert_array_equal(step.mask(0), expect)
    step = step_with(cache, [a])  # a@3 lands in cell 5; a@0..2 are in cells 1, 2, 4
    np.testing.assert_array_equal(step.mask(0), [[0, 1, 1, 0, 1, 1]])
    np.testing.assert_array_equal(step.mask(2), [[0, 0, 0, 0, 1, 1]])


def test_padding(impl):
    cache = impl.cache()
    a = cache.seq_new()
    step = step_with(cache, [a, a], width=5)
    assert step.width == 5 and step.n_tokens == 2
    assert step.cells.tolist() == [0, 1, -1, -1, -1]
    assert step.positions.tolist() == [0, 1, -1, -1, -1]
    assert step.seq_ids.tolist() == [a, a, -1, -1, -1]
    for window in step.windows:
        assert not step.mask(window)[2:].any()
    assert cache.used_cells == 2
    k = np.arange(5 * 4, dtype=np.float32).reshape(5, 1, 4)
    untouched = [x[2:].tobytes() for x in cache.pool_kv(0)]
    cache.write(0, k, k)
    got = as_host(cache.attend(0, np.ones((5, 2, 4), np.float32)))
    assert not got[2:].any()
    np.testing.assert_array_equal(cache.pool_kv(0)[0][:2], k[:2])
    assert [x[2:].tobytes() for x in cache.pool_kv(0)] == untouched  # padded rows are skipped


def test_declare_past_max_seq_len_refused(impl):
    cache = impl.cache(capacity=16, max_seq_len=5)
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a] * 3 + [b])
    before = full_state(cache)
    with pytest.raises(CapacityError, match="max_seq_len=5"):
        cache.declare_step([b, a, a, a])
    assert full_state(cache) == before
    step_with(cache, [a, a, b])  # exactly max_seq_len
    assert cache.pos(a) == 5


def test_width_defaults_to_declared_count(cache):
    a = cache.seq_new()
    assert step_with(cache, [a, a, a]).width == 3


@pytest.mark.parametrize("width", [1, 9, 2.0, "3"])
def test_bad_width_refused_and_declaration_kept(impl, width):
    cache = impl.cache()
    a = cache.seq_new()
    cache.declare_step([a, a])
    before = full_state(cache)
    with pytest.raises(StepError):
        cache.prepare_step(width)
    assert full_state(cache) == before
    assert cache.prepare_step(8).cells.tolist()[:2] == [0, 1]


def test_prepare_consumes_the_declaration(cache):
    a = cache.seq_new()
    step_with(cache, [a])
    with pytest.raises(StepError, match="nothing declared"):
        cache.prepare_step()


def test_declare_replaces_a_pending_declaration(cache):
    a, b = cache.seq_new(), cache.seq_new()
    cache.declare_step([a, a, a])
    cache.declare_step([b])
    assert cache.prepare_step().seq_ids.tolist() == [b]
    assert cache.pos(a) == 0


@pytest.mark.parametrize("verb", ["seq_rm", "rewind", "seq_clone", "clear"])
def test_a_verb_that_changes_the_table_drops_the_declaration(cache, verb):
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a])
    cache.declare_step([a, b, b])
    {
        "seq_rm": lambda: cache.seq_rm(b),
        "rewind": lambda: cache.rewind(a, 1),
        "seq_clone": lambda: cache.seq_clone(a),
        "clear": cache.clear,
    }[verb]()
    before = full_state(cache)
    with pytest.raises(StepError, match="nothing declared"):
        cache.prepare_step()
    assert full_state(cache) == before


def test_a_removed_id_handed_out_again_gets_no_old_declaration(cache):
    a = cache.seq_new()
    cache.declare_step([a, a, a])
    cache.seq_rm(a)
    assert cache.seq_new() == a  # the same id, an unrelated sequence
    with pytest.raises(StepError, match="nothing declared"):
        cache.prepare_step()
    assert cache.pos(a) == 0


def test_seq_new_keeps_the_declaration(cache):
    a = cache.seq_new()
    cache.declare_step([a, a])
    cache.seq_new()
    assert cache.prepare_step().positions.tolist() == [0, 1]


def test_prepare_rechecks_free_cells(impl):
    cache = impl.cache(capacity=8)
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a] * 4)
    cache.declare_step([b] * 4)
    c = cache.seq_clone(a)
    step_with(cache, [c] * 2)  # replaces the declaration
    cache.declare_step([b] * 2)
    assert cache.prepare_step().cells.tolist() == [6, 7]
    with pytest.raises(CapacityError):
        cache.declare_step([b])


@pytest.mark.parametrize(
    "verb",
    [
        lambda cache: cache.seq_clone(0),
        lambda cache: cache.seq_rm(1),
        lambda cache: cache.rewind(0, 1),
        lambda cache: cache.clear(),
        lambda cache: cache.declare_step([0]),
        lambda cache: step_with(cache, [0]),
    ],
    ids=["seq_clone", "seq_rm", "rewind", "clear", "declare_step", "prepare_step"],
)
def test_step_goes_stale_after_a_verb(impl, verb):
    cache = impl.cache()
    a, b = cache.seq_new(), cache.seq_new()
    step = step_with(cache, [a, a, b])
    verb(cache)
    assert step.is_stale
    for use in (
        lambda: step.cells,
        lambda: step.positions,
        lambda: step.seq_ids,
        lambda: step.width,
        lambda: step.read_len,
        lambda: step.mask(0),
    ):
        with pytest.raises(StepError, match="stale"):
            use()


def test_seq_new_keeps_the_step(cache):
    a = cache.seq_new()
    step = step_with(cache, [a])
    cache.seq_new()
    assert not step.is_stale
    cache.write(0, np.ones((1, 1, 4)), np.ones((1, 1, 4)))


def test_write_and_attend_need_a_live_step(cache):
    a = cache.seq_new()
    step_with(cache, [a])
    x = np.ones((1, 1, 4), np.float32)
    cache.write(0, x, x)
    cache.rewind(a, 0)
    with pytest.raises(StepError, match="no prepared step"):
        cache.write(0, x, x)
    with pytest.raises(StepError, match="no prepared step"):
        cache.attend(0, x)


def test_step_arrays_are_copies(cache):
    a = cache.seq_new()
    step = step_with(cache, [a, a])
    step.cells[0] = 7
    step.mask(0)[0, 0] = 9
    assert step.cells[0] == 0 and step.mask(0)[0, 0] == 1
