"""Prefill on one rank, decode on another (docs/contract.md §15.3): the decode engine
continues the prompt as one engine generates it, token for token, with the prompt all
cached; a geometry mismatch and a dead peer are refused on both sides, nothing changed."""

import os

import pytest

pytest.importorskip("torch")

from numbakv.distributed.handoff import receive_prompt, send_prompt
from numbakv.reference import CellCache
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.prefix import PrefixCache

from helpers import tiny_model
from ranks import on_ranks

PROMPT = "prefill here, decode there: the prompt's cells move once"
N = 8


def engine(head_dim: int = 4, dtype: str = "float32") -> Engine:
    model = tiny_model(seed=4, head_dim=head_dim)
    config = model.config.cache_config(capacity=256, max_width=16, max_seqs=4, dtype=dtype)
    executor = Executor(model, CellCache(config), 2, 96)
    return Engine(executor, prefix_cache=PrefixCache(executor))


def handoff(group, decode_dtype: str, die: bool, receiver=None):
    """Rank 0 prefills and sends; rank 1 receives and decodes. Each returns what it saw."""
    if group.rank == 0:
        prefill = engine()
        [done] = prefill.generate([PROMPT], max_new_tokens=1)
        before = prefill.prefix_cache.n_cells
        state = send_prompt(prefill, done.request_id, 1, group)
        return done.tokens[0], state.n_tokens, before == prefill.prefix_cache.n_cells
    decode = engine(dtype=decode_dtype) if receiver is None else receiver
    if die:
        os._exit(1)
    cells = decode.prefix_cache.n_cells if receiver is None else 0
    try:
        tokens, first = receive_prompt(decode, 0, group)
    except Exception as error:
        now = decode.prefix_cache.n_cells if receiver is None else 0
        return type(error).__name__, str(error), cells == now
    [rest] = decode.generate([[*tokens, first]], max_new_tokens=N - 1)
    return [first, *rest.tokens[0]], rest.metrics.n_cached_tokens, len(tokens)


def test_the_decode_engine_continues_the_prompt_as_one_engine_does():
    [alone] = engine().generate([PROMPT], max_new_tokens=N)
    (first, n_sent, unchanged), (tokens, n_cached, n_prompt) = on_ranks(handoff, "float32", False)
    assert tokens == alone.tokens[0] and first == tokens[:1]
    assert n_cached == n_prompt == n_sent == len(PROMPT) and unchanged


def test_a_geometry_mismatch_is_refused_on_both_sides_with_nothing_loaded():
    sender, receiver = on_ranks(handoff, "float16", False)
    assert sender[0] == "ConfigError" and "rank 1 refused the prompt before the K/V" in sender[1]
    kind, message, unchanged = receiver
    assert kind == "ConfigError" and "geometry" in message and "float16" in message and unchanged


def test_a_dead_decode_rank_fails_the_sender():
    sender, receiver = on_ranks(handoff, "float32", True, timeout=5)
    assert sender[0] == "DistributedError" and "send to rank 1 failed" in sender[1]
    assert receiver is None


def test_a_receiver_that_is_no_engine_refuses_before_the_kv_moves():
    sender, receiver = on_ranks(handoff, "float32", False, "not an engine")
    assert sender[0] == "ConfigError" and "not an Engine with a prefix cache" in sender[1]
    assert receiver[0] == "ConfigError" and "not an Engine" in receiver[1]
