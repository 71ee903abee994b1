"""`DecodeFirstScheduler`: which queued tokens go into the next batch of a continuous batcher.

Pure Python, no numpy. Each session has a FIFO queue of tasks; only its head task can be
served, so a session's tokens leave in submission order (a prefill behind a queued decode
waits for it, and a decode behind a prefill waits until the whole prefill is served).

`next_batch` fills a budget of `max_batch_tokens` tokens in two phases:

1. decodes: sessions whose head is a decode, oldest submission first, at most
   `max_decode_sequences` of them, one token each (so at most one per session);
2. prefill: sessions whose head is a prefill, in a rotation kept across calls, in passes;
   a pass offers each session one chunk of min(`max_prefill_chunk`, tokens left in its
   head task) tokens. A session with a decode in this batch is skipped. A chunk larger
   than the budget left is deferred, never split, and the pass goes on (a smaller chunk
   may fit). Passes repeat while the last one took a chunk and budget remains.

A worked batch, `DecodeFirstScheduler(8, 2, 4)` after `submit([Task(0, "prefill", 6),
Task(1, "decode", 1), Task(2, "prefill", 3)])`:

    decode  1 x1                    budget 8 -> 7
    pass 1: prefill 0 x4, 2 x3      budget 7 -> 0 (session 0's next chunk is 2 tokens)
    next_batch() == [Work(1, "decode", 1), Work(0, "prefill", 4), Work(2, "prefill", 3)]

Rotation: least recently served first. After a batch the sessions that got a prefill chunk
move to the back (keeping their order); a deferred session keeps its place, so it is offered
first next time. New sessions join at the back.

No starvation: whenever anything is queued the batch is non-empty (with no decode heads the
first chunk gets the whole budget, and `max_prefill_chunk <= max_batch_tokens`). A decode
waits only behind older decodes. A prefill head waits at most one batch per session ahead
of it in the rotation when `max_decode_sequences + max_prefill_chunk <= max_batch_tokens`;
with a larger sum a full-size chunk can wait while decodes keep arriving (chunks are not
split to fit).

Not thread-safe by itself: the `Engine` calls its scheduler only under the engine's lock.
"""

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from numbakv.core.errors import ConfigError
from numbakv.core.values import int_at_least

Kind = Literal["decode", "prefill"]


@dataclass(frozen=True)
class Task:
    """Work a session asks for: `n_tokens` tokens (1 for a decode, >= 1 for a prefill)."""

    session: int
    kind: Kind
    n_tokens: int


@dataclass(frozen=True)
class Work:
    """One entry of a batch: a decode token, or a prefill chunk of `n_tokens` tokens taken
    from the front of the session's head prefill task."""

    session: int
    kind: Kind
    n_tokens: int


@dataclass
class _Queued:
    arrival: int  # submission counter, orders decodes across sessions
    kind: Kind
    n_left: int  # tokens not yet served


