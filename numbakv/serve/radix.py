"""The prefix cache's tree: runs of token ids whose K/V sit in a cell cache, found by
their prefixes. Pure Python and NumPy; it changes no cache (`numbakv.serve.prefix` does).

A `Node` is an edge of the tree: a run of tokens (positions [depth - len(tokens), depth)
of every sequence below it) and the sequences that own those cells. The tree is
physical: every sequence based at a node or below it holds the same cells for the node's
positions (it was cloned from one that did), so a node's cells are counted once, and two
children of one node with the same first token are two copies of the same tokens (two
requests computed them apart) — lookups take the longer match.

    holder  the one sequence the prefix cache holds here (its positions end at `depth`);
            only a node without children has one
    live    the caller's sequences based here: they own the node's path, and nothing
            below it is theirs in the tree
    n_live  live sequences here or below: a node with none is held by the cache alone
    used    the clock of its last hit or insert; an ancestor is never older than a node
            below it, so the least recently used node without children goes first
"""

from collections.abc import Callable, Iterator
from heapq import heapify, heappop, heappush, heapreplace

import numpy as np


class Node:
    """An edge of the tree: `tokens` ([k] int64) end at position `depth`."""

    __slots__ = (
        "_tokens",
        "children",
        "depth",
        "holder",
        "live",
        "n_live",
        "parent",
        "raw",
        "used",
    )

    def __init__(self, tokens: np.ndarray, depth: int, parent: "Node | None", used: int = 0):
        self.tokens = tokens
        self.depth = depth
        self.parent = parent
        self.children: dict[int, list[Node]] = {}
        self.holder: int | None = None
        self.live: set[int] = set()
        self.n_live = 0
        self.used = used

    @property
    def tokens(self) -> np.ndarray:
        return self._tokens

    @tokens.setter
    def tokens(self, tokens: np.ndarray) -> None:
        self._tokens = tokens
        self.raw = tokens.tobytes()  # its bytes: a run that matches whole is one memcmp

    @property
    def start(self) -> int:
        """The position of its first token."""
        return self.depth - len(self.tokens)

    @property
    def is_owned(self) -> bool:
        """True while a sequence owns its cells: a holder, a live one, or one below it."""
        return self.holder is not None or bool(self.live) or bool(self.children)

    def child_list(self) -> Iterator["Node"]:
        for nodes in self.children.values():
            yield from nodes

    def adopt(self, child: "Node") -> None:
        self.children.setdefault(int(child.tokens[0]), []).append(child)

    def disown(self, child: "Node") -> None:
        key = int(child.tokens[0])
        self.children[key].remove(child)
        if not self.children[key]:
            del self.children[key]

    def path(self) -> Iterator["Node"]:
        """This node and its ancestors up to the root."""
        node: Node | None = self
        while node is not None:
            yield node
            node = node.parent


def common_length(run: np.ndarray, tokens: np.ndarray, at: int, limit: int) -> int:
    """How many leading tokens of `run` equal tokens[at:limit]."""
    n = min(len(run), limit - at)
    if n <= 0:
        return 0
    same = run[:n] == tokens[at : at + n]
    return n if same.all() else int(np.argmin(same))


def walk(node: Node, tokens: np.ndarray, limit: int) -> tuple[Node, int]:
    """(the node the longest match of tokens[:limit] ends in, its length), going down
    from `node` (the root, or a node whose path `tokens` begin with): the match ends at
    that node's end, or inside it when the length is below its depth. Where a node has
    copies of one run (children with the same first token), each is followed and the
    longer match wins (the more recently used on a tie)."""
    return _walk(node, _Query(tokens), limit)


class _Query:
    """The tokens a walk matches, as NumPy, bytes (int64) and the bytes read as ints (a
    memoryview: an id is read where an edge begins, none converted before), made once."""

    __slots__ = ("ids", "raw", "tokens")

    def __init__(self, tokens: np.ndarray):
        self.tokens, self.raw = tokens, tokens.tobytes()
        self.ids = memoryview(self.raw).cast("q")


def _walk(node: Node, query: _Query, limit: int) -> tuple[Node, int]:
    raw, ids, m = query.raw, query.ids, node.depth
    while m < limit:
        children = node.children.get(ids[m])
        if children is None:
            break
        if len(children) > 1:
            ends = [_follow(child, query, m, limit) for child in children]
            return max(ends, key=lambda end: (end[1], end[0].used))
        node = children[0]
        if not raw.startswith(node.raw, m << 3, limit << 3):  # not all of it matches
            return node, m + common_length(node.tokens, query.tokens, m, limit)
        m = node.depth
    return node, m


def _follow(child: Node, query: _Query, m: int, limit: int) -> tuple[Node, int]:
    """The match going on from position `m` into `child` and, when all of it matches,
    below it. All of an edge matching is one bytes compare, in place; NumPy finds where a
    partial match ends."""
    if not query.raw.startswith(child.raw, m << 3, limit << 3):
        return child, m + common_length(child.tokens, query.tokens, m, limit)
    return _walk(child, query, limit)


