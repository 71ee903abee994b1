"""The prefix cache's host cost (docs/contract.md §9.2): eviction finds the least recently
used holder through a heap (`radix.Holders`) and picks the very victim a scan of every
holder did, ties included, in a number of heap steps that does not grow with the holders.
Counts only, no timing."""

import heapq

import numpy as np
import pytest

from numbakv.serve import radix
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.radix import Holders, Node

ALPHABET = 3  # token ids 0 .. 2: prompts share prefixes, copies and splits are common


class Recorder:
    """A cache's verbs over lengths alone, each call logged: two prefix caches that choose
    the same victims make the same calls."""

    def __init__(self) -> None:
        self.lengths: dict[int, int] = {}
        self.log: list[tuple] = []
        self._next = 0

    def seq_new(self, length: int = 0) -> int:
        self._next += 1
        self.lengths[self._next] = length
        return self._next

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        self.log.append(("seq_clone", src, upto))
        return self.seq_new(self.lengths[src] if upto is None else upto)

    def rewind(self, seq: int, position: int) -> None:
        self.log.append(("rewind", seq, position))
        self.lengths[seq] = position

    def seq_rm(self, seq: int) -> None:
        self.log.append(("seq_rm", seq))
        del self.lengths[seq]

    def pos(self, seq: int) -> int:
        return self.lengths[seq]


class Scanned(PrefixCache):
    """The eviction this module's heap replaced: the least `used` of a scan of the holders
    in the order they were held (min keeps the first on a tie), O(n) a victim."""

    def _coldest(self, wanted):
        nodes = [node for node in self._held.nodes.values() if wanted(node)]
        return min(nodes, key=lambda node: node.used, default=None)


class Twin:
    """One random op applied to a prefix cache with the heap and to one that scans, over
    two recorders: every result, verb call and count must agree."""

    def __init__(self, max_cells: int | None) -> None:
        self.targets = (Recorder(), Recorder())
        self.caches = (PrefixCache(self.targets[0], max_cells), Scanned(self.targets[1], max_cells))
        self.live: list[tuple[int, list[int]]] = []  # (live sequence, the tokens it holds)

    def both(self, op, *args):
        """op(cache, target, *args) on each side; the results, logs and counts agreed."""
        pairs = zip(self.caches, self.targets, strict=True)
        results = [op(cache, target, *args) for cache, target in pairs]
        assert results[0] == results[1]
        assert self.targets[0].log == self.targets[1].log
        heap, scan = self.caches
        assert heap.holders == scan.holders and heap.live == scan.live
        assert (heap.n_cells, heap.cached_cells, heap.n_evicted_cells) == (
            scan.n_cells,
            scan.cached_cells,
            scan.n_evicted_cells,
        )
        return results[0]

    def step(self, rng: np.random.Generator) -> None:
        tokens = rng.integers(0, ALPHABET, int(rng.integers(1, 13))).tolist()
        salt = "s" if rng.random() < 0.1 else None
        pick = rng.random()
        if pick < 0.3 or (pick < 0.6 and not self.live):
            seq = self.both(acquire, tokens, salt)
            if seq is not None or rng.random() < 0.5:
                self.live.append((self.both(computed, seq, len(tokens)), tokens))
            else:
                self.both(insert, self.both(computed, None, len(tokens)), tokens, salt)
        elif pick < 0.6:
            seq, held = self.live.pop(int(rng.integers(len(self.live))))
            self.end(rng, seq, held, tokens)
        elif pick < 0.8:
            self.both(lambda c, t, n: c.evict(n), int(rng.integers(0, 20)))
        elif pick < 0.95:
            self.both(lambda c, t: c.evict_holder())
        else:
            self.both(lambda c, t, k, s: (c.match(k, s), c.holder_of(k, s)), tokens, salt)

    def end(self, rng: np.random.Generator, seq: int, held: list[int], more: list[int]):
        """A live sequence's end: kept (grown by `more`), closed, or shared and forked
        first (the fork kept too, with its own tail)."""
        how = rng.random()
        if how < 0.2:
            self.both(lambda c, t, s: c.close(s), seq)
            return
        if how < 0.5:
            self.both(lambda c, t, s, k: c.share(s, k), seq, held)
            fork = self.both(lambda c, t, s: t.seq_new(t.pos(s)), seq)
            self.both(lambda c, t, s, f: c.fork(s, f), seq, fork)
            tail = more[: int(rng.integers(0, len(more) + 1))]
            self.both(computed, fork, len(held) + len(tail))
            self.both(insert, fork, held + tail, None)
        self.both(computed, seq, len(held) + len(more))
        self.both(insert, seq, held + more, None)


def acquire(cache: PrefixCache, target: Recorder, tokens: list[int], salt) -> int | None:
    """The live sequence of the hit, or None."""
    return cache.acquire(tokens, salt)[0]


def computed(cache: PrefixCache, target: Recorder, seq: int | None, length: int) -> int:
    """`seq` (a new one when None) grown to `length` positions, as a prefill would."""
    seq = target.seq_new() if seq is None else seq
    target.lengths[seq] = length
    return seq


def insert(cache: PrefixCache, target: Recorder, seq: int, tokens: list[int], salt) -> None:
    """`seq`, holding `tokens`, kept."""
    cache.insert(seq, tokens, salt)


