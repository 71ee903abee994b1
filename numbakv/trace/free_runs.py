"""The longest run of free cells, kept as cells change (numba-free): `FreeRuns`, a segment
tree over the cells whose nodes hold the free run at their start, at their end and the
longest inside. Changing k cells costs O(k log n), vectorized a tree level at a time, so a
trace's largest free run per frame costs O(changes log cells), not O(frames x cells).
"""

import numpy as np

HEAD, TAIL, BEST = 0, 1, 2  # a node's columns
FEW = 16  # nodes a level below which `set` climbs in Python


class FreeRuns:
    """Cells [0, n_cells), each free or not (all not free at first).

    >>> runs = FreeRuns(8)
    >>> runs.set(np.arange(2, 7), np.ones(5, dtype=bool))
    >>> runs.set(np.array([4]), np.array([False]))
    >>> runs.largest
    2
    """

    def __init__(self, n_cells: int):
        self.size = 1 << max(n_cells - 1, 0).bit_length()  # leaves: a power of two
        # node i's children are 2i and 2i + 1; leaf c is node size + c; node 1 is the root.
        # Per node: the free cells at its start (HEAD), at its end (TAIL), its longest run
        self.tree = np.zeros((2 * self.size, 3), dtype=np.int64)
        self._children = self.tree.reshape(self.size, 2, 3)  # [i]: nodes 2i, 2i + 1 at once

    @property
    def largest(self) -> int:
        """The longest run of consecutive free cells."""
        return int(self.tree[1, BEST])

    def set(self, cells: np.ndarray, free: np.ndarray) -> None:
        """Cells `cells` ([k] ints in [0, n_cells), ascending, no repeats) are free where
        `free` ([k] bool) is True, not free elsewhere."""
        nodes = self.size + np.asarray(cells, dtype=np.int64)
        flips = self.tree[nodes, BEST] != free  # only leaves that change move their ancestors
        nodes = nodes[flips]
        if nodes.size == 0:
            return
        self.tree[nodes] = free[flips, None]
        span = 1  # cells under a child at this level
        while span < self.size:
            if len(nodes) <= FEW:
                return self._climb(nodes.tolist(), span)
            nodes = nodes >> 1
            nodes = nodes[np.append(True, nodes[1:] != nodes[:-1])]  # ascending stays unique
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
        """`set`'s climb for a few nodes, in Python ints: cheaper than numpy calls there."""
        tree = self.tree
        while span < self.size:
            nodes = sorted({node >> 1 for node in nodes})
            for node in nodes:
                lh, lt, lb, rh, rt, rb = tree[2 * node : 2 * node + 2].ravel().tolist()
                tree[node] = (
                    lh + rh if lh == span else lh,
                    rt + lt if rt == span else rt,
                    max(lb, rb, lt + rh),
                )
            span *= 2
