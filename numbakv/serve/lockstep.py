"""`Lockstep`: two executors driven as one, every result of the first checked against the
second. Give it an executor over the device cache and one over the reference cache, and any
driver (the `Engine`, a test, your scheduler) is differentially tested as it runs. It is a
`SessionExecutor`, so the `Engine` takes it as it takes an `Executor`. An observer of
either cache that raises (`ObserverError`: the call completed) is no disagreement: the call
runs on both and is checked, then the first such error propagates, as from an `Executor`
(`faults`; docs/contract.md §9.1).

Thread safety: like an `Executor`, a `Lockstep` is safe to share; one re-entrant lock
makes each call run on both executors before another call starts."""

import threading
from collections.abc import Callable, Sequence

import numpy as np

from numbakv.core.config import TOLERANCE
from numbakv.core.errors import ConfigError
from numbakv.core.observe import locked
from numbakv.core.seq_state import SeqState
from numbakv.core.values import real
from numbakv.serve.batch import Input, Output
from numbakv.serve.executor import Executor
from numbakv.serve.faults import Observed, completes
from numbakv.serve.sampling import GREEDY, Sampling

# a model's logits pass through every layer's float32 matmuls: ten times the float32
# attention tolerance (the demo's 2-layer model differs by 3e-5 between the two paths)
LOGITS_RTOL = 10 * TOLERANCE["float32"]


class LockstepError(AssertionError):
    """The two executors disagreed: a table, a session id, a token, a fork or the logits."""


