"""The README's five lines: they are the example's, the example serves transformers' own
tokens, and a transformers tokenizer is an `Engine` tokenizer as it is."""

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from examples import serve_transformers
from numbakv.integrations.transformers import TransformersModel, cache_config
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor

from hf_models import hf_greedy, hf_model

ROOT = Path(__file__).resolve().parents[2]


def readme_lines() -> list[str]:
    """The statements of the README's "Serving a transformers model" block, imports aside."""
    text = (ROOT / "README.md").read_text()
    section = text.split("### Serving a transformers model", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return [
        line.split("  #")[0].strip()
        for line in block.splitlines()
        if line.strip() and not line.startswith(("import", "from", "#"))
    ]


def test_the_readme_serves_in_five_lines_that_the_example_runs():
    lines = readme_lines()
    assert len(lines) == 5, lines
    source = Path(serve_transformers.__file__).read_text()
    body = [line.strip() for line in source.split("def main", 1)[1].splitlines()]
    for line in lines[1:]:  # the first loads real weights; the example builds random ones
        assert line in body, line


def test_the_example_serves_transformers_tokens():
    torch.manual_seed(3)
    served = serve_transformers.main()
    torch.manual_seed(3)
    hf = transformers.AutoModelForCausalLM.from_config(serve_transformers.CONFIG).eval()
    prompts = [list(p.encode()) for p in ("Hello", "A cell cache")]
    assert served == [hf_greedy(hf, p, 12) for p in prompts]


def test_a_transformers_tokenizer_is_an_engine_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "the", "cell", "cache", "holds", "a", "token", "per", "row"]
    inner = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="<unk>")
    hf = hf_model("llama")
    config = cache_config(hf.config, capacity=64, max_width=8, max_seqs=2)
    engine = Engine(Executor(TransformersModel(hf), CellCache(config), 2, 32), tokenizer=tokenizer)
    [done] = engine.generate(["the cell cache holds a token"], max_new_tokens=6)
    assert done.tokens[0] == hf_greedy(hf, [1, 2, 3, 4, 5, 6], 6)
