"""`PrefixCache`: prompts that share a prefix share its cells, at token granularity and
with no byte copied (docs/contract.md §9.2).

It indexes token sequences whose K/V sit in a cache, in a radix tree (`radix`), and holds
cells only through three verbs every cache answers: a sequence it keeps (a *holder*, such
as a finished request's session) is cloned for a hit (`seq_clone(holder, upto=m)`),
rewound to give back its tail, removed to give back the rest. Its target is either a
cache (`seq_clone`, `rewind`, `seq_rm`, `pos`: the reference, `CellCache`, any
`CacheUnderTest`) or an executor's sessions (`clone`, `rewind`, `close_session`,
`length`: `Executor`, `Lockstep`):

    prefix = PrefixCache(cache)
    seq, m = prefix.acquire(prompt)     # a clone sharing the first m positions, or (None, 0)
    ...                                 # the caller computes prompt[m:] into seq, and more
    prefix.insert(seq, tokens)          # seq's positions are `tokens`; the cache keeps it

Sequences the caller runs are *live*: `acquire` makes one, `share` lets others hit a live
one's first tokens while it runs, `fork` says a clone of one shares its cells, and `close`
removes one without keeping it. The tree is physical (every sequence below a node holds
the node's very cells), so `n_cells` counts each cell once and `cached_cells` is exactly
what `drop()` would give back. Eviction takes cells held by the cache alone, least
recently used first (a heap of the holders keyed by last use: O(log n)) and tail first
(a node without children, rewound by as many tokens as are asked for); a cell a live
sequence holds is never given back. With `host_bytes`, what eviction gives back is saved
to host memory first (`host_tier`) and reloaded by a longer hit (§13 for saved
sequences).

Not thread-safe by itself: the `Engine` calls it under its lock. An observer of the target
that raises (`ObserverError`) never leaves the tree half-changed: each call finishes,
then raises it (`faults`).
"""

from collections.abc import Callable, Sequence

import numpy as np

from numbakv.core.errors import ConfigError, SequenceError
from numbakv.core.values import as_int, int_at_least
from numbakv.serve import radix
from numbakv.serve.faults import Observed, call_observed, completes
from numbakv.serve.host_tier import HostTier, Reloading, check_host_bytes
from numbakv.serve.radix import Node
from numbakv.serve.targets import as_tokens, check_salt, saving_verbs, verbs

Listener = Callable[[str | None, np.ndarray, int, int, int], None]


