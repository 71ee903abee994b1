"""`Executor`: sessions over one cell cache and one model; a batch of token slices in,
each slice's last-row logits and sampled token out (and the tokens of its forks).

A session is a cache sequence (its id is the sequence id) with its own sampling and
generator. `execute` takes inputs, each a run of one session's tokens starting at a
position:

    position == length(session)  appends;
    position <  length(session)  rewinds the session to `position` first (the cache's
                                 `rewind`), then appends: regenerating from there;
    position >  length(session)  is refused: it would leave a gap.

A session may have several inputs in one batch when each starts where the one before
ended. Every input is checked before anything changes, so a refused batch changes nothing.
The batch's tokens, in input order, are cut by `plan_slices` into forwards of at most
`max_width` tokens; each forward declares its tokens to the cache, runs the model and
keeps the logits of the rows that end an input.

The executor is where tokens are sampled. An input with `forks` (one `Sampling` each)
also clones its session after its last token, once per fork, once every forward of the
batch has run: each clone takes the lowest free session id (in input order, then fork
order), shares every cell of the session up to there (nothing is copied) and draws its
first token from the same logits with its fork's sampling, from a fresh generator of its
seed. That is how n samples of one prompt start:

    forks = tuple(Sampling(0.8, seed=seed + i) for i in range(1, n))
    [out] = executor.execute([Input(session, 0, prompt, forks=forks)])
    out.token, out.forks            # sample 0's token; ((clone, its token), ...) for 1..n-1

Refusals name the bad value: a session id that is not an integer (bools, floats, strings
refused) or not open (SequenceError); an input's tokens that are not a non-empty list (or
1-d integer array) of ints in the vocabulary, a `sample` that is not a bool, forks that
are not Samplings (StepError); a position that is not an integer >= 0 (ConfigError).

An observer of the cache that raises (`ObserverError`: the verb completed) never leaves
the executor half-done: each public call finishes with the verb's result, then raises it
(`faults`; docs/contract.md §9.1). After `open_session` or a `clone` that raised it the
session is open (its id is the error's `.result`); after `close_session` it is closed;
`execute` runs the whole batch and raises an ObserverError whose `.result` is its outputs.

`save_session` and `load_session` save a session to a `SeqState` and load one as a new
session (`saved`; docs/contract.md §13).

Thread safety: an `Executor` is safe to share between threads. A re-entrant lock guards
every public method and property (sessions, batches, sampling), so each call sees and
leaves whole sessions; `cache` and `model` are the executor's own and are not guarded
when used directly.
"""

import threading
from collections.abc import Sequence

import numpy as np

from numbakv.core.calls import check_geometry
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError, ConfigError, SequenceError
from numbakv.core.observe import locked
from numbakv.core.seq_state import SeqState
from numbakv.core.values import int_at_least
from numbakv.serve.batch import Input, Output, checked_inputs
from numbakv.serve.faults import Observed, batch_observed, completes
from numbakv.serve.graphs import DecodeGraphs, ForwardCounts
from numbakv.serve.models import ServedModel, check_model
from numbakv.serve.open_sessions import OpenSessions
from numbakv.serve.plan import plan_slices
from numbakv.serve.sampling import GREEDY, Sampling, check_sampling
from numbakv.serve.saved import SavedSessions


