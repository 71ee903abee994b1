"""Saved sessions (docs/contract.md §13): an open session saved to a `SeqState` and a state
loaded into a new session, `SavedSessions`, the `Executor`'s `save_session` and
`load_session`. An object the executor owns, given what it reads; the executor's verb holds
its lock, runs as one call of its `Observed` log and hands over to it. A finished
conversation saved to a file is `numbakv.serve.conversations`.
"""

from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError
from numbakv.core.seq_state import SeqState, load_plan
from numbakv.core.values import int_at_least
from numbakv.serve.open_sessions import OpenSessions
from numbakv.serve.sampling import GREEDY, Sampling, check_sampling


class SavedSessions:
    """`Executor.save_session` and `load_session`: an open session to a `SeqState`, and a
    state into a new session.

    Owns nothing. Reads `cache`, the executor's cache through its `Observed` log (its
    seq_save and seq_load), the cache's `config`, the executor's `sessions` (checked open,
    room for one more, the loaded one recorded) and its `max_session_tokens`.
    """

    def __init__(self, cache, config: CacheConfig, sessions: OpenSessions,
                 max_session_tokens: int):  # fmt: skip
        self._cache, self._config = cache, config
        self._sessions, self._max_session_tokens = sessions, max_session_tokens

    def save(self, session: int, start: int = 0) -> SeqState:
        """`Executor.save_session(session, start)`."""
        return self._cache.seq_save(self._sessions.check_open(session), start)

    def load(self, state: SeqState, onto: int | None = None, sampling: Sampling = GREEDY,
             drawn: int = 0) -> int:  # fmt: skip
        """`Executor.load_session(state, onto, sampling, drawn)`."""
        load_plan(state, self._config, False)  # the cache's first refusals, in its order
        check_sampling(sampling)
        drawn = int_at_least("drawn", drawn, 0)
        sessions, limit = self._sessions, self._max_session_tokens
        onto = None if onto is None else sessions.check_open(onto)
        sessions.check_room()
        if isinstance(state, SeqState) and state.end > limit:
            raise CapacityError(
                f"the state ends at position {state.end}, past max_session_tokens={limit}"
            )
        return sessions.opened(self._cache.seq_load(state, onto), sampling, drawn)
