"""The engine's token counts are exact (issue 45): on random workloads with preemptions,
resumes, hits and host-tier reloads, the tokens the executor ran equal `n_computed_tokens`
(what prefill computed: the prompt's tokens not served from the cache, plus each position
computed again) plus the sampled tokens fed, each once."""

import numpy as np
import pytest

from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.prefix import PrefixCache
from numbakv.serve.sampling import Sampling

from helpers import tiny_model

MODEL = tiny_model(seed=5)


class Counting(Executor):
    """An executor that counts the tokens each batch runs."""

    n_run = 0

    def execute(self, inputs):
        outputs = super().execute(inputs)
        self.n_run += sum(len(i.tokens) for i in inputs)
        return outputs


def workload(seed: int) -> tuple[list[list[int]], dict]:
    """Prompts that share stems (hits), and an engine's options, drawn from `seed`."""
    rng = np.random.default_rng(seed)
    stems = [rng.integers(0, 256, int(rng.integers(3, 14))).tolist() for _ in range(2)]
    prompts = [
        stems[int(rng.integers(2))] + rng.integers(0, 256, int(rng.integers(1, 8))).tolist()
        for _ in range(int(rng.integers(3, 8)))
    ]
    options = dict(
        capacity=int(rng.integers(34, 48)),
        host_bytes=[None, 10**6][int(rng.integers(2))],
        n=int(rng.integers(1, 3)),
        max_new_tokens=int(rng.integers(2, 9)),
    )
    return prompts, options


@pytest.mark.parametrize("seed", range(24))
def test_the_executor_ran_what_the_metrics_say(seed):
    prompts, o = workload(seed)
    config = MODEL.config.cache_config(capacity=o["capacity"], max_width=16, max_seqs=8)
    executor = Counting(MODEL, CellCache(config), 6, 30, oversubscribe=True)
    engine = Engine(executor, prefix_cache=PrefixCache(executor, host_bytes=o["host_bytes"]))
    sampling = Sampling(0.9, top_k=20, seed=seed)  # samples differ: no sibling's hit
    done = engine.generate(prompts, o["max_new_tokens"], sampling=sampling, n=o["n"])
    fed = sum(len(tokens) - 1 for d in done for tokens in d.tokens)  # all but each last
    m = engine.metrics
    assert executor.n_run == m.n_computed_tokens + fed, (m, o)
    for d in done:  # per request: no prompt token both cached and computed first time
        assert 0 <= d.metrics.n_cached_tokens <= d.metrics.n_prompt_tokens


def test_workloads_reach_preemptions_resumes_hits_and_reloads():
    seen = {"preempt": 0, "hit": 0, "reload": 0}
    for seed in range(12):
        prompts, o = workload(seed)
        config = MODEL.config.cache_config(capacity=o["capacity"], max_width=16, max_seqs=8)
        executor = Executor(MODEL, CellCache(config), 6, 30, oversubscribe=True)
        prefix = PrefixCache(executor, host_bytes=o["host_bytes"])

        def heard(kind, **data):
            if kind in seen:
                seen[kind] += 1

        engine = Engine(executor, prefix_cache=prefix, annotate=heard)
        engine.generate(prompts, o["max_new_tokens"], sampling=Sampling(0.9, seed=seed), n=o["n"])
    assert all(seen.values()), seen
