"""The order in which refusals are checked (docs/contract.md, "The order of refusals"), on
both implementations: each case breaks two rules at once, and the rule the table lists
first must be the one that raises. A cache of another layout that wants to refuse like the
reference follows the same order."""

import pytest

from numbakv.core.errors import CapacityError, SequenceError, StepError

from helpers import step_with


def full(cache) -> list[int]:
    """Every cell taken (16 of 16, by two sequences); returns their ids."""
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a] * 8, None)
    step_with(cache, [b] * 8, None)
    assert cache.free_cells == 0
    return [a, b]


def every_id_live(cache) -> list[int]:
    return [cache.seq_new() for _ in range(cache.config.max_seqs)]


CASES = {
    # declare_step: the sequence's form, then each id, then the count, then free cells
    "a dead id on a full cache": (lambda c: (full(c), c.declare_step([3]))),
    "too wide on a full cache": (lambda c: (full(c), c.declare_step([0] * 9))),
    "empty on a full cache": (lambda c: (full(c), c.declare_step([]))),
    "not a sequence, with a dead id": (lambda c: c.declare_step(iter([3]))),
    # seq_clone: src, then upto, then a free id
    "a bad upto with every id live": (
        lambda c: (every_id_live(c), step_with(c, [0], None), c.seq_clone(0, 5))
    ),
    "a dead src with every id live": (lambda c: (every_id_live(c), c.seq_clone(99))),
    # rewind: the id, then the position
    "a dead id and a bad position": (lambda c: c.rewind(3, -1)),
}
EXPECTED = {
    "a dead id on a full cache": SequenceError,
    "too wide on a full cache": StepError,
    "empty on a full cache": StepError,
    "not a sequence, with a dead id": StepError,
    "a bad upto with every id live": SequenceError,
    "a dead src with every id live": SequenceError,
    "a dead id and a bad position": SequenceError,
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_first_rule_in_the_table_raises(impl, case):
    cache = impl.cache(max_width=8, capacity=16)
    with pytest.raises(EXPECTED[case]):
        CASES[case](cache)


def test_a_full_cache_refuses_a_fitting_declaration_with_capacity_error(impl):
    # the contrast to "too wide on a full cache": the count is fine, the cells are not
    cache = impl.cache(max_width=8, capacity=16)
    a, _ = full(cache)
    with pytest.raises(CapacityError, match="0 of 16 cells are free"):
        cache.declare_step([a])


def test_a_cell_shared_by_clones_counts_once(impl):
    # capacity counts cells, not positions per sequence: a clone of 6 positions takes none
    cache = impl.cache(max_width=8, capacity=16)
    a = cache.seq_new()
    step_with(cache, [a] * 6, None)
    clone = cache.seq_clone(a)
    assert (cache.used_cells, cache.free_cells, cache.pos(clone)) == (6, 10, 6)
    step_with(cache, [clone] * 8, None)  # 8 new cells: 14 used
    assert cache.used_cells == 14
