"""The executor's decode graphs (`Executor(graphs="auto")`): with a device-resident model,
decode forwards replay one captured step, recaptured after each growth; generations are
token for token those of eager forwards and of the NumPy model on the reference cache."""

import pytest

from numbakv import CellCache, DeviceModel
from numbakv.core.errors import ConfigError
from numbakv.reference import CellCache as RefCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.lockstep import Lockstep
from numbakv.serve.sampling import Sampling

from helpers import tiny_model

MODEL = tiny_model(seed=3)
CACHE = dict(capacity=96, max_width=8, max_seqs=6, initial_cells=4)
SESSIONS, SESSION_TOKENS = 5, 18
REQUESTS = (  # (prompt, max_new_tokens, sampling, n)
    ([1, 2, 3, 4, 5], 11, Sampling(), 1),
    ([7, 8, 9], 10, Sampling(0.9, top_p=0.9, seed=5), 3),
)


class Prepared:
    """An observer: the (width, generation) of every step the cache prepared."""

    def __init__(self):
        self.steps: list[tuple[int, int]] = []

    def __call__(self, cache, event, step):
        if event == "prepare_step":
            self.steps.append((step.width, cache.generation))


def device_executor(graphs: str) -> Executor:
    cache = CellCache(MODEL.config.cache_config(**CACHE))
    return Executor(DeviceModel(MODEL, cache.config), cache, SESSIONS, SESSION_TOKENS,
                    graphs=graphs)  # fmt: skip


def generations(executor) -> list[list[list[int]]]:
    engine = Engine(executor)
    ids = [engine.submit(p, m, sampling, n=n) for p, m, sampling, n in REQUESTS]
    while engine.is_busy:
        engine.step()
    return [engine.result(i).tokens for i in ids], engine


def expected_counts(prepared: list[tuple[int, int]], width: int) -> tuple[int, int, int]:
    """(captures, replays, eager forwards) by the rule: a decode-width step at a generation
    no decode step ran at yet runs eagerly, the next one captures, the ones after replay
    while the generation is the graph's; every other step is eager."""
    graph, warm, captures, replays, eager = None, None, 0, 0, 0
    for step_width, generation in prepared:
        if step_width != width:
            eager += 1
        elif generation == graph:
            replays += 1
        elif generation == warm:
            graph, captures = generation, captures + 1
        else:
            graph, warm, eager = None, generation, eager + 1
    return captures, replays, eager


def test_graphs_give_the_generations_of_eager_forwards_and_of_the_reference():
    graphed, eager = device_executor("auto"), device_executor("off")
    reference = Executor(MODEL, RefCache(MODEL.config.cache_config(**CACHE)), SESSIONS,
                         SESSION_TOKENS)  # fmt: skip
    prepared = Prepared()
    graphed.cache.add_observer(prepared)
    lockstep = Lockstep(graphed, reference)
    with_graphs, engine = generations(lockstep)
    assert with_graphs == generations(eager)[0]
    assert lockstep.n_steps == engine.n_steps  # every batch compared with the reference
    counts = graphed.forward_counts
    width = min(CACHE["max_width"], SESSIONS)
    assert (counts.captures, counts.replays, counts.eager_forwards) == expected_counts(
        prepared.steps, width
    )
    assert counts.replays > counts.captures >= 2  # it grew after the first capture
    assert engine.metrics.forwards == counts and engine.metrics.n_steps == engine.n_steps
    off = eager.forward_counts
    assert (off.captures, off.replays) == (0, 0) and off.eager_forwards > 0
    assert graphed.cache.growth_count >= counts.recaptures >= 1


def test_graphs_are_off_for_a_host_model_and_refuse_a_bad_setting():
    executor = Executor(MODEL, CellCache(MODEL.config.cache_config(**CACHE)), 2, 8)
    session = executor.open_session()
    executor.execute([Input(session, 0, [1, 2, 3])])
    assert executor.forward_counts.eager_forwards == 1 and executor.captures == 0
    cache = CellCache(MODEL.config.cache_config(**CACHE))
    for bad, match in (({"graphs": "on"}, "graphs='on'"), ({"graph_width": 9}, "graph_width=9")):
        with pytest.raises(ConfigError, match=match):
            Executor(DeviceModel(MODEL, cache.config), cache, 2, 8, **bad)


def test_a_prefill_as_wide_as_the_graph_runs_eagerly():
    cache = CellCache(MODEL.config.cache_config(**CACHE))
    executor = Executor(DeviceModel(MODEL, cache.config), cache, 2, 8, graph_width=2)
    session = executor.open_session()
    for _ in range(3):  # two tokens of one session: a prefill, never the graph's
        executor.execute([Input(session, executor.length(session), [1, 2])])
    assert (executor.captures, executor.replays, executor.eager_forwards) == (0, 0, 3)
