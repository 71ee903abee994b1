"""A transformers model served over the device cache (on the simulator in CI, at tiny
shapes): tokens equal transformers' `generate`, and `Lockstep` (device cache against the
reference, one wrapped model serving both) holds through batches, chunks and forks."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import numbakv
from numbakv.integrations.transformers import TransformersModel, cache_config
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep

from hf_models import hf_greedy, hf_model

PROMPTS = [[3, 1, 4, 1, 5, 9], [2, 7]]
NEW = 4


@pytest.mark.parametrize("name", ["llama", "ministral"])
def test_device_cache_gives_transformers_tokens(name):
    hf = hf_model(name)
    config = cache_config(hf.config, capacity=32, max_width=4, max_seqs=2)
    executor = Executor(TransformersModel(hf), numbakv.CellCache(config), 2, 12)
    done = Engine(executor).generate(PROMPTS, max_new_tokens=NEW)
    assert [d.tokens[0] for d in done] == [hf_greedy(hf, p, NEW) for p in PROMPTS]


def test_lockstep_holds_under_a_transformers_model():
    hf = hf_model("qwen3")
    model = TransformersModel(hf)
    config = cache_config(hf.config, capacity=32, max_width=4, max_seqs=3)
    pair = [Executor(model, c(config), 3, 10) for c in (numbakv.CellCache, CellCache)]
    lockstep = Lockstep(*pair)
    [done] = Engine(lockstep).generate([PROMPTS[0]], max_new_tokens=NEW, n=2)
    assert done.tokens == [hf_greedy(hf, PROMPTS[0], NEW)] * 2
    assert lockstep.n_steps > 0 and lockstep.max_logit_error < lockstep.rtol
