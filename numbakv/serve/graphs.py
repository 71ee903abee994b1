"""`DecodeGraphs`: how the executor runs a forward, eagerly or by replaying a captured step.

With a device-resident model (`numbakv.DeviceModel`, which keeps its
activations in fixed device buffers) over a cache that can `capture` (the device cache),
a decode forward — every token from a different session, at most `width` of them — is
padded to `width` rows and runs as the replay of one captured step (`StepGraph`). The
graph holds the model's launches and the cache's writes and attends; it reads the step's
tokens, logits_at, positions and cells from device buffers, so one capture serves any mix
of sequences. Only pool growth invalidates it (the K/V storage moved). The rule: a decode
forward at a generation of the pool that no decode forward has run at yet runs eagerly
(every kernel compiled and loaded, every buffer made, before anything is captured), the
next one captures, the ones after replay; so `recaptures == growths after the first
capture` (that decode forwards saw). Prefill and mixed forwards run eagerly.
Any other model or cache runs every forward eagerly.
"""

from dataclasses import dataclass

import numpy as np

from numbakv.core.errors import ConfigError, StepError

MODES = ("auto", "off")


@dataclass(frozen=True)
class ForwardCounts:
    """How an executor's forwards ran.

    captures       : decode forwards captured into a StepGraph (the capture also runs it)
    replays        : decode forwards run by replaying the graph
    eager_forwards : forwards launched one kernel at a time (prefill, mixed, the first
                     decode at each pool size, and every forward without graphs)
    """

    captures: int = 0
    replays: int = 0
    eager_forwards: int = 0

    @property
    def recaptures(self) -> int:
        """Captures after the first: one per growth between decode forwards."""
        return max(0, self.captures - 1)


class DecodeGraphs:
    """The executor's forwards: which run from a graph, the graph, and the counts."""

    def __init__(self, model, cache, mode: str, width: int):
        if mode not in MODES:
            raise ConfigError(f"graphs={mode!r}: give one of {MODES}")
        self.enabled = (
            mode == "auto"
            and getattr(model, "device_resident", False)
            and callable(getattr(cache, "capture", None))
        )
        self.width = width
        self.captures = self.replays = self.eager_forwards = 0
        self._graph = None
        self._warm = None  # the pool generation the last eager decode forward ran at

    @property
    def counts(self) -> ForwardCounts:
        return ForwardCounts(self.captures, self.replays, self.eager_forwards)

    def is_graphed(self, sessions: list[int]) -> bool:
        """Whether a forward of `sessions` (a session per token) runs from the graph: graphs
        are on and it is a decode forward (every session once) of at most `width` tokens."""
        distinct = len(set(sessions)) == len(sessions)
        return self.enabled and len(sessions) <= self.width and distinct

    def step_width(self, sessions: list[int]) -> int | None:
        """The width to prepare a forward of `sessions` at: the graph's for a graphed one,
        else None (the declared count)."""
        return self.width if self.is_graphed(sessions) else None

    def forward(self, model, cache, step, sessions: list[int], tokens: list[int],
                logits_at: np.ndarray) -> np.ndarray:  # fmt: skip
        """[len(logits_at), vocab_size] float32: the logits after the tokens `logits_at` of
        the prepared `step` of `sessions`' `tokens`."""
        if not self.is_graphed(sessions):
            self.eager_forwards += 1
            return _checked(model, model.forward(cache, step, tokens, logits_at), len(logits_at))
        model.stage(cache, step, list(tokens) + [0] * (step.width - len(tokens)), logits_at)
        if self._graph is not None and self._graph.bindings.generation != cache.generation:
            self._graph = None  # the pool grew: this forward runs eagerly, the next captures
        if self._graph is not None:
            self._graph.replay()
            self.replays += 1
        elif self._warm == cache.generation:
            self._graph = cache.capture(lambda: model.run(cache, step))
            self.captures += 1
        else:
            model.run(cache, step)
            self._warm = cache.generation
            self.eager_forwards += 1
        return model.logits(len(logits_at))


def _checked(model, logits, n: int) -> np.ndarray:
    """A model's logits as [n, vocab_size] floats, or StepError naming the model."""
    logits = np.asarray(logits)
    expected = (n, model.config.vocab_size)
    if logits.shape != expected or logits.dtype.kind != "f":
        raise StepError(
            f"{type(model).__name__}.forward returned logits of shape {logits.shape} and dtype "
            f"{logits.dtype}; a ServedModel returns [len(logits_at)={n}, vocab_size="
            f"{expected[1]}] floats"
        )
    return logits
