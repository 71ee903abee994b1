"""The longest run of free cells after each frame of a trace (numba-free), from the cells
each frame frees or takes, every frame at once.

A segment tree over 64-cell words: a node holds the free run at its start, at its end and
the longest inside. It is never built whole per frame: a level keeps an entry only for a
(node, frame) where one of the node's cells flipped, keyed node * n_frames + frame and
ascending, and a parent's entries come from its children's, each child read at its
latest entry at or before the frame (a search of the level's keys). The leaves' words are
the running XOR of the bits each frame flips, their runs read with bit arithmetic. So a
trace costs a few dozen whole-array passes per level over O(flips) entries (a search
each: O(flips log flips) a level), not a numpy call per frame and level.
"""

import numpy as np

from numbakv.core.snapshot import FREE

WORD = 64  # cells under a leaf: bit i of its uint64 is its cell i, set while free
_ALL = np.uint64(2**64 - 1)
_ONE = np.uint64(1)


def largest_per_frame(
    rows: np.ndarray, cells: np.ndarray, codes: np.ndarray, frames: np.ndarray, previous: np.ndarray
) -> np.ndarray:
    """[n_frames] int64: the longest run of free cells among a trace's allocated rows
    [0, rows) after each frame, from its changes: [n] `cells`, `codes`, `frames` and the
    same cell's change before each (`previous`, -1 for none); [n_frames] `rows`."""
    flip_frames, flip_cells = _flips(rows.astype(np.int64), cells, codes == FREE, frames, previous)
    return largest_after(flip_frames, flip_cells, len(rows), int(rows.max(initial=0)))


