"""A finished conversation saved to a file and loaded into another engine's prefix cache
(docs/contract.md §13, §9.2): `SavedConversations`, the `Engine`'s `save` and `load`, so
that the conversation's next turn hits all of it.

An object the engine owns, given what it reads; the engine's verb holds its lock, runs as
one call of its `Observed` log and hands over to it. A conversation file is a `SeqState`
file with its `tokens`: the positions of sample 0 of a finished request (its prompt and
every sampled token but the last, which was never fed). The file has no place for a
`cache_salt`, so a salted request is not saved.

    engine.save(request_id, "chat.npz")           # after the request finished
    other = Engine(executor, prefix_cache=PrefixCache(executor))
    other.load("chat.npz")                          # its conversation is cached now
    other.submit(conversation + next_message)       # hits all of the conversation
"""

import os
from dataclasses import replace

from numbakv.core.errors import CapacityError, ConfigError, StateError
from numbakv.core.seq_state import SeqState, load_plan
from numbakv.serve.admission import Admission
from numbakv.serve.host_tier import tail
from numbakv.serve.ledger import Requests
from numbakv.serve.memory import Sessions


class SavedConversations:
    """`Engine.save` and `Engine.load`: a finished request's conversation to a file, and a
    file's conversation into the engine's prefix cache.

    Owns nothing. Reads the engine's `executor` (whether it saves and loads sessions, its
    vocabulary, its cache's config, its max_session_tokens) and the same executor through
    the engine's `Observed` log, `observed` (its save_session and load_session); the
    engine's `sessions` (its prefix cache, through the log, and the room for sessions and
    cells), its `admission` (the sessions reserved for requests) and its `requests` (the
    request whose conversation is saved).
    """

    def __init__(self, executor, observed, sessions: Sessions, admission: Admission,
                 requests: Requests):  # fmt: skip
        self._executor, self._observed = executor, observed
        self._sessions, self._admission, self._requests = sessions, admission, requests

    def save(self, request: int, path: str | os.PathLike) -> SeqState:
        """`Engine.save(request, path)`."""
        prefix = self._saving_prefix("save")
        r = self._requests.find(request)
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
            state = self._observed.save_session(holder)
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

    def load(self, path: str | os.PathLike | SeqState) -> int:
        """`Engine.load(path)`."""
        prefix = self._saving_prefix("load")
        state = path if isinstance(path, SeqState) else SeqState.load(path)
        if state.tokens is None or state.start:
            raise StateError(
                "a conversation is a state saved from position 0 with its tokens "
                f"(Engine.save); this one starts at {state.start} and has "
                f"{'no' if state.tokens is None else len(state.tokens)} tokens"
            )
        vocab, tokens = self._executor.vocab_size, state.tokens
        if len(tokens) and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab:
            raise StateError(f"the conversation's token ids are not all in [0, {vocab})")
        check = getattr(self._executor, "check_state", None)  # TensorParallel: every head
        cache = getattr(self._executor, "cache", None)
        if check is not None:  # before room is made: a foreign state evicts nothing
            check(state)
        elif cache is not None:
            load_plan(state, cache.config, False)
        limit = self._executor.max_session_tokens
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
        seq = self._observed.load_session(state)
        prefix.insert(seq, state.tokens)
        return state.n_tokens

    def _saving_prefix(self, verb: str):
        """The engine's prefix cache (through its `Observed` log), else ConfigError; also
        when the executor cannot save and load sessions."""
        if self._sessions.prefix is None:
            raise ConfigError(
                f"Engine.{verb}() keeps conversations in the prefix cache; make the engine "
                "with prefix_cache=PrefixCache(executor)"
            )
        missing = [
            name
            for name in ("save_session", "load_session")
            if not callable(getattr(self._executor, name, None))
        ]
        if missing:
            raise ConfigError(f"Engine.{verb}() needs an executor with {', '.join(missing)}")
        return self._sessions.prefix
