"""numbakv's Engine serving transformers models, token for token against transformers' own
`generate` of each prompt alone (docs/contract.md §14.2): every family of `hf_models`, on
the reference cache; prompts of different lengths batched and interleaved, prefill chunked
(max_width 4 < every prompt but one), a sliding-window model, forks, the prefix cache."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from numbakv.integrations.transformers import TransformersModel, cache_config
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import Sampling, sample_token

from hf_models import FAMILIES, hf_greedy, hf_logits, hf_model

PROMPTS = [list(range(1, 12)), [5, 9, 2], [100, 50, 25, 12, 6, 3, 200, 17], [7] * 6]
NEW = 10


def engine(model, prefix: bool = False, max_width: int = 4, **kw) -> Engine:
    config = cache_config(model.hf_model.config, capacity=256, max_width=max_width, max_seqs=8)
    executor = Executor(model, CellCache(config), 8, 32)
    return Engine(executor, prefix_cache=PrefixCache(executor) if prefix else None, **kw)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    """(family, the HF model, the same model wrapped)."""
    hf = hf_model(request.param)
    return request.param, hf, TransformersModel(hf)


def test_greedy_batched_interleaved_and_chunked_equal_transformers(family):
    name, hf, model = family
    done = engine(model).generate(PROMPTS, max_new_tokens=NEW)
    for prompt, completion in zip(PROMPTS, done, strict=True):
        assert completion.tokens[0] == hf_greedy(hf, prompt, NEW), (name, prompt)


def test_windows_come_from_the_hf_config(family):
    name, hf, model = family
    windows = model.config.windows
    assert windows == {
        "mistral": (5, 5), "ministral": (4, 0, 4), "qwen2": (0, 6, 6), "gemma3": (4, 4, 0),
        "phi3": (5, 5), "exaone4": (4, 4, 4, 0),
    }.get(name, (0,) * hf.config.num_hidden_layers)  # fmt: skip
    assert cache_config(hf.config, capacity=8, max_width=4, max_seqs=2).windows == windows


def test_wrapping_leaves_transformers_own_generate_unchanged():
    """The wrapped model's own `generate` (SDPA, its masks) gives what an unwrapped twin of
    the same weights gives: sliding windows and all."""
    prompt = PROMPTS[0]
    twin = hf_model("ministral")
    expected = hf_greedy(twin, prompt, NEW)
    hf = hf_model("ministral")
    TransformersModel(hf)
    assert hf_greedy(hf, prompt, NEW) == expected


def test_three_greedy_forks_each_equal_transformers(family):
    name, hf, model = family
    prompt = PROMPTS[2]
    [done] = engine(model).generate([prompt], max_new_tokens=NEW, n=3)
    expected = hf_greedy(hf, prompt, NEW)
    assert done.tokens == [expected] * 3, name


@pytest.mark.parametrize("name", ["llama", "ministral"])
def test_sampled_forks_draw_what_transformers_logits_give(name):
    """Three samples from one prompt (shared cells, then each its own): every token is
    what numbakv's sampler draws, with the sample's generator, from transformers' logits of
    that sample's tokens so far."""
    hf = hf_model(name)
    prompt, sampling = PROMPTS[0], Sampling(temperature=0.9, seed=11)
    [done] = engine(TransformersModel(hf)).generate([prompt], NEW, sampling=sampling, n=3)
    assert len({tuple(t) for t in done.tokens}) > 1  # the samples differ: forks diverged
    for i, tokens in enumerate(done.tokens):
        own = Sampling(temperature=0.9, seed=11 + i)
        rng = own.generator()
        logits = hf_logits(hf, prompt + tokens[:-1])[len(prompt) - 1 :].numpy()
        assert tokens == [sample_token(row, own, rng) for row in logits]


@pytest.mark.parametrize("name", ["qwen3", "mistral"])
def test_prefix_cache_on_and_off_give_transformers_tokens(name):
    hf = hf_model(name)
    stem = [9, 8, 7, 6, 5, 4, 3, 2]
    prompts = [[*stem, 40 + i, 50 + i] for i in range(3)]
    expected = [hf_greedy(hf, p, NEW) for p in prompts]
    model = TransformersModel(hf)
    for prefix in (False, True):
        e = engine(model, prefix=prefix)
        first = e.generate(prompts[:1], max_new_tokens=NEW)  # then the others hit its prefix
        rest = e.generate(prompts[1:], max_new_tokens=NEW)
        assert [d.tokens[0] for d in first + rest] == expected, prefix
        assert (e.metrics.n_cached_tokens > 0) == prefix


def test_a_wider_step_and_more_sessions_change_nothing():
    """Prompts in one forward each (max_width 16), all decodes in one forward."""
    hf = hf_model("qwen2")
    done = engine(TransformersModel(hf), max_width=16).generate(PROMPTS, max_new_tokens=NEW)
    assert [d.tokens[0] for d in done] == [hf_greedy(hf, p, NEW) for p in PROMPTS]


def test_logits_equal_transformers_to_float32_rounding():
    """One forward over an interleaved step: each requested row's logits are transformers'
    for that sequence alone, to 1e-5 of the largest |logit|."""
    hf = hf_model("gemma3")
    model = TransformersModel(hf)
    config = cache_config(hf.config, capacity=64, max_width=16, max_seqs=2)
    cache = CellCache(config)
    a, b = cache.seq_new(), cache.seq_new()
    ta, tb = PROMPTS[0][:7], PROMPTS[2][:6]
    order = [a, b, a, a, b, b, a, b, a, a, b, b, a]
    tokens = [(ta if s == a else tb)[order[:i].count(s)] for i, s in enumerate(order)]
    cache.declare_step(order)
    logits = model.forward(cache, cache.prepare_step(), tokens, np.arange(len(order)))
    expected = {a: hf_logits(hf, ta).numpy(), b: hf_logits(hf, tb).numpy()}
    for row, s in enumerate(order):
        want = expected[s][order[:row].count(s)]
        np.testing.assert_allclose(logits[row], want, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["llama", "ministral"])
def test_a_float16_model_gives_transformers_float16_tokens(name):
    """float16 tensors in and out of the cache (attention in float32, rounded to float16
    as transformers' CPU SDPA rounds its float32 accumulation)."""
    hf = hf_model(name, dtype=torch.float16)
    done = engine(TransformersModel(hf)).generate(PROMPTS, max_new_tokens=NEW)
    assert [d.tokens[0] for d in done] == [hf_greedy(hf, p, NEW) for p in PROMPTS]


def test_a_bfloat16_model_is_served_in_bfloat16():
    """bfloat16 q, k, v go into the cache as they are and the attention comes back in
    bfloat16; the logits are transformers' to bfloat16's precision (attention summed in
    float32 here, in bfloat16 steps there)."""
    hf = hf_model("qwen3", dtype=torch.bfloat16)
    model = TransformersModel(hf)
    seen = []

    class Watched(CellCache):
        def attend(self, *args, **kwargs):
            out = super().attend(*args, **kwargs)
            seen.append(out.dtype)
            return out

    cache = Watched(cache_config(hf.config, capacity=32, max_width=16, max_seqs=1))
    prompt = PROMPTS[2]
    cache.declare_step([cache.seq_new()] * len(prompt))
    logits = model.forward(cache, cache.prepare_step(), prompt, np.arange(len(prompt)))
    assert seen == [torch.bfloat16] * hf.config.num_hidden_layers
    expected = hf_logits(hf, prompt).numpy()
    np.testing.assert_allclose(logits, expected, atol=0.05 * np.abs(expected).max())
    assert (logits.argmax(-1) == expected.argmax(-1)).mean() > 0.8