def largest_after(frames: np.ndarray, cells: np.ndarray, n_frames: int, n_cells: int) -> np.ndarray:
    """[n_frames] int64: the longest run of free cells of [0, n_cells) after each frame,
    every cell taken before frame 0 and each of [k] `cells` (ints) flipping, free to taken
    or taken to free, at its entry of `frames` ([k] ints in [0, n_frames), ascending; a
    cell at most once a frame)."""
    if len(cells) == 0:
        return np.zeros(n_frames, dtype=np.int64)
    n_nodes = 1 << (-(-max(n_cells, 1) // WORD) - 1).bit_length()  # leaves: a power of two
    frames, cells = np.asarray(frames, np.int64), np.asarray(cells, np.int64)
    keys, runs = _leaves(frames, cells, n_frames, n_nodes)
    span = WORD  # cells under a node of the level
    while n_nodes > 1:
        keys, runs = _parents(keys, runs, n_frames, span)
        n_nodes, span = n_nodes // 2, 2 * span
    latest = np.full(n_frames, -1, dtype=np.int64)  # the root's entry in force at each frame
    latest[keys] = np.arange(len(keys))
    np.maximum.accumulate(latest, out=latest)
    return np.where(latest >= 0, runs[2][latest], 0)


def _leaves(frames: np.ndarray, cells: np.ndarray, n_frames: int, n_leaves: int) -> tuple:
    """(keys, (head, tail, best)) [e] int64 each: an entry per (leaf, frame) where the leaf's
    cells flip, keyed leaf * n_frames + frame ascending, with the runs of its word after it."""
    keys, words = _words(*_flip_bits(frames, cells, n_frames, n_leaves), n_frames)
    return keys, _word_runs(words)


def _flip_bits(frames: np.ndarray, cells: np.ndarray, n_frames: int, n_leaves: int) -> tuple:
    """([k] int64 key leaf * n_frames + frame, [k] uint64 the cell's bit in its leaf's word)
    of each flip, by leaf then frame."""
    leaf = cells >> 6
    order = np.argsort(radix_keys(leaf, n_leaves), kind="stable")  # by frame already: then leaf
    keys = leaf[order]
    keys *= n_frames
    keys += frames[order]
    return keys, np.left_shift(_ONE, (cells[order] & 63).astype(np.uint64))


def _words(keys: np.ndarray, bits: np.ndarray, n_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """([e] distinct `keys`, [e] uint64 the leaf's word after the frame): the XOR of the
    `bits` flipped at each key, then of every key of its leaf before it."""
    first = run_starts(keys)
    words = np.bitwise_xor.accumulate(np.bitwise_xor.reduceat(bits, first))
    keys = keys[first]
    # a leaf's word: the running XOR less what the leaves before it left
    leaf_first = run_starts(keys // n_frames)
    sizes = np.diff(leaf_first, append=len(keys))
    words ^= np.append(np.uint64(0), words)[np.repeat(leaf_first, sizes)]
    return keys, words


def _word_runs(words: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """([k] int64 head, tail, best) of [k] uint64 `words`: the set bits from bit 0 up, from
    bit 63 down, and the longest run of set bits."""
    head = np.bitwise_count((~words & (words + _ONE)) - _ONE)  # the bits below the lowest 0
    smeared = ~words  # its highest set bit smeared down: 64 - its bits = the 1s above it
    for shift in (1, 2, 4, 8, 16, 32):
        smeared |= smeared >> np.uint64(shift)
    tail = WORD - np.bitwise_count(smeared).astype(np.int64)
    # runs[j]: bit i set where bits i .. i + 2^j - 1 all are; the longest run found by
    # adding the largest 2^j that still leaves a bit set, from 32 down
    runs = [words]
    for shift in (1, 2, 4, 8, 16):
        runs.append(runs[-1] & (runs[-1] >> np.uint64(shift)))
    at, best = np.full(len(words), _ALL), np.zeros(len(words), dtype=np.uint64)
    for j in range(5, -1, -1):
        longer = at & (runs[j] >> best)
        hit = longer != 0
        at = np.where(hit, longer, at)
        best += hit.astype(np.uint64) << np.uint64(j)
    best = np.where(words == _ALL, WORD, best.astype(np.int64))
    return head.astype(np.int64), tail, best


def _parents(keys: np.ndarray, runs: tuple, n_frames: int, span: int) -> tuple:
    """(keys, runs) of the level above `keys` ([e] node * n_frames + frame, ascending, with
    their `runs`, `span` cells a node): an entry per (parent, frame) where a child changed,
    from each child's latest entry at or before the frame (none: all its cells taken)."""
    # a parent's keys are two ascending runs (its left child's, its right's): timsort merges
    parents = np.sort((keys // n_frames >> 1) * n_frames + keys % n_frames, kind="stable")
    parents = parents[run_starts(parents)]
    children = (parents // n_frames * 2) * n_frames + parents % n_frames
    (lh, lt, lb), (rh, rt, rb) = (
        _latest(keys, runs, child, n_frames) for child in (children, children + n_frames)
    )
    head = lh + (lh == span) * rh
    tail = rt + (rt == span) * lt
    best = np.maximum(np.maximum(lb, rb), lt + rh)
    return parents, (head, tail, best)


def _latest(keys: np.ndarray, runs: tuple, wanted: np.ndarray, n_frames: int) -> tuple:
    """The runs of each node of `wanted` ([p] node * n_frames + frame) at its latest entry
    in `keys` at or before that frame; 0s where it has none."""
    before = np.searchsorted(keys, wanted, side="right") - 1
    at = np.maximum(before, 0)
    found = (before >= 0) & (keys[at] >= wanted - wanted % n_frames)  # the node's own entry
    return tuple(np.where(found, column[at], 0) for column in runs)


def _flips(
    rows: np.ndarray, cells: np.ndarray, now_free: np.ndarray, frames: np.ndarray,
    previous: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(frame, cell) [k] int64 each, by frame then cell: the cells of the allocated rows each
    frame frees or takes (each flips its cell). A cell is free for placement once the rows
    reach it, while its code is FREE (`now_free` [n] bool after each change): a change
    below the rows before its frame counts when it frees or takes its cell; the cells the
    rows grow by (rows never shrink) count when free."""
    allocated = np.append(0, rows[:-1])  # each frame's rows before it
    below = cells < allocated.astype(np.int32)[frames]  # the cell was allocated before
    flips = below & (np.append(now_free, True)[previous] != now_free)
    grown = rows - allocated
    new_frames = np.repeat(np.arange(len(rows)), grown)
    new_cells = np.arange(len(new_frames)) + np.repeat(allocated - np.cumsum(grown) + grown, grown)
    span = int(rows.max(initial=0)) + 1
    new_keys = new_frames * span + new_cells
    taken = np.flatnonzero(~below & ~now_free)  # a cell the rows grew by, taken at once: no
    taken = frames[taken] * span + cells[taken]  # ascending
    new_keys = new_keys[~np.isin(new_keys, taken, assume_unique=True)]
    keys = np.concatenate([frames[flips] * span + cells[flips], new_keys])
    keys.sort()
    return np.divmod(keys, span)


def radix_keys(keys: np.ndarray, n: int) -> np.ndarray:
    """`keys` ([k] ints in [0, n)) as uint16 where they fit: numpy sorts those by radix
    (kind="stable": O(k), keys equal kept in order)."""
    return keys.astype(np.uint16) if n <= 1 << 16 else keys


def run_starts(ascending: np.ndarray) -> np.ndarray:
    """[g] int64: where each run of equal values of `ascending` ([k] ints) starts (none
    for none)."""
    return np.flatnonzero(np.append(True, ascending[1:] != ascending[:-1])[: len(ascending)])