@pytest.mark.parametrize("max_cells", [None, 24])
def test_eviction_picks_what_a_scan_of_every_holder_picks(max_cells):
    """Random requests, live sequences kept, closed, shared and forked, evictions and
    lookups: the heap's victims are the scan's in every case (the recorded verbs agree)."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        twin = Twin(max_cells)
        for _ in range(80):
            twin.step(rng)
        for cache in twin.caches:
            cache.check()


def scan_coldest(nodes: dict[int, Node], wanted) -> Node | None:
    """What `Holders.coldest` must give: the least `used` in order of holding."""
    return min((n for n in nodes.values() if wanted(n)), key=lambda n: n.used, default=None)


def test_ties_go_to_the_first_held_as_a_scan_does():
    """Many holders share each `used`; holds end and begin again (a holder held again goes
    last among its ties), nodes are used again, predicates pass some over."""
    for seed in range(30):
        rng = np.random.default_rng(seed)
        holders, nodes, next_seq = Holders(), [], 0
        for _ in range(300):
            pick = rng.random()
            if pick < 0.35 or not holders.nodes:
                depth, used = int(rng.integers(1, 10)), int(rng.integers(0, 4))
                node = Node(np.zeros(1, np.int64), depth, None, used)
                next_seq += 1
                holders.hold(next_seq, node)
                nodes.append(node)
            elif pick < 0.55:
                seq = list(holders.nodes)[int(rng.integers(len(holders.nodes)))]
                node = holders.nodes[seq]
                holders.release(seq)
                if rng.random() < 0.5:  # held again at once: it goes last among its ties
                    holders.hold(seq, node)
            elif pick < 0.75:
                node = nodes[int(rng.integers(len(nodes)))]
                node.used += int(rng.integers(0, 3))  # used again (or not): it only grows
            else:
                odd = int(rng.integers(-1, 2))  # -1: every holder wanted

                def wanted(node: Node, odd: int = odd) -> bool:
                    return odd < 0 or node.depth % 2 == odd

                assert holders.coldest(wanted) is scan_coldest(holders.nodes, wanted)
        assert len(holders._heap) <= max(32, 2 * len(holders.nodes))


def many_holders(n: int, length: int, rng=None, prefix=None, prefixes=None):
    """(a prefix cache, its target, rng, the prefixes) holding `n` more prefixes of
    `length` tokens, each branching off an earlier one at a random position."""
    rng = np.random.default_rng(0) if rng is None else rng
    prefix = PrefixCache(Recorder()) if prefix is None else prefix
    prefixes = [] if prefixes is None else prefixes
    for _ in range(n):
        prefixes.append(branch(rng, prefixes, length))
        seq, _ = prefix.acquire(prefixes[-1])
        prefix.insert(computed(prefix, prefix.target, seq, length), prefixes[-1])
    return prefix, prefix.target, rng, prefixes


def branch(rng: np.random.Generator, prefixes: list[list[int]], length: int) -> list[int]:
    """`length` tokens branching off a random one of `prefixes` at a random position."""
    stem = []
    if prefixes:
        stem = prefixes[int(rng.integers(len(prefixes)))][: int(rng.integers(length))]
    return stem + rng.integers(0, 256, length - len(stem)).tolist()


@pytest.fixture
def heap_steps(monkeypatch) -> list[int]:
    """[heap operations so far]: radix's heappop, heappush, heapreplace counted."""
    steps = [0]
    for name in ("heappop", "heappush", "heapreplace"):
        real = getattr(heapq, name)

        def counted(*args, real=real):
            steps[0] += 1
            return real(*args)

        monkeypatch.setattr(radix, name, counted)
    return steps


def test_evict_holder_takes_a_few_heap_steps_at_a_thousand_holders(heap_steps):
    """A new prefix in, the coldest holder out, 200 times at 1 000 holders: a few heap
    steps each (a scan would look at 1 000 holders each time), the heap's size bounded."""
    prefix, target, rng, _ = many_holders(1000, 64)
    for _ in range(200):
        tokens = rng.integers(0, 256, 64).tolist()
        seq, _ = prefix.acquire(tokens)
        prefix.insert(computed(prefix, target, seq, 64), tokens)
        heap_steps[0] = 0
        victim = prefix.evict_holder()
        assert victim is not None and heap_steps[0] <= 3 and prefix.n_holders == 1000
        assert len(prefix._held._heap) <= 2 * prefix.n_holders
    prefix.check()


def test_evict_passes_over_only_holders_live_sequences_sit_on(heap_steps):
    """`evict` takes the coldest holders without children or live sequences: the five
    coldest, a live clone based on each, are passed over (and kept) at a few heap steps
    per victim (their entries popped and pushed back), with 1 000 holders."""
    prefix, target, rng, prefixes = many_holders(5, 64)
    sat_on = prefix.holders
    for tokens in prefixes:  # a live clone of each, based at its holder's node
        _, m = prefix.acquire([*tokens, 7])
        assert m == 64
    many_holders(995, 64, rng, prefix, prefixes)
    heap_steps[0], before = 0, len(target.log)
    assert prefix.evict(64) == 64
    victims = len(target.log) - before  # a rewind or seq_rm per holder trimmed
    assert 1 <= victims <= 16
    stale = len(sat_on)  # each of the five pushed again once: used when its clone came
    assert heap_steps[0] <= stale + victims * (2 * len(sat_on) + 2)
    assert all(seq in prefix.holders for seq in sat_on)
    prefix.check()
