"""`OpenSessions`: the `Executor`'s open sessions, each with its sampling and generator."""

import numpy as np

from numbakv.core.errors import CapacityError, SequenceError, StepError
from numbakv.core.values import as_int
from numbakv.serve.sampling import Sampling, sample_token


class OpenSessions:
    """The open sessions of an executor (a session is its cache sequence's id): each one's
    `Sampling` and the generator it draws from.

    Owns them; reads `max_sessions`, how many may be open at once. It neither opens nor
    closes cache sequences: the executor does, then tells it (`opened`, `closed`). The
    executor holds its lock around every call; `SavedSessions` checks and opens through it.
    """

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.sampling: dict[int, Sampling] = {}
        self.rng: dict[int, np.random.Generator] = {}

    @property
    def ids(self) -> list[int]:
        """Open session ids, ascending."""
        return sorted(self.sampling)

    @property
    def free(self) -> int:
        """Sessions that can still be opened."""
        return self.max_sessions - len(self.sampling)

    def check_open(self, session) -> int:
        """`session` as an int when it is an open session, else SequenceError."""
        hint = "; use an id open_session() returned"
        session = as_int("session", session, SequenceError, hint)
        if session not in self.sampling:
            raise SequenceError(
                f"session {session} is not open (open: {self.ids}); open_session() first"
            )
        return session

    def check_room(self) -> None:
        """CapacityError when every session is open."""
        if not self.free:
            raise CapacityError(
                f"all max_sessions={self.max_sessions} sessions are open; close one first"
            )

    def opened(self, session: int, sampling: Sampling, drawn: int = 0) -> int:
        """Records `session` (just opened in the cache) as sampling with `sampling`, its
        generator as after `drawn` sampled tokens; returns it."""
        self.sampling[session] = sampling
        self.rng[session] = sampling.generator(drawn)
        return session

    def closed(self, session: int) -> None:
        """Forgets `session` (just closed in the cache)."""
        del self.sampling[session], self.rng[session]

    def sample(self, session, logits: np.ndarray, vocab_size: int) -> int:
        """Draws `session`'s next token from `logits` ([vocab_size] floats) with its
        sampling; SequenceError for a session not open, StepError for other logits."""
        session = self.check_open(session)
        logits = np.asarray(logits)
        if logits.shape != (vocab_size,) or logits.dtype.kind != "f":
            raise StepError(
                f"logits have shape {logits.shape} and dtype {logits.dtype}; expected "
                f"[vocab_size={vocab_size}] floats, an Output's logits"
            )
        return sample_token(logits, self.sampling[session], self.rng[session])
