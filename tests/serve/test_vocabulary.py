"""A model whose vocabulary is not the bytes', end to end: the executor's checks and
logits, the engine with a tokenizer of its own, and the refusals of parts that disagree."""

from dataclasses import replace

import numpy as np
import pytest

from numbakv.core.errors import ConfigError, StepError
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.sampling import Sampling

from helpers import full_state, solo_generate, tiny_model

MODEL = tiny_model(seed=2, vocab_size=40)


def executor(model=MODEL) -> Executor:
    cache = CellCache(model.config.cache_config(capacity=128, max_width=8, max_seqs=4))
    return Executor(model, cache, 4, 32)


def state(ex: Executor) -> tuple:
    """What a refused batch must leave as it was: the cache, the sessions, their generators."""
    rngs = {s: ex._open.rng[s].bit_generator.state for s in ex.sessions}
    return full_state(ex.cache), ex.sessions, rngs


def test_the_executor_checks_and_returns_the_models_vocabulary():
    ex = executor()
    assert (ex.vocab_size, ex.max_width) == (40, 8)
    s = ex.open_session()
    out = ex.execute([Input(s, 0, [39, 0, 17], forks=(Sampling(temperature=1.0, seed=1),))])[0]
    assert out.logits.shape == (40,) and 0 <= out.token < 40
    tokens, logits = solo_generate(MODEL, [39, 0, 17], 1)
    assert out.token == tokens[0]
    np.testing.assert_allclose(out.logits, logits[0], rtol=1e-5, atol=1e-4)
    assert 0 <= out.forks[0][1] < 40
    before = state(ex)
    with pytest.raises(StepError, match=r"\[0, 40\)"):
        ex.execute([Input(s, 3, [40])])
    assert state(ex) == before


class Letters:
    """A tokenizer of 27 tokens: a..z are 0..25, anything else is 26."""

    vocab_size = 27

    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") if "a" <= c <= "z" else 26 for c in text]

    def decode(self, tokens) -> str:
        return "".join(chr(ord("a") + t) if t < 26 else "_" for t in tokens)


def test_another_vocabulary_through_another_tokenizer():
    model = tiny_model(seed=3, vocab_size=32)
    engine = Engine(executor(model), tokenizer=Letters())
    sampling = Sampling(temperature=1.0, seed=2)
    greedy, sampled = engine.generate(["hello cells"], 6) + engine.generate(
        ["two samples"], 6, sampling=sampling, n=2
    )
    assert greedy.prompt == Letters().encode("hello cells")
    assert greedy.prompt[:6] == [7, 4, 11, 11, 14, 26]
    assert greedy.tokens == [solo_generate(model, greedy.prompt, 6)[0]]
    for i, tokens in enumerate(sampled.tokens):
        expect, _ = solo_generate(model, sampled.prompt, 6, replace(sampling, seed=2 + i))
        assert tokens == expect
    tokens = [t for done in (greedy, sampled) for sample in done.tokens for t in sample]
    assert max(tokens) >= 27  # the model's vocabulary, not the tokenizer's
    assert len(engine.tokenizer.decode(greedy.tokens[0])) == 6
    with pytest.raises(ConfigError, match=r"\[0, 32\)"):
        engine.submit([3, 32])
    assert not engine.is_busy


@pytest.mark.parametrize(
    "tokenizer, match",
    [
        (type("Big", (Letters,), {"vocab_size": 41})(), "vocab_size=41 passes .* vocab_size=40"),
        ("bytes", "Tokenizer"),
        (object(), "Tokenizer"),
    ],
)
def test_the_tokenizer_must_fit_the_executor(tokenizer, match):
    with pytest.raises(ConfigError, match=match):
        Engine(executor(), tokenizer=tokenizer)
    fits = type("Fits", (Letters,), {"vocab_size": 40})()
    assert Engine(executor(), tokenizer=fits).tokenizer is fits  # the bound itself is allowed


def test_the_byte_tokenizer_needs_256_tokens():
    with pytest.raises(ConfigError, match="vocab_size=256 passes"):
        Engine(executor())  # the default tokenizer
    assert Engine(executor(tiny_model())).tokenizer.vocab_size == 256


def test_lockstep_refuses_executors_of_other_vocabularies():
    with pytest.raises(ConfigError, match="vocab_size=40"):
        Lockstep(executor(), executor(tiny_model(seed=2)))
