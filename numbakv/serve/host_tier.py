"""`HostTier`: the prefixes a `PrefixCache` gave back, kept in host memory as saved
sequences (`SeqState`, docs/contract.md §13) so that a later hit reloads them instead of
computing them again (§9.2).

Each state holds a whole prefix: positions 0 .. n-1 of a holder the prefix cache was about
to give cells of back, its K/V as the pool stored them and its `tokens` ([n] int64), under
the holder's salt. So a reload never depends on what the pool still holds: the prefix
cache loads the part past its own longest hit onto that hit, or the whole prefix when it
has none. The tier is inclusive: a state reloaded stays here too (a prefix the pool then
gives back again is covered, so it is not saved twice).

Bounded in bytes: the K/V bytes of the states held (`SeqState.nbytes`, summed) never pass
`max_bytes`; the least recently used (kept or reloaded) go first, and a state larger than
`max_bytes` is not kept. A state covered by a longer one of its salt (its tokens begin
the other's) is not kept either, and a new state drops those it covers. Lookups compare
the tokens with every state of the salt (NumPy, a run at a time): linear in the states
held.
"""

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from numbakv.core.errors import CapacityError
from numbakv.core.seq_state import SeqState
from numbakv.core.values import int_at_least
from numbakv.serve import radix
from numbakv.serve.radix import Node, common_length

Key = tuple[str | None, bytes]  # (salt, the tokens' int64 bytes)


def check_host_bytes(host_bytes) -> int | None:
    """`host_bytes` when it is None or an int >= 0 (bools, floats, strings refused), else
    ConfigError naming the value."""
    return None if host_bytes is None else int_at_least("host_bytes", host_bytes, 0)


