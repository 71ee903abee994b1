"""The kit on a user's cache: `examples/paged_cache.py`, a block-table cache with paged
attention, passes `check_cache(compare="semantic")` and `check_attention(layout="paged")`;
each of its planted bugs is caught by `check_cache` with a short script."""

import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

from numbakv.testing import Divergence, check_attention, check_cache

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "paged_cache.py"
BUGS = ("window_off_by_one", "shared_partial_block", "rewind_keeps_one",
        "clone_one_too_many", "padding_nonzero", "gqa_mapping")  # fmt: skip


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("paged_cache", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_paged_cache_holds_to_the_reference(example):
    for block_size in (1, 3, 16):  # workloads of 1 to 11 ops, 6 on average
        check_cache(lambda config, b=block_size: example.PagedCache(config, b), max_examples=150,
                    max_ops=11)  # fmt: skip


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_is_caught_with_a_short_script(example, bug):
    started = time.perf_counter()
    with pytest.raises(Divergence) as caught:
        check_cache(lambda config: example.PagedCache(config, 3, frozenset({bug})),
                    max_examples=300)  # fmt: skip
    seconds, n_ops = time.perf_counter() - started, len(caught.value.ops)
    print(f"{bug}: caught in {seconds:.1f} s with a {n_ops}-op script")
    assert n_ops <= 8


def paged_kernel(example):
    """The example's paged attention as a `check_attention` kernel: each token's positions
    in its window, read through its sequence's block table."""

    def attend(x):
        n_heads, n_kv_heads = x.q.shape[1], x.k_cache.shape[2]
        kv_head = np.arange(n_heads) // (n_heads // n_kv_heads)
        out = np.zeros(x.q.shape, np.float32)
        for s in range(len(x.seq_lens)):
            table = x.kv_indices[x.kv_indptr[s] : x.kv_indptr[s + 1]]
            for t in range(x.qo_indptr[s], x.qo_indptr[s + 1]):
                p = int(x.positions[t])
                first = max(0, p - x.window + 1) if x.window else 0
                out[t] = example.paged_attend(x.q[t], x.k_cache, x.v_cache, table,
                                              np.arange(first, p + 1), kv_head,
                                              np.float32(x.scale))  # fmt: skip
        return out

    return attend


def test_the_paged_attention_holds_to_the_solo_oracle(example):
    for block_size in (1, 4, 16):
        result = check_attention(paged_kernel(example), layout="paged", block_size=block_size,
                                 n_cases=16)  # fmt: skip
        assert result.cases == 16
