"""A transformers Llama split by transformers' own tensor-parallel plan (`tp_plan="auto"`,
gloo on the CPU) and served by numbakv over two ranks (docs/contract.md §15.2): the tokens
of one process, logits within float32's tolerance, with 4 and 2 KV heads; 1 KV head,
which the plan would cut apart, is refused on every rank."""

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' tp_plan needs it

from transformers import AutoModelForCausalLM

from numbakv.core.errors import ConfigError
from numbakv.distributed.tensor_parallel import TensorParallel, serve
from numbakv.integrations.transformers import TransformersModel
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import LOGITS_RTOL
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import Sampling

from hf_models import hf_model
from ranks import on_ranks

PROMPTS = [[5, 6, 7, 8, 9], [5, 6, 7, 1, 2, 3], [200, 100, 50]]
SAMPLINGS = [Sampling(), Sampling(0.8, seed=5), Sampling()]


def executor_of(model) -> Executor:
    config = model.config.cache_config(capacity=256, max_width=16, max_seqs=8)
    return Executor(model, CellCache(config), 4, 64)


def generate(front) -> list:
    """Every prompt's tokens and each token's logits, through an engine over `front`."""
    engine = Engine(front, prefix_cache=PrefixCache(front))
    logits: dict[int, list] = {}
    ids = [
        engine.submit(p, max_new_tokens=6, sampling=s, stop_tokens=(),
                      on_token=lambda e: logits.setdefault(e.request_id, []).append(e.logits))
        for p, s in zip(PROMPTS, SAMPLINGS, strict=True)
    ]  # fmt: skip
    while engine.is_busy:
        engine.step()
    return [(engine.result(i).tokens[0], logits[i]) for i in ids]


def tp_llama(group, folders: list[str]) -> list:
    """Per folder: rank 0's (local KV heads, completions), the others' local KV heads; or
    the refusal (type name, message)."""
    out = []
    for folder in folders:
        hf = AutoModelForCausalLM.from_pretrained(folder, tp_plan="auto").eval()
        try:
            model = TransformersModel(hf)
        except ConfigError as error:
            out.append(("ConfigError", str(error)))
            continue
        executor = executor_of(model)
        if group.rank:
            serve(executor, group)
            out.append(model.config.n_kv_heads)
            continue
        tp = TensorParallel(executor, group)
        out.append((model.config.n_kv_heads, generate(tp)))
        tp.close()
    return out


def test_tp2_llama_serves_the_tokens_of_one_process(tmp_path):
    folders = []
    for n_kv_heads in (4, 2, 1):
        folder = tmp_path / f"kv{n_kv_heads}"
        hf_model("llama", seed=2, num_key_value_heads=n_kv_heads).save_pretrained(folder)
        folders.append(str(folder))
    rank0, rank1 = on_ranks(tp_llama, folders, limit=400)
    assert rank0[2] == rank1[2] and rank0[2][0] == "ConfigError", rank0[2]
    assert "cuts its n_kv_heads=1 K/V heads apart" in rank0[2][1]
    pairs = zip((4, 2), folders[:2], rank0[:2], rank1[:2], strict=True)
    for n_kv_heads, folder, (local, completions), other in pairs:
        assert local == other == n_kv_heads // 2
        alone = TransformersModel(AutoModelForCausalLM.from_pretrained(folder).eval())
        for (tokens, logits), (want, want_logits) in zip(
            completions, generate(executor_of(alone)), strict=True
        ):
            assert tokens == want, n_kv_heads
            for got, expect in zip(logits, want_logits, strict=True):
                scale = max(1.0, float(np.abs(expect).max()))
                assert np.abs(got - expect).max() / scale <= LOGITS_RTOL
