"""The kit on a user's cache: `examples/paged_cache.py`, a block-table cache with paged
attention, passes `check_cache(compare="semantic")` at block sizes 1, 3 and 16 and
`check_attention(layout="paged")`; its planted bugs are tests/testing/test_bug_corpus.py's."""

import numpy as np
import pytest
from example_caches import load_example

from numbakv.testing import check_attention, check_cache


@pytest.fixture(scope="module")
def example():
    return load_example("paged_cache.py")


BLOCK_HAZARDS = ("fork-partial-then-append", "fork-whole-then-append", "rewind-into-shared",
                 "remove-parent-after-fork", "growth-mid-step", "long-sequences")  # fmt: skip


def test_the_paged_cache_holds_to_the_reference_at_other_block_sizes(example):
    """Blocks of 4 (and every planted bug) are tests/testing/test_bug_corpus.py's."""
    for block_size in (1, 3, 16):
        check_cache(lambda config, b=block_size: example.PagedCache(config, b),
                    hazards=BLOCK_HAZARDS, max_examples=30)  # fmt: skip


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