def split(node: Node, depth: int) -> Node:
    """A new node above `node` holding its tokens before position `depth` (strictly inside
    it); `node` keeps the rest, its children, holder and live sequences, so a reference to
    it still names the same end."""
    k = depth - node.start
    parent = node.parent
    assert parent is not None and 0 < k < len(node.tokens)
    top = Node(node.tokens[:k], depth, parent, node.used)
    top.n_live = node.n_live
    parent.disown(node)
    parent.adopt(top)
    node.tokens = node.tokens[k:]
    node.parent = top
    top.adopt(node)
    return top


def owner_below(node: Node) -> int:
    """A sequence holding `node`'s path: its holder, a live one, or one of a child's."""
    while True:
        if node.holder is not None:
            return node.holder
        if node.live:
            return min(node.live)
        node = next(node.child_list())


def add_live(node: Node, delta: int, clock: int | None = None) -> int:
    """Adds `delta` (+1, -1) live sequences at `node` to the counts of its path (and sets
    its `used` to `clock`, when given); returns the change in the cells held by the cache
    alone (nodes whose count left or reached 0)."""
    change = 0
    n: Node | None = node
    while n is not None:
        before = n.n_live
        n.n_live = before + delta
        if before == 0:
            change -= len(n.raw) >> 3
        elif n.n_live == 0:
            change += len(n.raw) >> 3
        if clock is not None:
            n.used = clock
        n = n.parent
    return change


def touch(node: Node, clock: int) -> list[Node]:
    """Sets the `used` of `node` and its ancestors to `clock`; returns those ancestors
    that have a holder (nearest first)."""
    node.used = clock
    held = []
    n = node.parent
    while n is not None:
        n.used = clock
        if n.holder is not None:
            held.append(n)
        n = n.parent
    return held


def path_raw(node: Node) -> bytes:
    """The int64 bytes of every token from the root to `node`'s end (a join of the runs'
    bytes)."""
    runs = []
    n: Node | None = node
    while n is not None:
        runs.append(n.raw)
        n = n.parent
    runs.reverse()
    return b"".join(runs)


def path_tokens(node: Node) -> np.ndarray:
    """Every token from the root to `node`'s end."""
    runs = [n.tokens for n in node.path()]
    return np.concatenate(runs[::-1]) if runs else np.zeros(0, np.int64)


def root_of(node: Node) -> Node:
    """The root of `node`'s tree."""
    while node.parent is not None:
        node = node.parent
    return node


def recount(root: Node) -> tuple[int, int]:
    """(cells, cells no live sequence holds) of the tree under `root`, recounted; an
    AssertionError naming the first node whose live count is wrong or that no one owns."""
    n_cells = cached = 0
    stack = [root]
    while stack:
        node = stack.pop()
        n_live = len(node.live) + sum(c.n_live for c in node.child_list())
        assert node.n_live == n_live, f"node at {node.depth}: n_live {node.n_live}"
        assert node.parent is None or node.is_owned, f"node at {node.depth}: no owner"
        n_cells += len(node.tokens)
        cached += len(node.tokens) if node.n_live == 0 else 0
        stack.extend(node.child_list())
    return n_cells, cached


class Holders:
    """The sequences the prefix cache holds, each at its node (`nodes`, in the order they
    were held), with the least recently used found in O(log n) amortized time.

    A heap holds an entry (used, since, seq) per hold, `since` counting holds, so entries
    order as a scan of `nodes` for the least `used` does (on a tie, the first held). An
    entry is not taken out when it goes stale: when its holder goes (`since` is no longer
    its hold's) it is dropped once it comes to the top, and when its node is used again
    (`used` only grows, so the entry is a lower bound) it is pushed again with the node's
    `used` then. The heap is rebuilt once it holds more than twice the holders (and 32).
    """

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}  # holder -> its node, in the order held
        self._since: dict[int, int] = {}  # holder -> the count of its hold
        self._heap: list[tuple[int, int, int]] = []  # (used, since, holder)
        self._count = 0

    def __len__(self) -> int:
        return len(self.nodes)

    def __contains__(self, seq: int) -> bool:
        return seq in self.nodes

    def hold(self, seq: int, node: Node) -> None:
        """`seq`, held by none, is held at `node` (its `used` set already)."""
        node.holder = seq
        self.nodes[seq] = node
        self._count += 1
        self._since[seq] = self._count
        heappush(self._heap, (node.used, self._count, seq))
        self._compact()

    def release(self, seq: int) -> None:
        """`seq` is held no more (its node's holder reset)."""
        self.nodes.pop(seq).holder = None
        del self._since[seq]
        self._compact()

    def coldest(self, wanted: Callable[[Node], bool]) -> Node | None:
        """The node of the least recently used holder that `wanted` takes (the first held
        on a tie), or None. Each holder passed over costs O(log n)."""
        heap, passed, found = self._heap, [], None
        while heap:
            used, since, seq = heap[0]
            node = self.nodes.get(seq)
            if node is None or self._since[seq] != since:
                heappop(heap)  # that hold ended
            elif node.used != used:
                heapreplace(heap, (node.used, since, seq))  # used since it was pushed
            elif wanted(node):
                found = node
                break
            else:
                passed.append(heappop(heap))
        for entry in passed:
            heappush(heap, entry)
        return found

    def _compact(self) -> None:
        """Rebuilds the heap, an entry per holder, once most of its entries are stale."""
        if len(self._heap) > max(32, 2 * len(self.nodes)):
            self._heap = [(n.used, self._since[s], s) for s, n in self.nodes.items()]
            heapify(self._heap)
