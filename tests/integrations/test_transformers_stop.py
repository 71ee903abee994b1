"""A real model's habits (issue 45): the Engine stops where transformers' `generate` stops —
at the generation config's eos ids, and the tokenizer's — unless `stop_tokens=` says
otherwise; it takes what a transformers tokenizer returns as a prompt."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numbakv.core.errors import ConfigError
from numbakv.integrations.transformers import TransformersModel, cache_config, eos_ids
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.tokenizer import ByteTokenizer

from hf_models import hf_greedy, hf_model

PROMPT = [100, 50, 25, 12, 6, 3, 200, 17]
NEW = 10


def engine(model, **kw) -> Engine:
    config = cache_config(model.hf_model.config, capacity=128, max_width=4, max_seqs=4)
    return Engine(Executor(model, CellCache(config), 4, 32), **kw)


@pytest.fixture(scope="module")
def free_tokens():
    """Greedy tokens of PROMPT with no stop (the llama twin's eos never comes up)."""
    return hf_greedy(hf_model("llama"), PROMPT, NEW)


def hf_generate(hf, prompt: list[int]) -> list[int]:
    """transformers' own greedy `generate`, stopping where its generation config says."""
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                      do_sample=False)  # fmt: skip
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("eos", [3, [99, 3]], ids=["int", "list"])
def test_the_engine_stops_at_the_generation_configs_eos(free_tokens, eos):
    hf = hf_model("llama")
    stop = free_tokens[3]  # the eos: a token greedy samples 4th
    hf.generation_config.eos_token_id = stop if eos == 3 else [99, stop]
    expected = hf_generate(hf, PROMPT)
    assert expected == free_tokens[: free_tokens.index(stop) + 1]  # transformers stopped
    model = TransformersModel(hf)
    assert model.stop_tokens == ({stop} if eos == 3 else {99, stop})
    [done] = engine(model).generate([PROMPT], max_new_tokens=NEW)
    assert (done.tokens[0], done.finish_reasons[0]) == (expected, "stop")
    [unstopped] = engine(model).generate([PROMPT], max_new_tokens=NEW, stop_tokens=())
    assert (unstopped.tokens[0], unstopped.finish_reasons[0]) == (free_tokens, "length")


def test_the_tokenizers_eos_stops_too(free_tokens):
    class Tokenizer(ByteTokenizer):
        eos_token_id = free_tokens[2]

    model = TransformersModel(hf_model("llama"))
    [done] = engine(model, tokenizer=Tokenizer()).generate([PROMPT], max_new_tokens=NEW)
    assert done.tokens[0] == free_tokens[: free_tokens.index(free_tokens[2]) + 1]


def test_eos_ids_read_the_model_config_when_the_generation_config_has_none():
    hf = hf_model("llama")
    hf.generation_config.eos_token_id = None
    assert eos_ids(hf) == {hf.config.eos_token_id}
    hf.config.eos_token_id = None
    assert eos_ids(hf) == frozenset()


def test_prompts_as_a_tokenizer_returns_them(free_tokens):
    e = engine(TransformersModel(hf_model("llama")), tokenizer=ByteTokenizer())
    prompts = [
        transformers.BatchEncoding({"input_ids": PROMPT, "attention_mask": [1] * len(PROMPT)}),
        {"input_ids": torch.tensor(PROMPT)},
        torch.tensor(PROMPT),
        np.array(PROMPT, dtype=np.int64),
    ]
    done = e.generate(prompts, max_new_tokens=NEW, stop_tokens=())
    assert [d.tokens[0] for d in done] == [free_tokens] * len(prompts)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ({"attention_mask": [1, 1]}, "prompt is a dict without input_ids"),
        (torch.tensor([PROMPT]), r"prompt is an array of shape \(1, 8\)"),
        ({"input_ids": torch.tensor([0.5, 1.0])}, r"prompt\['input_ids'\] is an array"),
        ({5, 6}, "prompt must be token ids.*got a set"),
        (iter(PROMPT), "prompt must be token ids.*got a list_iterator"),
    ],
)
def test_other_prompts_are_refused_naming_what_they_are(prompt, message):
    e = engine(TransformersModel(hf_model("llama")))
    with pytest.raises(ConfigError, match=message):
        e.submit(prompt)
