"""`SessionExecutor`: what the `Engine` needs of an executor, and nothing more.

`Executor` (one cache, one model) and `Lockstep` (two executors checked against each other)
are both one; so is anything of your own with these members:

    isinstance(executor, SessionExecutor)   # True: the members are there (not their types)
    Engine(executor)
"""

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from numbakv.serve.batch import Input, Output
from numbakv.serve.sampling import GREEDY, Sampling


@runtime_checkable
class SessionExecutor(Protocol):
    """Sessions and batches: the members the `Engine` uses. A call that raises
    `ObserverError` has completed (an observer of a cache raised after it): `.result` holds
    what it returned (the session id, the outputs), and the engine carries on with it."""

    @property
    def vocab_size(self) -> int:
        """Tokens are ids in [0, vocab_size); each output's logits are [vocab_size] float32."""

    @property
    def max_width(self) -> int:
        """Tokens one forward takes at most; the engine's default batch budget."""

    @property
    def max_sessions(self) -> int:
        """Sessions open at once, at most."""

    @property
    def max_session_tokens(self) -> int:
        """Positions (tokens) one session may hold, at most."""

    @property
    def free_sessions(self) -> int:
        """Sessions that can still be opened, or cloned by an input's forks."""

    def open_session(self, sampling: Sampling = GREEDY) -> int:
        """A new empty session sampling with `sampling`; returns its id (an int >= 0)."""

    def close_session(self, session: int) -> None:
        """Ends `session`; its cells no other session shares are free at once."""

    def execute(self, inputs: Sequence[Input]) -> list[Output]:
        """Runs a batch: one `Output` per `Input`, in order (logits [vocab_size] float32, the
        sampled token, and per fork (clone session, its first token)). A refused batch
        changes nothing; a failed one leaves its sessions where their inputs started."""