class HostTier:
    """Whole prefixes in host memory, at most `max_bytes` bytes of K/V (module docstring).

    nbytes             : K/V bytes of the states held now (<= max_bytes)
    n_states           : states held now
    n_offloads         : states kept so far; n_offloaded_tokens, n_offloaded_bytes their sums
    n_reloads          : hits served from here so far; n_reloaded_tokens the positions loaded
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._states: OrderedDict[Key, SeqState] = OrderedDict()  # least recently used first
        self._token_bytes: int | None = None  # K/V bytes of one position, once one is seen
        self.nbytes = 0
        self.n_offloads = self.n_offloaded_tokens = self.n_offloaded_bytes = 0
        self.n_reloads = self.n_reloaded_tokens = 0

    @property
    def n_states(self) -> int:
        return len(self._states)

    def states(self, salt: str | None = None) -> list[SeqState]:
        """The states held under `salt`, least recently used first."""
        return [state for (s, _), state in self._states.items() if s == salt]

    def offer(self, tokens: np.ndarray, salt: str | None, save: Callable[[], SeqState]) -> None:
        """Keeps the prefix `tokens` ([n] int64, n >= 1) of `salt`, whose whole state
        `save()` gives (positions 0 .. n-1), unless a state held covers it or it could not
        fit `max_bytes`; the least recently used go to make room."""
        if self._covered(tokens, salt):
            return
        if self._token_bytes is not None and len(tokens) * self._token_bytes > self.max_bytes:
            return  # known too large: not saved at all
        try:
            state = save()
        except CapacityError:  # no memory to save it in: the cells go without a copy
            return
        self._token_bytes = state.nbytes // max(1, state.n_tokens)
        if state.nbytes > self.max_bytes:
            return
        state = replace(state, tokens=tokens.copy())
        for key, held in list(self._states.items()):
            if key[0] == salt and _begins(tokens, held.tokens):
                self._drop(key)
        while self.nbytes + state.nbytes > self.max_bytes:
            self._drop(next(iter(self._states)))
        self._states[(salt, tokens.tobytes())] = state
        self.nbytes += state.nbytes
        self.n_offloads += 1
        self.n_offloaded_tokens += state.n_tokens
        self.n_offloaded_bytes += state.nbytes

    def longest(
        self, tokens: np.ndarray, salt: str | None, limit: int
    ) -> tuple[SeqState | None, int]:
        """(the state of `salt` sharing the longest prefix with tokens[:limit], its length);
        (None, 0) when none shares any. The more recently used wins a tie."""
        best, best_n = None, 0
        for (s, _), state in reversed(self._states.items()):
            if s == salt:
                n = common_length(state.tokens, tokens, 0, limit)
                if n > best_n:
                    best, best_n = state, n
        return best, best_n

    def reloaded(self, state: SeqState, salt: str | None, n_tokens: int) -> None:
        """`n_tokens` positions of `state` (of `salt`) went back into the pool: it is the most
        recently used now."""
        self._states.move_to_end((salt, state.tokens.tobytes()))
        self.n_reloads += 1
        self.n_reloaded_tokens += n_tokens

    def _covered(self, tokens: np.ndarray, salt: str | None) -> bool:
        """True when a state of `salt` begins with `tokens` (it is made most recently used)."""
        for key, held in self._states.items():
            if key[0] == salt and _begins(held.tokens, tokens):
                self._states.move_to_end(key)
                return True
        return False

    def _drop(self, key: Key) -> None:
        self.nbytes -= self._states.pop(key).nbytes


class Reloading:
    """The host tier's side of `PrefixCache` (a mixin: it reads the prefix cache's tree,
    counts, verbs and `host`)."""

    def _offload(self, node: Node) -> None:
        """Before cells of `node`'s holder go: its positions (node's path) to the host tier."""
        if self.host is not None:
            salt = next(s for s, root in self._roots.items() if root is radix.root_of(node))
            save = self._saving[0]
            self.host.offer(radix.path_tokens(node), salt, lambda: save(node.holder, 0))

    def _reload(self, tokens: np.ndarray, salt, node: Node, m: int, clone) -> tuple | None:
        """(a new live sequence holding the host tier's longest prefix of `tokens`, its
        length), loaded onto the pool's hit (`node`, where the hit of `m` tokens ends) once
        cells are free for it; None when the tier has no longer prefix or it does not fit."""
        h = self.host.longest(tokens, salt, len(tokens) - 1)[1]
        if h <= m or not self._room(node, h - m):
            return None
        state, h = self.host.longest(tokens, salt, len(tokens) - 1)  # making room offloads
        if h <= m:
            return None
        onto = radix.owner_below(node) if m else None
        try:
            seq = self._saving[1](tail(state, m, h), onto, **clone)
        except CapacityError:
            return None  # a miss: what the pool holds serves
        self.host.reloaded(state, salt, h - m)
        self._base(seq, self._grow(node, tokens[:h], copy=True), salt, self._tick())
        return seq, h

    def _room(self, node: Node, n: int) -> bool:
        """True when `n` cells are free (or the target does not say), after evicting what
        the cache alone holds except `node`'s path; False, nothing evicted, when they
        cannot be."""
        free = getattr(self.target, "free_cells", None)
        if not isinstance(free, int) or free >= n:
            return True
        self.cached_cells += radix.add_live(node, +1)  # node's path is spared
        try:
            if free + self.cached_cells < n:
                return False
            self._evict(n - free)
        finally:
            self.cached_cells += radix.add_live(node, -1)
        return True


def tail(state: SeqState, start: int, end: int) -> SeqState:
    """Positions start .. end-1 of `state` (saved from 0), as a state saved from `start`."""
    k = tuple(x[start:end] for x in state.k)
    v = tuple(x[start:end] for x in state.v)
    return SeqState(state.geometry, state.positions[start:end], k, v, start)


def _begins(tokens: np.ndarray, prefix: np.ndarray) -> bool:
    """True when `tokens` begin with `prefix`."""
    n = len(prefix)
    return len(tokens) >= n and tokens[:n].tobytes() == prefix.tobytes()