class Executor:
    """Runs batches of session inputs through `model` over `cache`.

    model              : a `ServedModel` (numbakv's `Model` or `DeviceModel`, a transformers
                         model wrapped, your own) whose layers, KV heads, head_dim and
                         windows match the cache
    cache              : an empty cell cache (reference or device); the executor owns it
    max_sessions       : sessions open at once, <= the cache's max_seqs
    max_session_tokens : positions one session may hold, <= max_seq_len; max_sessions x
                         max_session_tokens must fit the capacity, so a batch never runs out
                         of cells, unless `oversubscribe`
    oversubscribe      : False (default): the worst case is reserved, as above; True: only
                         max_session_tokens must fit the capacity, and whoever drives the
                         executor schedules by memory (the `Engine` does: `free_cells`)
    min_prefill        : forwards shorter than this run as one-token forwards (`plan_slices`)
    graphs             : "auto" (default): with a device-resident model (`DeviceModel`) over
                         the device cache, each decode forward (one token per session, at
                         most graph_width) is padded to graph_width rows and replays one
                         captured step (run eagerly once at each pool size, then captured:
                         `graphs.DecodeGraphs`);
                         "off", and any other model or cache: every forward runs eagerly
    graph_width        : rows of a captured decode step, 1..max_width; default
                         min(max_width, max_sessions)
    """

    def __init__(
        self,
        model: ServedModel,
        cache,
        max_sessions: int,
        max_session_tokens: int,
        min_prefill: int = 2,
        graphs: str = "auto",
        graph_width: int | None = None,
        oversubscribe: bool = False,
    ):
        check_model(model)
        config = getattr(cache, "config", None)
        if not isinstance(config, CacheConfig):
            raise ConfigError(f"expected a cell cache (reference or device), got {cache!r}")
        check_geometry(model.config, config)
        if cache.live_seqs:
            raise ConfigError(f"the cache holds sequences {cache.live_seqs}; give an empty one")
        self.max_sessions = int_at_least("max_sessions", max_sessions, 1)
        self.max_session_tokens = int_at_least("max_session_tokens", max_session_tokens, 1)
        self.min_prefill = int_at_least("min_prefill", min_prefill, 1)
        if self.max_sessions > config.max_seqs:
            raise ConfigError(
                f"max_sessions={max_sessions} > the cache's max_seqs={config.max_seqs}"
            )
        if self.max_session_tokens > config.max_seq_len:
            raise ConfigError(
                f"max_session_tokens={max_session_tokens} > the cache's "
                f"max_seq_len={config.max_seq_len}"
            )
        if not isinstance(oversubscribe, bool):
            raise ConfigError(f"oversubscribe must be True or False, got {oversubscribe!r}")
        if self.max_session_tokens > config.capacity:
            raise ConfigError(
                f"max_session_tokens={max_session_tokens} > the capacity {config.capacity}"
            )
        if not oversubscribe and self.max_sessions * self.max_session_tokens > config.capacity:
            raise ConfigError(
                f"max_sessions x max_session_tokens = {max_sessions} x {max_session_tokens} = "
                f"{self.max_sessions * self.max_session_tokens} cells do not fit the capacity "
                f"{config.capacity}; lower one of them, raise the capacity or oversubscribe"
            )
        if graph_width is None:
            graph_width = min(config.max_width, self.max_sessions)
        graph_width = int_at_least("graph_width", graph_width, 1)
        if graph_width > config.max_width:
            raise ConfigError(
                f"graph_width={graph_width} > the cache's max_width={config.max_width}"
            )
        self.oversubscribe = oversubscribe
        self.model = model
        self.cache = cache
        self._observed = Observed()  # the ObserverErrors of the public call in progress
        self._cache = self._observed.around(cache)  # verbs give their result, faults recorded
        self._graphs = DecodeGraphs(model, cache, graphs, graph_width)
        self._open = OpenSessions(self.max_sessions)  # each one's sampling and generator
        self._saved = SavedSessions(self._cache, config, self._open, self.max_session_tokens)
        self._lock = threading.RLock()

    # -- limits ----------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Tokens are ids in [0, vocab_size); logits are [vocab_size] float32 (the model's)."""
        return self.model.config.vocab_size

    @property
    def max_width(self) -> int:
        """Tokens one forward takes at most (the cache's max_width); a batch may hold more."""
        return self.cache.config.max_width

    @property
    def capacity(self) -> int:
        """Cells the cache may hold (its config's capacity)."""
        return self.cache.config.capacity

    @property
    @locked
    def free_cells(self) -> int:
        """Cells the cache can still place tokens in: each new token of a batch takes one."""
        return self.cache.free_cells

    @property
    @locked
    def forward_counts(self) -> ForwardCounts:
        """How the forwards so far ran: captures, replays, eager forwards (`ForwardCounts`)."""
        return self._graphs.counts

    @property
    def captures(self) -> int:
        return self.forward_counts.captures

    @property
    def replays(self) -> int:
        return self.forward_counts.replays

    @property
    def eager_forwards(self) -> int:
        return self.forward_counts.eager_forwards

    # -- sessions --------------------------------------------------------------

    @property
    @locked
    def sessions(self) -> list[int]:
        """Open session ids, ascending."""
        return self._open.ids

    @property
    @locked
    def free_sessions(self) -> int:
        """Sessions that can still be opened or cloned."""
        return self._open.free

    @locked
    @completes
    def open_session(self, sampling: Sampling = GREEDY, drawn: int = 0) -> int:
        """A new empty session (the lowest free sequence id) sampling with `sampling`, its
        generator as after `drawn` sampled tokens (a resumed sample goes on drawing what
        it would have)."""
        check_sampling(sampling)
        drawn = int_at_least("drawn", drawn, 0)
        self._open.check_room()
        return self._open.opened(self._cache.seq_new(), sampling, drawn)

    @locked
    @completes
    def clone(
        self,
        session: int,
        upto: int | None = None,
        sampling: Sampling | None = None,
        drawn: int = 0,
    ) -> int:
        """A new session sharing `session`'s first `upto` positions (default all) without
        copying them; it samples with `sampling` (default the source's) from a fresh
        generator of that seed, as after `drawn` sampled tokens."""
        session = self._open.check_open(session)
        drawn = int_at_least("drawn", drawn, 0)
        self._open.check_room()
        sampling = self._open.sampling[session] if sampling is None else check_sampling(sampling)
        return self._clone(session, upto, sampling, drawn)

    @locked
    @completes
    def rewind(self, session: int, position: int) -> None:
        """Drops `session`'s positions >= `position` (an int in [0, length]); the cells no
        other session shares are free at once."""
        session = self._open.check_open(session)
        self._cache.rewind(session, position)

    @locked
    @completes
    def close_session(self, session: int) -> None:
        """Ends `session`; its cells no other session shares are free at once."""
        session = self._open.check_open(session)
        self._cache.seq_rm(session)
        self._open.closed(session)

    @locked
    def length(self, session: int) -> int:
        """Positions `session` holds."""
        session = self._open.check_open(session)
        return self.cache.pos(session)

    @locked
    def sample(self, session: int, logits: np.ndarray) -> int:
        """Draws `session`'s next token from `logits` ([vocab_size] float32) with its
        sampling. `execute` samples by itself; this is for schedulers of your own."""
        return self._open.sample(session, logits, self.vocab_size)

    # -- saved sessions (docs/contract.md §13) ----------------------------------

    @locked
    @completes
    def save_session(self, session: int, start: int = 0) -> SeqState:
        """Open `session`'s positions start .. length-1 and their K/V as its cache stores
        them (the cache's `seq_save`); refused (SequenceError) for a session not open or a
        start outside [0, length]."""
        return self._saved.save(session, start)

    @locked
    @completes
    def load_session(
        self, state: SeqState, onto: int | None = None, sampling: Sampling = GREEDY, drawn: int = 0
    ) -> int:
        """A new session (the cache's next sequence id) holding `state`'s positions and K/V
        (the cache's `seq_load`: for a state saved from start > 0, a clone of open session
        `onto`'s first start positions, then the state's), sampling with `sampling` as
        after `drawn` sampled tokens. Refused with nothing changed: no free session, too few
        cells or a state past max_session_tokens (CapacityError), another geometry
        (ConfigError), a bad `onto` (SequenceError), a damaged state (StateError)."""
        return self._saved.load(state, onto, sampling, drawn)

    # -- batches ---------------------------------------------------------------

    @locked
    @completes(raising=batch_observed)
    def execute(self, inputs: Sequence[Input]) -> list[Output]:
        """Runs `inputs` (see the module docstring) and returns one `Output` per input, in
        order. Refused with nothing changed when an input names a closed session, has no
        tokens or a token outside the vocabulary, leaves a gap, overlaps another input of
        its session, or passes max_session_tokens; when its forks are not `Sampling`s or
        come without `sample` (StepError), or need more sessions than are free
        (CapacityError). A failure while running (the pool could not grow:
        `AllocationError`) rewinds the batch's sessions to where their inputs start, makes
        no clone, then raises. An observer that raised (`ObserverError`) does not stop the
        batch: it runs to its end, then an ObserverError with the outputs as `.result`."""
        inputs = checked_inputs(inputs, self._open.check_open, self.vocab_size)
        starts = self._check(inputs)
        for session, start in starts.items():
            if start < self.cache.pos(session):
                self._cache.rewind(session, start)
        tokens = [(x.session, int(t)) for x in inputs for t in x.tokens]
        ends = np.cumsum([len(x.tokens) for x in inputs]) - 1  # the stream index of each last row
        try:
            logits = self._run(tokens, ends)
        except BaseException:
            for session, start in starts.items():
                if self.cache.pos(session) > start:
                    self._cache.rewind(session, start)
            raise
        return [self._output(x, row) for x, row in zip(inputs, logits, strict=True)]

    def _output(self, x: Input, logits: np.ndarray) -> Output:
        """The input's `Output`: its token, then its forks cloned and sampled in order."""
        if not x.sample:
            return Output(x.session, logits, None)
        token = self.sample(x.session, logits)
        end = x.position + len(x.tokens)
        forks = tuple(self._fork(x.session, end, sampling, logits) for sampling in x.forks)
        return Output(x.session, logits, token, forks)

    def _fork(
        self, session: int, upto: int, sampling: Sampling, logits: np.ndarray
    ) -> tuple[int, int]:
        """(a clone of `session`'s first `upto` positions, its first token from `logits`)."""
        clone = self._clone(session, upto, sampling)
        return clone, self.sample(clone, logits)

    def _run(self, tokens: list[tuple[int, int]], ends: np.ndarray) -> np.ndarray:
        """[len(ends), vocab_size] float32: the logits at stream indices `ends` of the token
        stream."""
        out = np.empty((len(ends), self.vocab_size), dtype=np.float32)
        for piece in plan_slices(len(tokens), self.max_width, self.min_prefill):
            chunk = tokens[piece.start : piece.start + piece.length]
            sessions = [session for session, _ in chunk]
            self._cache.declare_step(sessions)
            step = self._cache.prepare_step(self._graphs.step_width(sessions))
            wanted = np.flatnonzero((ends >= piece.start) & (ends < piece.start + piece.length))
            logits_at = ends[wanted] - piece.start
            ids = [t for _, t in chunk]
            graphs = self._graphs
            out[wanted] = graphs.forward(self.model, self.cache, step, sessions, ids, logits_at)
        return out

    def _check(self, inputs: list[Input]) -> dict[int, int]:
        """{session: the position its first input starts at} of checked inputs, or the error
        refusing the batch (a gap, an overlap, too many positions or forks)."""
        starts: dict[int, int] = {}
        ends: dict[int, int] = {}
        for x in inputs:
            ends[x.session] = self._check_span(x, x.position, ends.get(x.session))
            starts.setdefault(x.session, x.position)
        n_forks = sum(len(x.forks) for x in inputs)
        if n_forks > self.free_sessions:
            raise CapacityError(
                f"the batch forks {n_forks} sessions, {self.free_sessions} of max_sessions="
                f"{self.max_sessions} are free; close sessions or fork fewer"
            )
        return starts

    def _check_span(self, x: Input, position: int, earlier_end: int | None) -> int:
        """Where `x` ends when it starts at `position`, after its session's earlier input of
        the batch ending at `earlier_end` (None: none); a gap, an overlap or a run past
        max_session_tokens is refused."""
        expected = self.cache.pos(x.session) if earlier_end is None else earlier_end
        if position > expected:
            raise SequenceError(
                f"session {x.session}: an input at position {position} leaves a gap after "
                f"position {expected - 1}; start at {expected} or earlier"
            )
        if earlier_end is not None and position < expected:
            raise SequenceError(
                f"session {x.session}: an input at position {position} overlaps the "
                f"batch's earlier input, which ends at {expected}"
            )
        end = position + len(x.tokens)
        if end > self.max_session_tokens:
            raise CapacityError(
                f"session {x.session}: {end} positions pass max_session_tokens="
                f"{self.max_session_tokens}; close or rewind the session"
            )
        return end

    def _clone(self, session: int, upto: int | None, sampling: Sampling, drawn: int = 0) -> int:
        """A new session sharing open `session`'s first `upto` positions, sampling with
        `sampling` as after `drawn` tokens; the room for it was checked."""
        return self._open.opened(self._cache.seq_clone(session, upto), sampling, drawn)