class Lockstep:
    """Runs every call on `executor` and on `reference`, compares, returns `executor`'s result.

    After each `execute` the two caches' tables must be equal (`Snapshot` equality), every
    sampled token and every fork (clone id and token) the same, and the logits within
    `rtol` of the row's largest |logit| (at least 1); refusals must be the same error type
    on both. The first disagreement raises `LockstepError`; executors of different
    vocabularies are refused at once (ConfigError).

    n_steps          : batches checked so far
    max_logit_error  : the largest logit difference seen, relative as `rtol`
    """

    def __init__(self, executor: Executor, reference: Executor, rtol: float = LOGITS_RTOL):
        for name, ex in (("executor", executor), ("reference", reference)):
            if not isinstance(ex, Executor):
                raise ConfigError(f"{name} must be an Executor, got {ex!r}")
        rtol = real("rtol", rtol, ConfigError)
        if not 0 <= rtol < np.inf:
            raise ConfigError(f"rtol={rtol} must be finite and >= 0")
        if executor.vocab_size != reference.vocab_size:
            raise ConfigError(
                f"the executor's vocab_size={executor.vocab_size} is not the reference's "
                f"{reference.vocab_size}"
            )
        self.executor = executor
        self.reference = reference
        self.rtol = rtol
        self.n_steps = 0
        self.max_logit_error = 0.0
        self._lock = threading.RLock()
        self._observed = Observed()  # the ObserverErrors of the public call in progress
        self._pair = (self._observed.around(executor), self._observed.around(reference))

    @property
    def cache(self):
        return self.executor.cache

    @property
    def model(self):
        """The executor's model (what the engine reads its default stop tokens from)."""
        return self.executor.model

    @property
    def forward_counts(self):
        """How `executor`'s forwards ran (`ForwardCounts`): the engine's metrics show it."""
        return self.executor.forward_counts

    @property
    def vocab_size(self) -> int:
        """Tokens are ids in [0, vocab_size); logits are [vocab_size] float32."""
        return self.executor.vocab_size

    @property
    def max_width(self) -> int:
        """Tokens one forward of `executor` takes at most."""
        return self.executor.max_width

    @property
    def max_sessions(self) -> int:
        """Sessions open at once, at most (`executor`'s)."""
        return self.executor.max_sessions

    @property
    def max_session_tokens(self) -> int:
        """Positions one session may hold, at most (`executor`'s)."""
        return self.executor.max_session_tokens

    @property
    def free_sessions(self) -> int:
        """Sessions that can still be opened or cloned (`executor`'s)."""
        return self.executor.free_sessions

    @property
    def capacity(self) -> int:
        """Cells `executor`'s cache may hold."""
        return self.executor.capacity

    @property
    @locked
    def free_cells(self) -> int:
        """Cells `executor`'s cache can still place tokens in (the reference's must agree)."""
        return self._agreed("free_cells", lambda e: e.free_cells)

    @locked
    def length(self, session: int) -> int:
        """Positions `session` holds (the reference's must agree)."""
        return self._agreed(f"length({session})", lambda e: e.length(session))

    @locked
    @completes
    def open_session(self, sampling: Sampling = GREEDY, drawn: int = 0) -> int:
        return self._same("open_session", lambda e: e.open_session(sampling, drawn))

    @locked
    @completes
    def clone(
        self,
        session: int,
        upto: int | None = None,
        sampling: Sampling | None = None,
        drawn: int = 0,
    ) -> int:
        return self._same("clone", lambda e: e.clone(session, upto, sampling, drawn))

    @locked
    @completes
    def rewind(self, session: int, position: int) -> None:
        self._both(lambda e: e.rewind(session, position))
        self._check_tables("rewind")

    @locked
    @completes
    def close_session(self, session: int) -> None:
        self._both(lambda e: e.close_session(session))
        self._check_tables("close_session")

    @locked
    @completes
    def save_session(self, session: int, start: int = 0) -> SeqState:
        """`executor`'s state of `session` (`Executor.save_session`); the reference's must
        hold the same positions in the same geometry. Their K/V are not compared byte for
        byte (a device-resident model computes them in another order: the logits are
        compared within `rtol`)."""
        got, expect = self._both(lambda e: e.save_session(session, start))
        if any(getattr(got, f) != getattr(expect, f) for f in ("geometry", "start", "n_tokens")):
            raise LockstepError(
                f"save_session({session}): positions {got.start} .. {got.end - 1}, the "
                f"reference's {expect.start} .. {expect.end - 1} (or another geometry)"
            )
        return got

    @locked
    @completes
    def load_session(
        self,
        state: SeqState,
        onto: int | None = None,
        sampling: Sampling = GREEDY,
        drawn: int = 0,
    ) -> int:
        """The same `state` loaded on both (`Executor.load_session`): a state saved on
        either side loads into the other; the session ids and tables must agree."""
        return self._same("load_session", lambda e: e.load_session(state, onto, sampling, drawn))

    @locked
    @completes
    def sample(self, session: int, logits: np.ndarray) -> int:
        return self._same("sample", lambda e: e.sample(session, logits))

    @locked
    @completes
    def execute(self, inputs: Sequence[Input]) -> list[Output]:
        got, expect = self._both(lambda e: e.execute(inputs))
        for g, e in zip(got, expect, strict=True):
            error = float(np.abs(g.logits - e.logits).max() / max(1.0, np.abs(e.logits).max()))
            self.max_logit_error = max(self.max_logit_error, error)
            if not error <= self.rtol:
                raise LockstepError(
                    f"step {self.n_steps}, session {g.session}: logits differ by {error:.3g} "
                    f"of the largest > rtol={self.rtol}"
                )
            if g.token != e.token:
                raise LockstepError(
                    f"step {self.n_steps}, session {g.session}: sampled {g.token}, the "
                    f"reference sampled {e.token}"
                )
            if g.forks != e.forks:
                raise LockstepError(
                    f"step {self.n_steps}, session {g.session}: forked (session, token) "
                    f"{g.forks}, the reference {e.forks}"
                )
        self._check_tables(f"step {self.n_steps}")
        self.n_steps += 1
        return got

    def _agreed(self, what: str, read: Callable[[Executor], int]) -> int:
        """What `read` gives on both executors, which must agree (no table compared)."""
        got, expect = self._both(read)
        if got != expect:
            raise LockstepError(f"{what}: got {got!r}, the reference {expect!r}")
        return got

    def _same(self, what: str, call: Callable[[Executor], object]):
        got, expect = self._both(call)
        if got != expect:
            raise LockstepError(f"{what}: got {got!r}, the reference {expect!r}")
        self._check_tables(what)
        return got

    def _both(self, call: Callable[[Executor], object]) -> tuple:
        """(executor's result, reference's result), the executor called first; a refusal
        must be the same on both."""
        executor, reference = self._pair
        try:
            got = call(executor)
        except Exception as error:
            try:
                call(reference)
            except Exception as reference_error:
                if type(reference_error) is type(error):
                    raise error from None
                raise LockstepError(
                    f"the executor refused ({error!r}), the reference ({reference_error!r})"
                ) from error
            raise LockstepError(
                f"the executor refused ({error!r}), the reference did not"
            ) from error
        try:
            expect = call(reference)
        except Exception as error:
            raise LockstepError(
                f"the reference refused ({error!r}), the executor did not"
            ) from error
        return got, expect

    def _check_tables(self, what: str) -> None:
        if self.executor.cache.snapshot() != self.reference.cache.snapshot():
            raise LockstepError(f"{what}: the cell tables differ")