class DecodeFirstScheduler:
    """Decode-first continuous batching over per-session FIFO task queues.

    max_batch_tokens     : tokens per batch, >= 1
    max_decode_sequences : decode tokens (= sessions decoding) per batch, 1..max_batch_tokens
    max_prefill_chunk    : tokens per prefill chunk, 1..max_batch_tokens
    """

    def __init__(self, max_batch_tokens: int, max_decode_sequences: int, max_prefill_chunk: int):
        self.max_batch_tokens = int_at_least("max_batch_tokens", max_batch_tokens, 1)
        self.max_decode_sequences = int_at_least("max_decode_sequences", max_decode_sequences, 1)
        self.max_prefill_chunk = int_at_least("max_prefill_chunk", max_prefill_chunk, 1)
        for name in ("max_decode_sequences", "max_prefill_chunk"):
            if getattr(self, name) > self.max_batch_tokens:
                raise ConfigError(
                    f"{name}={getattr(self, name)} is above its bound "
                    f"max_batch_tokens={self.max_batch_tokens}"
                )
        self._queues: dict[int, deque[_Queued]] = {}  # session -> its tasks, head first
        self._rotation: list[int] = []  # sessions with queued tasks, least recently served first
        self._n_arrived = 0

    def submit(self, tasks: Sequence[Task]) -> None:
        """Queue `tasks` in order, all or none: every task is checked before any is queued."""
        if isinstance(tasks, Task) or not isinstance(tasks, Sequence):
            raise ConfigError(f"submit() takes a list of Tasks, got {tasks!r}; for one: [task]")
        checked = [_check(task) for task in tasks]
        for task in checked:
            if task.session not in self._queues:
                self._queues[task.session] = deque()
                self._rotation.append(task.session)
            self._queues[task.session].append(_Queued(self._n_arrived, task.kind, task.n_tokens))
            self._n_arrived += 1

    def cancel(self, session: int) -> list[Task]:
        """Remove and return `session`'s queued tasks in order, a partly served prefill with
        the tokens it has left; [] when nothing is queued for it."""
        session = int_at_least("session", session, 0)
        queue = self._queues.pop(session, None)
        if queue is None:
            return []
        self._rotation.remove(session)
        return [Task(session, q.kind, q.n_left) for q in queue]

    def pending(self, session: int | None = None) -> int:
        """Queued tokens, of `session` or of all sessions."""
        if session is not None:
            session = int_at_least("session", session, 0)
            return sum(q.n_left for q in self._queues.get(session, ()))
        return sum(q.n_left for queue in self._queues.values() for q in queue)

    def next_batch(self) -> list[Work]:
        """Take the next batch off the queues: decodes first, then prefill chunks (see the
        module docstring). [] only when nothing is queued."""
        decode_ids = self._pick_decodes()
        for s in decode_ids:
            self._take(s, 1)
        batch = [Work(s, "decode", 1) for s in decode_ids]
        budget = self.max_batch_tokens - len(batch)
        order = [s for s in self._rotation if s not in decode_ids]
        served: set[int] = set()
        is_taken = True
        while is_taken and budget > 0:
            is_taken = False
            for s in order:
                head = self._head(s)
                if head is None or head.kind != "prefill":
                    continue
                n = min(self.max_prefill_chunk, head.n_left)
                if n > budget:
                    continue  # deferred: not split, the pass goes on
                batch.append(Work(s, "prefill", n))
                self._take(s, n)
                budget -= n
                served.add(s)
                is_taken = True
        rotation = [s for s in self._rotation if s not in served] + [
            s for s in self._rotation if s in served
        ]
        self._rotation = [s for s in rotation if s in self._queues]
        assert sum(w.n_tokens for w in batch) <= self.max_batch_tokens
        return batch

    def _pick_decodes(self) -> list[int]:
        """Sessions whose head is a decode, oldest arrival first, at most the decode limit."""
        heads = [(queue[0].arrival, s) for s, queue in self._queues.items()]
        heads = [(a, s) for a, s in heads if self._queues[s][0].kind == "decode"]
        return [s for _, s in sorted(heads)[: self.max_decode_sequences]]

    def _head(self, session: int) -> _Queued | None:
        queue = self._queues.get(session)
        return queue[0] if queue else None

    def _take(self, session: int, n: int) -> None:
        """Serve `n` tokens of `session`'s head task; drop the task, then the session, when done."""
        queue = self._queues[session]
        queue[0].n_left -= n
        assert queue[0].n_left >= 0
        if queue[0].n_left == 0:
            queue.popleft()
        if not queue:
            del self._queues[session]


def _check(task: Task) -> Task:
    """The task with int fields, or ConfigError saying what is wrong with it."""
    if not isinstance(task, Task):
        raise ConfigError(f"expected a Task, got {task!r}")
    session = int_at_least("session", task.session, 0)
    if task.kind not in ("decode", "prefill"):
        raise ConfigError(f"task kind must be 'decode' or 'prefill', got {task.kind!r}")
    n_tokens = int_at_least("n_tokens", task.n_tokens, 1)
    if task.kind == "decode" and n_tokens != 1:
        raise ConfigError(f"a decode task has n_tokens=1, got {n_tokens} (use a prefill)")
    return Task(session, task.kind, n_tokens)
