"""`numbakv.serve.sampling`: greedy, temperature, top-k and top-p, one draw per token."""

import numpy as np
import pytest

from numbakv.core.errors import ConfigError
from numbakv.serve.sampling import GREEDY, Sampling, sample_token

LOGITS = np.array([1.0, 3.0, 0.5, 2.0, -1.0, 2.9], dtype=np.float32)


def probabilities(logits, temperature=1.0):
    z = np.exp((logits - logits.max()) / temperature)
    return z / z.sum()


def draws(sampling, n=20000, logits=LOGITS):
    rng = sampling.generator()
    return np.bincount(
        [sample_token(logits, sampling, rng) for _ in range(n)], minlength=len(logits)
    )


def test_greedy_is_argmax_and_draws_nothing():
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    assert sample_token(LOGITS, GREEDY, rng) == 1
    assert rng.bit_generator.state == before
    assert sample_token(np.array([2.0, 2.0, 1.0]), GREEDY, rng) == 0  # ties: the lower id


def test_temperature_draws_follow_the_softmax():
    for temperature in (1.0, 0.5):
        freq = draws(Sampling(temperature=temperature, seed=1)) / 20000
        np.testing.assert_allclose(freq, probabilities(LOGITS, temperature), atol=0.015)


def test_top_k_keeps_the_k_most_likely():
    counts = draws(Sampling(temperature=2.0, top_k=3, seed=2), n=4000)
    assert set(np.flatnonzero(counts)) == {1, 3, 5}
    p = probabilities(LOGITS[[1, 3, 5]], 2.0)
    np.testing.assert_allclose(counts[[1, 3, 5]] / 4000, p, atol=0.03)
    assert draws(Sampling(temperature=5.0, top_k=1), n=50)[1] == 50


def test_top_p_keeps_the_fewest_reaching_p():
    p = probabilities(LOGITS)  # sorted: 1 (0.38), 5 (0.35), 3 (0.14), 0 (0.05), ...
    order = np.argsort(-p)
    for top_p in (0.3, 0.5, 0.8, 0.95):
        n_kept = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
        counts = draws(Sampling(temperature=1.0, top_p=top_p, seed=3), n=3000)
        assert set(np.flatnonzero(counts)) == set(order[:n_kept].tolist())


def test_same_seed_same_tokens_other_seed_other_tokens():
    a, b, c = (draws(Sampling(temperature=1.0, seed=s), n=200) for s in (7, 7, 8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(seed=-3), "seed"),
    ],
)
def test_sampling_refusals(fields, match):
    with pytest.raises(ConfigError, match=match):
        Sampling(**fields)
