"""The bit trees of the host table: next and previous set bit at word and level edges, and
the bit scans of one word."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv.cache.bittree import (
    fill_tree,
    highest_bit,
    is_consistent,
    level_bits,
    lowest_bit,
    lowest_set_bits,
    new_tree,
    tree_clear,
    tree_next,
    tree_prev,
    tree_set,
)


@pytest.mark.parametrize("n", [1, 63, 64, 65, 4095, 4096, 4097, 64**3 + 1])
def test_bit_tree_next_and_prev(n):
    rng = np.random.default_rng(n)
    bits, offs = new_tree(n)
    expect = np.zeros(n, dtype=bool)
    edges = [0, 63, 64, 4095, 4096, n - 1]
    picks = [i for i in edges if i < n] + rng.integers(0, n, 20).tolist()
    for i in picks:
        tree_set(bits, offs, i)
        expect[i] = True
    for i in picks[::3]:
        tree_clear(bits, offs, i)
        expect[i] = False
    on = np.flatnonzero(expect)
    for i in sorted(set(picks) | {0, n - 1}):
        after = on[on >= i]
        below = on[on <= i]
        assert tree_next(bits, offs, i) == (after[0] if len(after) else -1)
        assert tree_prev(bits, offs, i) == (below[-1] if len(below) else -1)
    assert tree_next(bits, offs, n) == -1


@given(st.integers(1, 2**64 - 1))
def test_bit_scans_of_a_word(word):
    assert highest_bit(np.uint64(word)) == word.bit_length() - 1
    assert lowest_bit(np.uint64(word)) == (word & -word).bit_length() - 1


@pytest.mark.parametrize("n", [1, 64, 65, 4097])
def test_fill_clear_and_the_lowest_set_bits(n):
    bits, offs = new_tree(n)
    fill_tree(bits, offs, n)
    assert level_bits(bits, offs, 0, n).all() and is_consistent(bits, offs)
    for i in range(0, n, 3):
        tree_clear(bits, offs, i)
    expect = [i for i in range(n) if i % 3]
    assert lowest_set_bits(bits, offs, len(expect)).tolist() == expect
    assert is_consistent(bits, offs)


@pytest.mark.parametrize("n", [65, 4097])
def test_is_consistent_catches_a_stale_summary(n):
    bits, offs = new_tree(n)
    fill_tree(bits, offs, n)
    bits[offs[1]] ^= np.uint64(1)  # word 0 holds bits, its summary bit now says it is empty
    assert not is_consistent(bits, offs)
