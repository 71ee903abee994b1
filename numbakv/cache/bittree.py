"""Bit trees: the lowest (or highest) set bit at or after (before) an index in O(log64 n).

A bit tree over n bits is a flat uint64 array `bits` and level offsets `offs`
([levels + 1] int64): level l is bits[offs[l] : offs[l + 1]], level 0 the n bits
themselves, and each level above holds one bit per word below (set = that word is
non-zero); the top level is one word. The host table keeps three: free cells, occupied
cells and free sequence ids.

    bits, offs = new_tree(200)      # all zero
    fill_tree(bits, offs, 200)      # bits 0 .. 199 set
    tree_clear(bits, offs, 0)
    tree_next(bits, offs, 0)        # 1
"""

import numbakv.cache.device  # noqa: F401, I001  (sets numba's simulator flag before numba is imported)

import numba
import numpy as np

# LLVM's ctlz and cttz, the intrinsics numba's own math.gcd is built on
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

ZERO, ONE = np.uint64(0), np.uint64(1)
ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def new_tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """An all-zero bit tree over n bits: (bits uint64, offs [levels + 1] int64)."""
    sizes = [-(-n // 64)]
    while sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // 64))
    offs = np.zeros(len(sizes) + 1, dtype=np.int64)
    offs[1:] = np.cumsum(sizes)
    return np.zeros(offs[-1], dtype=np.uint64), offs


def fill_tree(bits: np.ndarray, offs: np.ndarray, n: int) -> None:
    """Sets bits [0, n) of level 0 and the summaries above; clears the rest."""
    bits.fill(0)
    for level in range(len(offs) - 1):
        words = bits[offs[level] : offs[level + 1]]
        words[: n // 64] = ALL
        if n % 64:
            words[n // 64] = (ONE << np.uint64(n % 64)) - ONE
        n = -(-n // 64)


def level_bits(bits: np.ndarray, offs: np.ndarray, level: int, n: int) -> np.ndarray:
    """[n] bool: the first n bits of `level` (0 = the bits themselves); O(n), for checks."""
    words = bits[offs[level] : offs[level + 1]]
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


def is_consistent(bits: np.ndarray, offs: np.ndarray) -> bool:
    """Whether every summary bit says exactly whether its word below is non-zero."""
    for level in range(len(offs) - 2):
        is_nonzero = bits[offs[level] : offs[level + 1]] != 0
        if not np.array_equal(level_bits(bits, offs, level + 1, len(is_nonzero)), is_nonzero):
            return False
    return True


@numba.njit(cache=True)
def tree_set(bits, offs, i):
    """Sets bit i, and the summary bits above it that were clear."""
    tree_set_word(bits, offs, i >> 6, ONE << np.uint64(i & 63))


@numba.njit(cache=True)
def tree_clear(bits, offs, i):
    """Clears bit i, and the summary bits above it whose word became zero."""
    tree_clear_word(bits, offs, i >> 6, ONE << np.uint64(i & 63))


@numba.njit(cache=True)
def tree_set_word(bits, offs, w, mask):
    """Sets the bits `mask` (non-zero) of level-0 word w, and the summary bits above that
    were clear: many bits of one word for the cost of one."""
    for level in range(len(offs) - 1):
        k = offs[level] + w
        word = bits[k]
        bits[k] = word | mask
        if word != 0:
            return
        mask = ONE << np.uint64(w & 63)
        w >>= 6


@numba.njit(cache=True)
def tree_clear_word(bits, offs, w, mask):
    """Clears the bits `mask` of level-0 word w, and the summary bits above whose word
    became zero."""
    for level in range(len(offs) - 1):
        k = offs[level] + w
        word = bits[k] & ~mask
        bits[k] = word
        if word != 0:
            return
        mask = ONE << np.uint64(w & 63)
        w >>= 6


@numba.njit(cache=True)
def highest_bit(word):
    """Index of the highest set bit of a non-zero uint64 word (one instruction: ctlz)."""
    return np.int64(63) - np.int64(leading_zeros(word))


@numba.njit(cache=True)
def lowest_bit(word):
    """Index of the lowest set bit of a non-zero uint64 word (one instruction: cttz)."""
    return np.int64(trailing_zeros(word))


@numba.njit(cache=True)
def tree_next(bits, offs, i):
    """The lowest set bit >= i, or -1: up while the rest of a word is empty, then down."""
    n_levels = len(offs) - 1
    level = 0
    while True:
        w = i >> 6
        if w >= offs[level + 1] - offs[level]:
            return -1
        word = bits[offs[level] + w] & (ALL << np.uint64(i & 63))
        if word != 0:
            i = (w << 6) + lowest_bit(word)
            break
        level += 1
        if level == n_levels:
            return -1
        i = w + 1
    while level > 0:
        level -= 1
        i = (i << 6) + lowest_bit(bits[offs[level] + i])
    return i


@numba.njit(cache=True)
def tree_prev(bits, offs, i):
    """The highest set bit <= i (i < n), or -1: up while a word's lower part is empty, then down."""
    n_levels = len(offs) - 1
    level = 0
    while True:
        if i < 0:
            return -1
        w = i >> 6
        word = bits[offs[level] + w] & (ALL >> np.uint64(63 - (i & 63)))
        if word != 0:
            i = (w << 6) + highest_bit(word)
            break
        level += 1
        if level == n_levels:
            return -1
        i = w - 1
    while level > 0:
        level -= 1
        i = (i << 6) + highest_bit(bits[offs[level] + i])
    return i


@numba.njit(cache=True)
def lowest_set_bits(bits, offs, n):
    """[n] int32: the n lowest set bits, ascending. The caller knows at least n bits are set."""
    found = np.empty(n, dtype=np.int32)
    lowest_set_bits_into(bits, offs, found)
    return found


@numba.njit(cache=True)
def lowest_set_bits_into(bits, offs, found):
    """Writes the len(found) lowest set bits into `found` ([n] int32), ascending, whole
    level-0 words at a time. The caller knows at least n bits are set."""
    n = len(found)
    k = 0
    i = tree_next(bits, offs, 0) if n > 0 else -1
    while i >= 0:
        w = i >> 6
        word = bits[w] & (ALL << np.uint64(i & 63))  # level 0 starts at offs[0] = 0
        while word != 0 and k < n:
            found[k] = (w << 6) + lowest_bit(word)
            word &= word - ONE
            k += 1
        if k == n:
            break
        i = tree_next(bits, offs, (w + 1) << 6)
