"""Choosing the next token from logits: greedy, temperature, top-k and top-p.

Each session draws from its own generator, seeded from its `Sampling`, one number per
sampled token: a session's tokens depend on its logits and its seed, never on what else
was in the batch.
"""

from dataclasses import dataclass

import numpy as np

from numbakv.core.errors import ConfigError
from numbakv.core.values import int_at_least, real


@dataclass(frozen=True)
class Sampling:
    """How a session picks tokens.

    temperature : 0 = greedy (argmax, draws nothing); > 0 divides the logits
    top_k       : keep the k most likely tokens; 0 = all
    top_p       : then keep the fewest most likely tokens whose probability reaches top_p
    seed        : seeds the session's generator
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        temperature = real("temperature", self.temperature, ConfigError)
        if not 0 <= temperature < np.inf:
            raise ConfigError(f"temperature={temperature} must be finite and >= 0 (0 = greedy)")
        top_p = real("top_p", self.top_p, ConfigError)
        if not 0 < top_p <= 1:
            raise ConfigError(f"top_p={top_p} must be in (0, 1]")
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_p", top_p)
        object.__setattr__(self, "top_k", int_at_least("top_k", self.top_k, 0))
        object.__setattr__(self, "seed", int_at_least("seed", self.seed, 0))

    def generator(self, drawn: int = 0) -> np.random.Generator:
        """A generator for a session with this sampling, as after `drawn` sampled tokens
        (fresh for 0): greedy draws nothing, any other sampling one number per token."""
        rng = np.random.default_rng(self.seed)
        if drawn and self.temperature > 0:
            rng.random(drawn)
        return rng


GREEDY = Sampling()


def check_sampling(sampling) -> Sampling:
    """`sampling`, or ConfigError when it is not a `Sampling`."""
    if not isinstance(sampling, Sampling):
        raise ConfigError(f"expected a Sampling, got {sampling!r}")
    return sampling


def sample_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """The next token: argmax when greedy, else one draw from the tempered, top-k and top-p
    filtered softmax of `logits` ([vocab] float32). Ties keep the lower token id first."""
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    scaled = np.asarray(logits, dtype=np.float64) / sampling.temperature
    order = np.argsort(-scaled, kind="stable")  # most likely first
    if sampling.top_k:
        order = order[: sampling.top_k]
    probs = np.exp(scaled[order] - scaled[order[0]])
    probs /= probs.sum()
    if sampling.top_p < 1:
        n_kept = int(np.searchsorted(np.cumsum(probs), sampling.top_p)) + 1
        probs = probs[:n_kept] / probs[:n_kept].sum()
        order = order[:n_kept]
    pick = np.searchsorted(np.cumsum(probs), rng.random(), side="right")
    return int(order[min(pick, len(order) - 1)])
