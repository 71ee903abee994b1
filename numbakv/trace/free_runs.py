"""The longest run of free cells, kept as cells change (numba-free): `FreeRuns`, a segment
tree over blocks of cells whose nodes hold the free run at their start, at their end and
the longest inside. The tree is brought up to date only when the longest run can change;
then changing k cells costs O(k + blocks changed x log n), vectorized a tree level at a
time, so a trace's largest free run per frame (`largest_per_frame`, told only the cells
each frame frees or takes) costs O(changes log cells), not O(frames x cells).
"""

from itertools import pairwise

import numpy as np

from numbakv.core.snapshot import FREE

HEAD, TAIL, BEST = 0, 1, 2  # a node's columns
BLOCK = 64  # cells under a leaf: its runs come from its cells in one numpy pass
FEW = 16  # nodes a level below which `set` climbs in Python


class FreeRuns:
    """Cells [0, n_cells), each free or not (all not free at first).

    >>> runs = FreeRuns(8)
    >>> runs.set(np.arange(2, 7), np.ones(5, dtype=bool))
    >>> runs.set(np.array([4]), np.array([False]))
    >>> runs.largest, runs.longest()
    (2, (2, 4))
    """

    def __init__(self, n_cells: int):
        n_blocks = -(-max(n_cells, 1) // BLOCK)
        self.size = 1 << (n_blocks - 1).bit_length()  # leaves: a power of two
        self.free = np.zeros((self.size, BLOCK), dtype=bool)  # [leaf, cell in it]
        # node i's children are 2i and 2i + 1; leaf b is node size + b; node 1 is the root.
        # Per node: the free cells at its start (HEAD), at its end (TAIL), its longest run
        self.tree = np.zeros((2 * self.size, 3), dtype=np.int64)
        self._children = self.tree.reshape(self.size, 2, 3)  # [i]: nodes 2i, 2i + 1 at once
        self._stale: list[np.ndarray] = []  # blocks changed since the tree was brought up
        self._best = (0, 0)  # [start, end) of the first longest run

    @property
    def largest(self) -> int:
        """The longest run of consecutive free cells."""
        return self._best[1] - self._best[0]

    def longest(self) -> tuple[int, int]:
        """[start, end) of the first longest run of free cells ((0, 0) when none is free)."""
        return self._best

    def set(self, cells: np.ndarray, free: np.ndarray) -> None:
        """Cells `cells` ([k] ints in [0, n_cells), ascending, no repeats) are free where
        `free` ([k] bool) is True, not free elsewhere."""
        cells, flat = np.asarray(cells, dtype=np.int64), self.free.reshape(-1)
        flips = flat[cells] != free  # only cells that change move their leaves
        if not flips.any():
            return
        cells, freed = cells[flips], free[flips]
        flat[cells] = freed
        self._stale.append(_distinct(cells // BLOCK))
        taken = cells[~freed]
        start, end = self._best
        # the longest run grows only when a cell is freed and shrinks only when one of its
        # own is taken: otherwise it stands (and stays the first), and the tree waits
        if freed.any() or ((taken >= start) & (taken < end)).any():
            self._update(_distinct(np.sort(np.concatenate(self._stale))))
            self._stale, self._best = [], self._find_longest()

    def _find_longest(self) -> tuple[int, int]:
        """[start, end) of the first longest run, down the tree from the root."""
        tree, node, start = self.tree, 1, 0
        span = self.size * BLOCK  # cells under `node`
        best = int(tree[1, BEST])
        if best == 0:
            return 0, 0
        while node < self.size:
            span //= 2
            left, right = tree[2 * node].tolist(), tree[2 * node + 1].tolist()
            if left[BEST] == best:
                node = 2 * node
            elif left[TAIL] + right[HEAD] == best:  # across the middle
                return start + span - left[TAIL], start + span - left[TAIL] + best
            else:
                node, start = 2 * node + 1, start + span
        runs = _runs_ending(self.free[node - self.size][None])[0]
        end = start + int(np.argmax(runs == best)) + 1  # the first run of `best` in the leaf
        return end - best, end

    def _update(self, blocks: np.ndarray) -> None:
        """Leaves `blocks` (ascending, distinct) from their cells, then their ancestors."""
        block_free = self.free[blocks]
        runs = _runs_ending(block_free)
        nodes = self.size + blocks
        whole = runs[:, -1] == BLOCK
        self.tree[nodes, HEAD] = np.where(whole, BLOCK, np.argmin(block_free, axis=1))
        self.tree[nodes, TAIL] = runs[:, -1]
        self.tree[nodes, BEST] = runs.max(axis=1)
        span = BLOCK  # cells under a child at this level
        while span < self.size * BLOCK:
            if len(nodes) <= FEW:
                return self._climb(nodes.tolist(), span)
            nodes = _distinct(nodes >> 1)
            kids = self._children[nodes]  # [k, 2 (left, right), 3]
            left, right = kids[:, 0], kids[:, 1]
            up = np.empty((len(nodes), 3), dtype=np.int64)
            up[:, HEAD] = left[:, HEAD] + (left[:, HEAD] == span) * right[:, HEAD]
            up[:, TAIL] = right[:, TAIL] + (right[:, TAIL] == span) * left[:, TAIL]
            up[:, BEST] = np.maximum(
                np.maximum(left[:, BEST], right[:, BEST]), left[:, TAIL] + right[:, HEAD]
            )
            self.tree[nodes] = up
            span *= 2

    def _climb(self, nodes: list[int], span: int) -> None:
        """`_update`'s climb for a few nodes, in Python ints: cheaper than numpy calls there."""
        tree = self.tree
        while span < self.size * BLOCK:
            nodes = sorted({node >> 1 for node in nodes})
            for node in nodes:
                lh, lt, lb, rh, rt, rb = tree[2 * node : 2 * node + 2].ravel().tolist()
                tree[node] = (
                    lh + rh if lh == span else lh,
                    rt + lt if rt == span else rt,
                    max(lb, rb, lt + rh),
                )
            span *= 2


def largest_per_frame(
    rows: np.ndarray, cells: np.ndarray, codes: np.ndarray, frames: np.ndarray, previous: np.ndarray
) -> np.ndarray:
    """[n_frames] int64: the longest run of free cells among a trace's allocated rows
    [0, rows) after each frame, from its changes: [n] `cells`, `codes`, `frames` and the
    same cell's change before each (`previous`, -1 for none); [n_frames] `rows`."""
    runs, out = FreeRuns(int(rows.max(initial=0))), np.zeros(len(rows), dtype=np.int64)
    bounds, cells, free = _flips(rows.astype(np.int64), cells, codes == FREE, frames, previous)
    for f, (start, end) in enumerate(pairwise(bounds)):
        if end > start:
            runs.set(cells[start:end], free[start:end])
        out[f] = runs.largest
    return out


def _flips(
    rows: np.ndarray, cells: np.ndarray, now_free: np.ndarray, frames: np.ndarray,
    previous: np.ndarray,
) -> tuple[list[int], np.ndarray, np.ndarray]:  # fmt: skip
    """(bounds [n_frames + 1], cells [k] int64, free [k] bool): the cells of the allocated
    rows each frame frees or takes, frame f's [bounds[f], bounds[f + 1]), ascending. A cell
    is free for placement once the rows reach it, while its code is FREE (`now_free` [n]
    bool after each change): a change below the rows before its frame counts when it frees
    or takes its cell; the cells the rows grow by (rows never shrink) count when free."""
    allocated = np.append(0, rows[:-1])  # each frame's rows before it
    was_free = np.append(now_free, True)[previous]
    flips = (cells < allocated[frames]) & (was_free != now_free)
    grown = rows - allocated
    new_frames = np.repeat(np.arange(len(rows)), grown)
    new_cells = np.arange(len(new_frames)) + np.repeat(allocated - np.cumsum(grown) + grown, grown)
    span = int(rows.max(initial=0)) + 1
    new_keys = new_frames * span + new_cells
    taken = frames[~now_free] * span + cells[~now_free]  # ascending
    new_keys = new_keys[~np.isin(new_keys, taken, assume_unique=True)]  # taken at once: no
    keys = np.concatenate([(frames[flips] * span + cells[flips]) * 2 + now_free[flips],
                           new_keys * 2 + 1])  # fmt: skip
    keys.sort()
    bounds = np.searchsorted(keys, np.arange(len(rows) + 1) * span * 2).tolist()
    return bounds, (keys >> 1) % span, (keys & 1).astype(bool)


def _runs_ending(free: np.ndarray) -> np.ndarray:
    """[k, BLOCK] int64: the free run ending at each cell of `free` ([k, BLOCK] bool blocks),
    0 at a cell that is not free."""
    at = np.arange(BLOCK)
    return at - np.maximum.accumulate(np.where(free, -1, at), axis=1)


def _distinct(ascending: np.ndarray) -> np.ndarray:
    """`ascending` ([k] ints, sorted) without repeats."""
    return ascending[np.append(True, ascending[1:] != ascending[:-1])]