class PrefixCache(Reloading):
    """Token sequences whose K/V sit in `target`, found by their longest cached prefix.

    target    : a cache (`seq_clone`, `rewind`, `seq_rm`, `pos`) or an executor (`clone`,
                `rewind`, `close_session`, `length`) whose sequences the cache may keep
    max_cells : None (no bound), or the most cells it holds alone (`cached_cells`): past
                it, the least recently used go at once
    host_bytes: None (no host tier), or the most K/V bytes of prefixes given back that it
                keeps in host memory (`host`, a `HostTier`; the target must save and load
                sequences) and reloads on a longer hit than the pool's

    n_cells          : positions the tree indexes, each a distinct cell of the target
    cached_cells     : of those, the cells no live sequence holds (what `drop()` frees)
    n_holders        : sequences the cache holds
    n_evicted_cells  : cells given back so far (`evict`, `drop`, `max_cells`)
    host             : None, or its `HostTier` (bytes held, offloads and reloads counted)
    """

    def __init__(self, target, max_cells: int | None = None, host_bytes: int | None = None):
        self.max_cells = None if max_cells is None else int_at_least("max_cells", max_cells, 0)
        host_bytes = check_host_bytes(host_bytes)
        self._observed = Observed()  # the ObserverErrors of the public call in progress
        completing = self._observed.around(target)  # verbs give their result
        self._clone, self._rewind, self._remove, self._pos = verbs(target, completing)
        self._saving = None if host_bytes is None else saving_verbs(target, completing)
        self.host = None if host_bytes is None else HostTier(host_bytes)
        self.target = target
        self._roots: dict[str | None, Node] = {}
        self._salts: dict[int, str | None] = {}  # id of a root -> its salt
        self._listener: Listener | None = None
        self._live: dict[int, tuple[Node, str | None]] = {}  # live sequence -> its base
        self._held = radix.Holders()  # holder -> its node, coldest first in O(log n)
        self._clock = 0
        self.n_cells = 0
        self.cached_cells = 0
        self.n_evicted_cells = 0

    # -- reading ---------------------------------------------------------------

    @property
    def n_holders(self) -> int:
        return len(self._held)

    @property
    def holders(self) -> list[int]:
        """The sequences the cache holds, ascending."""
        return sorted(self._held.nodes)

    @property
    def live(self) -> list[int]:
        """The live sequences it knows of, ascending."""
        return sorted(self._live)

    def match(self, tokens: Sequence[int], salt: str | None = None) -> int:
        """The longest cached prefix of `tokens` under `salt`, at most len(tokens) - 1."""
        tokens, salt = as_tokens(tokens), check_salt(salt)
        root = self._roots.get(salt)
        return 0 if root is None else radix.walk(root, tokens, len(tokens) - 1)[1]

    def holder_of(self, tokens: Sequence[int], salt: str | None = None) -> int | None:
        """A sequence of the target whose first len(tokens) positions are `tokens` (a holder
        or a live one), or None when the pool does not hold them all."""
        tokens, salt = as_tokens(tokens), check_salt(salt)
        root = self._roots.get(salt)
        node, m = (None, 0) if root is None else radix.walk(root, tokens, len(tokens))
        return radix.owner_below(node) if m == len(tokens) else None

    # -- live sequences --------------------------------------------------------

    @completes(raising=call_observed)
    def acquire(self, tokens: Sequence[int], salt: str | None = None, **clone) -> tuple:
        """(a new live sequence holding the first m positions of `tokens`, m): a clone of a
        sequence that holds them, for the longest cached prefix under `salt` (at most
        len(tokens) - 1, so the caller computes the last one); (None, 0) on a miss.
        Keyword arguments go to the target's clone (an `Executor`'s `sampling`). With a host
        tier holding a longer prefix, cells are made free for the part past the pool's hit
        (evicting what the cache alone holds, the hit's path spared), that part is loaded
        onto the hit (the whole prefix without one) and the new sequence is shared at once,
        a pool hit from then on; a reload that does not fit is a miss (the pool's hit)."""
        tokens, salt = as_tokens(tokens), check_salt(salt)
        node, m = radix.walk(self._root(salt), tokens, len(tokens) - 1)
        if 0 < m < node.depth:
            node = radix.split(node, m)  # the hit's end is a node: its tail can go alone
        reloaded = None if self.host is None else self._reload(tokens, salt, node, m, clone)
        if reloaded is not None:
            return reloaded
        if m == 0:
            return None, 0
        seq = self._clone(radix.owner_below(node), m, **clone)
        self._base(seq, node, salt, self._tick())
        return seq, m

    def share(self, seq: int, tokens: Sequence[int], salt: str | None = None) -> None:
        """Lets later lookups hit live `seq`'s first len(tokens) positions (`tokens`) while
        it runs (a prompt once it is computed); `seq` stays the caller's."""
        seq, tokens = self._check_seq(seq, tokens, whole=False)
        if seq in self._live and self._live[seq][0].depth >= len(tokens):
            return  # the tree holds them already, and seq is based there
        node, salt = self._based(seq, salt, tokens)
        grown = self._grow(node, tokens, copy=True)
        if grown is not None:
            if seq in self._live:
                self._unbase(seq)
            self._base(seq, grown, salt, self._tick())

    def fork(self, src: int, clone: int) -> None:
        """Live `clone` was cloned from live `src` at its length: it holds the cells of the
        tree `src` does."""
        src = as_int("src", src, SequenceError)
        clone = as_int("clone", clone, SequenceError)
        if clone in self._live or clone in self._held:
            raise SequenceError(f"sequence {clone} is already known to the prefix cache")
        if src in self._held:
            raise SequenceError(f"sequence {src} is a holder; acquire() a clone of it instead")
        self._pos(clone)  # refused unless the target holds it
        if src in self._live:  # else src holds none of the tree's cells, nor does clone
            self._base(clone, *self._live[src])

    @completes(raising=call_observed)
    def insert(self, seq: int, tokens: Sequence[int], salt: str | None = None) -> None:
        """Keeps `seq`, whose positions are `tokens` (live, or one the cache never saw): its
        tokens become hits; when the tree already has them all, `seq` is removed instead."""
        seq, tokens = self._check_seq(seq, tokens, whole=True)
        node, salt = self._based(seq, salt, tokens)
        if seq in self._live:
            self._unbase(seq)
        grown = self._grow(node, tokens)
        if grown is None and (node.is_owned or node.parent is None):
            self._remove(seq)  # nothing new: what it holds, others hold too
        else:
            grown = node if grown is None else grown
            spare = radix.touch(grown, self._tick())  # seq holds its path: holders above
            self._held.hold(seq, grown)
            for above in spare:
                self._let_go(above)
        self._bound()

    @completes(raising=call_observed)
    def close(self, seq: int) -> None:
        """Removes live `seq` (or one the cache never saw) without keeping it."""
        seq = as_int("seq", seq, SequenceError)
        if seq in self._held:
            raise SequenceError(f"sequence {seq} is a holder of the prefix cache; drop() it")
        self._pos(seq)  # refused unless the target holds it, before anything changes
        if seq in self._live:
            node = self._unbase(seq)
            self._prune(node)
        self._remove(seq)
        self._bound()

    # -- giving cells back -----------------------------------------------------

    @completes(raising=call_observed)
    def evict(self, n_cells: int) -> int:
        """Gives back at least `n_cells` cells held by the cache alone, least recently used
        and tail first, or all it can; returns how many it gave back."""
        return self._evict(int_at_least("n_cells", n_cells, 0))

    @completes(raising=call_observed)
    def evict_holder(self) -> int | None:
        """Removes the least recently used holder, giving back its sequence id (and the
        cells only it held); returns the id, or None when the cache holds none."""
        node = self._coldest(lambda node: True)
        return None if node is None else self._let_go(node)

    @completes(raising=call_observed)
    def drop(self) -> int:
        """Removes every holder: what live sequences hold stays. Returns the cells freed."""
        before = self.n_cells
        for node in list(self._held.nodes.values()):
            self._let_go(node)
        return before - self.n_cells

    def listen(self, listener: "Listener | None") -> None:
        """Calls `listener(salt, path, start, end, delta)` whenever the tree gains (delta
        +1) or loses (-1) positions [start, end) of a path, `path` ([end] int64) the tokens
        of positions 0 .. end - 1 (a copy of a run counts apart: two requests computed it),
        first once for every run the tree holds now; None stops it. One listener at a
        time (`KVEvents` is one): ConfigError while another listens."""
        if listener is not None and self._listener is not None:
            raise ConfigError("the prefix cache already has a listener (a KVEvents): close it")
        self._listener = listener
        stack = (
            [] if listener is None else [c for r in self._roots.values() for c in r.child_list()]
        )
        while stack:
            node = stack.pop()
            self._changed(node, node.start, node.depth, +1)
            stack.extend(node.child_list())

    def check(self) -> None:
        """AssertionError naming what is wrong, unless the tree is whole: every node owned,
        counts as recounted, each holder as long as its node's depth."""
        counts = [radix.recount(root) for root in self._roots.values()]
        n_cells, cached = sum(c[0] for c in counts), sum(c[1] for c in counts)
        assert (n_cells, cached) == (self.n_cells, self.cached_cells), (n_cells, cached)
        for seq, node in self._held.nodes.items():
            assert self._pos(seq) == node.depth, f"holder {seq} is not {node.depth} long"
        for seq, (node, _) in self._live.items():
            assert self._pos(seq) >= node.depth, f"live {seq} is shorter than its base"

    # -- the tree --------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _check_seq(self, seq, tokens, whole: bool) -> tuple[int, np.ndarray]:
        """(seq, tokens) checked: not a holder, and holding len(tokens) positions (at least
        that many unless `whole`)."""
        seq = as_int("seq", seq, SequenceError)
        tokens = as_tokens(tokens, empty=True)
        if seq in self._held:
            raise SequenceError(f"sequence {seq} is already a holder of the prefix cache")
        length = self._pos(seq)
        if len(tokens) > length or (whole and len(tokens) != length):
            raise SequenceError(
                f"sequence {seq} holds {length} positions; {len(tokens)} tokens were given "
                f"for {'them' if whole else 'its first positions'}"
            )
        return seq, tokens

    def _based(self, seq: int, salt, tokens: np.ndarray) -> tuple[Node, str | None]:
        """(the node `seq` is based on, its salt): a live one's base, else the root of
        `salt`; refused when `tokens` do not begin with the base's path."""
        salt = check_salt(salt)
        if seq in self._live:
            node, based_salt = self._live[seq]
            if salt is not None and salt != based_salt:
                raise ConfigError(f"cache_salt={salt!r}, sequence {seq} has {based_salt!r}")
            if not tokens.tobytes().startswith(radix.path_raw(node)):
                raise SequenceError(
                    f"the tokens given for sequence {seq} do not begin with the "
                    f"{node.depth} tokens it shares with the prefix cache"
                )
            return node, based_salt
        return self._root(salt), salt

    def _root(self, salt: str | None) -> Node:
        if salt not in self._roots:
            self._roots[salt] = Node(np.zeros(0, np.int64), 0, None)
            self._salts[id(self._roots[salt])] = salt
        return self._roots[salt]

    def _changed(self, node: Node, start: int, end: int, delta: int) -> None:
        """Tells the listener that positions [start, end) of `node`'s path came (+1) or went
        (-1)."""
        listener = self._listener  # read once: another thread may stop it (KVEvents.close)
        if listener is not None:
            salt = self._salts[id(radix.root_of(node))]
            listener(salt, radix.path_tokens(node)[:end], start, end, delta)

    def _grow(self, node: Node, tokens: np.ndarray, copy: bool = False) -> Node | None:
        """A new node under `node` for tokens[node.depth:], the caller's own cells; None
        when nothing is left, or (unless `copy`: a live sequence's, which its forks will
        share) when the tree holds all of them already in another copy."""
        run = tokens[node.depth :]
        if not len(run):
            return None
        if not copy and radix.walk(node, tokens, len(tokens))[1] == len(tokens):
            return None
        child = Node(run.copy(), len(tokens), node)
        node.adopt(child)
        self._changed(child, node.depth, len(tokens), +1)
        self.n_cells += len(run)
        self.cached_cells += len(run)  # no one is based on it yet
        return child

    def _base(self, seq: int, node: Node, salt: str | None, clock: int | None = None) -> None:
        """`seq` is live, based at `node` (used at `clock`, when given)."""
        self._live[seq] = (node, salt)
        node.live.add(seq)
        self.cached_cells += radix.add_live(node, +1, clock)

    def _unbase(self, seq: int) -> Node:
        node, _ = self._live.pop(seq)
        node.live.discard(seq)
        self.cached_cells += radix.add_live(node, -1)
        return node

    def _coldest(self, wanted: Callable[[Node], bool]) -> Node | None:
        """The least recently used holder's node that `wanted` takes (the first held on a
        tie), or None: O(log n) in the holders, and as much per holder passed over."""
        return self._held.coldest(wanted)

    def _evict(self, n_cells: int) -> int:
        """`evict` of a checked count (`Reloading` evicts to make room for a reload)."""
        freed = 0
        while freed < n_cells:
            leaf = self._coldest(lambda node: not node.children and node.n_live == 0)
            if leaf is None:
                break
            freed += self._trim(leaf, min(len(leaf.tokens), n_cells - freed))
        self.n_evicted_cells += freed
        return freed

    def _trim(self, leaf: Node, k: int) -> int:
        """Gives back the last `k` cells of `leaf` (no children, no live sequence: they are
        its holder's alone); returns k."""
        seq = leaf.holder
        assert seq is not None and 0 < k <= len(leaf.tokens)
        self._offload(leaf)
        if k < len(leaf.tokens):
            self._rewind(seq, leaf.depth - k)
            self._changed(leaf, leaf.depth - k, leaf.depth, -1)
            leaf.tokens, leaf.depth = leaf.tokens[:-k], leaf.depth - k
            self.n_cells -= k
            self.cached_cells -= k
            return k
        parent = leaf.parent
        self._detach(leaf)
        self._held.release(seq)
        if parent.parent is not None and not parent.children and parent.holder is None:
            self._rewind(seq, parent.depth)  # the parent keeps its cells: seq holds them
            self._held.hold(seq, parent)
        else:
            self._remove(seq)
            self._prune(parent)
        return k

    def _let_go(self, node: Node) -> int:
        """Removes `node`'s holder; the nodes only it held go with it. Returns the holder."""
        seq = node.holder
        assert seq is not None
        if not node.children and node.n_live == 0:  # its cells go with it
            self._offload(node)
        self._held.release(seq)
        before = self.n_cells
        self._prune(node)
        self._remove(seq)
        self.n_evicted_cells += before - self.n_cells
        return seq

    def _prune(self, node: Node) -> None:
        """Detaches `node` and its ancestors while no sequence owns them."""
        while node.parent is not None and not node.is_owned:
            parent = node.parent
            self._detach(node)
            node = parent

    def _detach(self, node: Node) -> None:
        self._changed(node, node.start, node.depth, -1)
        node.parent.disown(node)
        self.n_cells -= len(node.tokens)
        if node.n_live == 0:
            self.cached_cells -= len(node.tokens)

    def _bound(self) -> None:
        if self.max_cells is not None and self.cached_cells > self.max_cells:
            self.evict(self.cached_cells - self.max_cells)
