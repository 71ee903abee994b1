"""Saved sequences in serving (docs/contract.md §13): a session saved to a `SeqState` and
loaded back (`SavedSessions`, the `Executor`'s verbs), and a finished conversation saved
to a file and loaded into another engine's prefix cache (`SavedConversations`, the
`Engine`'s), so that its next turn hits all of it (§9.2).

Both are mixins: they read the executor's (the engine's) lock, `Observed` log and
bookkeeping. A conversation file is a `SeqState` file with its `tokens`: the positions of
sample 0 of a finished request (its prompt and every sampled token but the last, which was
never fed). The file has no place for a `cache_salt`, so a salted request is not saved.

    engine.save(request_id, "chat.npz")           # after the request finished
    other = Engine(executor, prefix_cache=PrefixCache(executor))
    other.load("chat.npz")                          # its conversation is cached now
    other.submit(conversation + next_message)       # hits all of the conversation
"""

import os
from dataclasses import replace

from numbakv.core.errors import CapacityError, ConfigError, StateError
from numbakv.core.observe import locked
from numbakv.core.seq_state import SeqState, load_plan
from numbakv.core.values import int_at_least
from numbakv.serve.faults import completes
from numbakv.serve.host_tier import tail
from numbakv.serve.sampling import GREEDY, Sampling, check_sampling


class SavedSessions:
    """`Executor.save_session` and `load_session` over the executor's cache."""

    @locked
    @completes
    def save_session(self, session: int, start: int = 0) -> SeqState:
        """Open `session`'s positions start .. length-1 and their K/V as its cache stores
        them (the cache's `seq_save`); refused (SequenceError) for a session not open or a
        start outside [0, length]."""
        return self._cache.seq_save(self._check_open(session), start)

    @locked
    @completes
    def load_session(
        self,
        state: SeqState,
        onto: int | None = None,
        sampling: Sampling = GREEDY,
        drawn: int = 0,
    ) -> int:
        """A new session (the cache's next sequence id) holding `state`'s positions and K/V
        (the cache's `seq_load`: for a state saved from start > 0, a clone of open session
        `onto`'s first start positions, then the state's), sampling with `sampling` as
        after `drawn` sampled tokens. Refused with nothing changed: no free session, too few
        cells or a state past max_session_tokens (CapacityError), another geometry
        (ConfigError), a bad `onto` (SequenceError), a damaged state (StateError)."""
        load_plan(state, self.cache.config, False)  # the cache's first refusals, in its order
        check_sampling(sampling)
        drawn = int_at_least("drawn", drawn, 0)
        onto = None if onto is None else self._check_open(onto)
        self._check_room()
        if isinstance(state, SeqState) and state.end > self.max_session_tokens:
            raise CapacityError(
                f"the state ends at position {state.end}, past max_session_tokens="
                f"{self.max_session_tokens}"
            )
        return self._opened(self._cache.seq_load(state, onto), sampling, drawn)


class SavedConversations:
    """`Engine.save` and `Engine.load`: a finished request's conversation to a file, and a
    file's conversation into the engine's prefix cache."""

    @locked
    @completes
    def save(self, request: int, path: str | os.PathLike) -> SeqState:
        """Writes request `request`'s conversation to `path` (a `SeqState` file with its
        tokens, positions 0 .. n-1: its prompt and sample 0's tokens but the last) and
        returns the state. The K/V are the prefix cache's, from a sequence of the pool
        holding them, else from its host tier. Refused (ConfigError) without a prefix
        cache, for an unknown request, one whose sample 0 has not finished with "stop" or
        "length", or a salted one (the file keeps no salt); CapacityError when the prefix
        cache gave its cells back and keeps no copy; StateError when the file cannot be
        written."""
        prefix = self._saving_prefix("save")
        r = self._request(request)
        sample = r.samples[0] if r.samples else None
        if sample is None or sample.finish_reason not in ("stop", "length"):
            reason = "not finished" if sample is None else sample.finish_reason
            raise ConfigError(
                f"request {r.id}'s sample 0 is {reason or 'running'}: only a conversation "
                "that finished ('stop' or 'length') is saved"
            )
        if r.cache_salt is not None:
            raise ConfigError(
                f"request {r.id} has cache_salt={r.cache_salt!r}: a saved sequence's file "
                "keeps no salt, so salted conversations are not saved"
            )
        tokens = r.context_ids(sample, sample.n_fed)
        holder = prefix.holder_of(tokens)
        if holder is not None:
            state = self._executor.save_session(holder)
        else:
            host = prefix.host
            state, n = (None, 0) if host is None else host.longest(tokens, None, len(tokens))
            if n < len(tokens):
                raise CapacityError(
                    f"the prefix cache gave back the cells of request {r.id}'s conversation "
                    "and keeps no copy in host memory; save it before it is evicted"
                )
        state = replace(tail(state, 0, len(tokens)), tokens=tokens.copy())
        state.save(path)
        return state

    @locked
    @completes
    def load(self, path: str | os.PathLike | SeqState) -> int:
        """Loads the conversation at `path` (a file `save` wrote, or its `SeqState`) into
        the prefix cache, as a holder: a later prompt that begins with it hits all of it.
        Room is made as for a request (the prefix cache's least recently used go first).
        Returns its length in tokens. Refused: no prefix cache or another geometry
        (ConfigError), a damaged file or a state without tokens or saved from start > 0
        (StateError), no room for its session or cells (CapacityError); nothing is loaded
        then (what was evicted to make room stays evicted)."""
        prefix = self._saving_prefix("load")
        state = path if isinstance(path, SeqState) else SeqState.load(path)
        if state.tokens is None or state.start:
            raise StateError(
                "a conversation is a state saved from position 0 with its tokens "
                f"(Engine.save); this one starts at {state.start} and has "
                f"{'no' if state.tokens is None else len(state.tokens)} tokens"
            )
        vocab, tokens = self.executor.vocab_size, state.tokens
        if len(tokens) and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab:
            raise StateError(f"the conversation's token ids are not all in [0, {vocab})")
        cache = getattr(self.executor, "cache", None)
        if cache is not None:  # before room is made: a foreign state evicts nothing
            load_plan(state, cache.config, False)
        limit = self.executor.max_session_tokens
        if state.end > limit:  # static too: refused before anything is evicted
            raise CapacityError(
                f"the conversation ends at position {state.end}, past max_session_tokens={limit}"
            )
        sessions = self._sessions
        if not sessions.room_for_sessions(1, self._admission.reserved()):
            raise CapacityError("no session is free for the conversation: requests hold them")
        free = sessions.free_cells
        if not sessions.room_for_cells(state.n_tokens):
            raise CapacityError(
                f"no room for a conversation of {state.n_tokens} positions: {free} cells are "
                f"free and {sessions.cached_cells} cached ones could be given back"
            )
        seq = self._executor.load_session(state)
        prefix.insert(seq, state.tokens)
        return state.n_tokens

    def _saving_prefix(self, verb: str):
        """The engine's prefix cache (through its `Observed` log), else ConfigError; also
        when the executor cannot save and load sessions."""
        if self.prefix_cache is None:
            raise ConfigError(
                f"Engine.{verb}() keeps conversations in the prefix cache; make the engine "
                "with prefix_cache=PrefixCache(executor)"
            )
        missing = [
            name
            for name in ("save_session", "load_session")
            if not callable(getattr(self.executor, name, None))
        ]
        if missing:
            raise ConfigError(f"Engine.{verb}() needs an executor with {', '.join(missing)}")
        return self._sessions.prefix
