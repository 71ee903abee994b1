"""`examples/slab_cache.py`, one contiguous K/V slab per sequence that doubles as it grows:
each of its planted bugs is caught by a hand-written witness of at most 6 ops (or by direct
calls compared with the reference) and the correct cache passes every witness; the kit's
default run on it, bugs and all, is tests/testing/test_bug_corpus.py's."""

import numpy as np
import pytest
from example_caches import (
    agree,
    assert_witness,
    attention_unwritten,
    load_example,
    pending_declaration,
    scaled_attention,
    step,
)

from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.testing import CacheUnderTest, Op
from numbakv.testing.ops import step_inputs

slab = load_example("slab_cache.py")


def make_config(**fields) -> CacheConfig:
    shape = dict(n_layers=1, n_kv_heads=2, head_dim=4, capacity=16, max_width=4, max_seqs=3)
    return CacheConfig(**{**shape, **fields})


BASE = make_config()  # slabs of 4 rows: a sequence's 5th position grows its slab
WINDOWED = make_config(windows=(2,))
SOLO = make_config(max_seqs=1)  # sequence -1 (a padding row's) is sequence 0


NEW, ONE, CLONE = Op("seq_new"), step([0]), Op("seq_clone", (0, None))
WITNESSES = {  # bug: (config, ops), the bug showing at the last op
    # position 3 is placed in the 4-row slab, position 4 doubles it: 3 must land in the new one
    "stale_slab_after_growth": (BASE, [NEW, step([0] * 3), step([0, 0])]),
    "growth_loses_tail": (BASE, [NEW, step([0] * 4), ONE]),
    "clone_one_short": (BASE, [NEW, ONE, Op("seq_clone", (0, 1)), step([1])]),
    # the clone writes its position 1 over row 1 of the source's slab, which the source reads
    "clone_aliases_slab": (BASE, [NEW, step([0, 0]), Op("seq_clone", (0, 1)), step([1, 0])]),
    "rewind_to_zero_noop": (BASE, [NEW, ONE, Op("rewind", (0, 0))]),
    "reused_id_inherits": (BASE, [NEW, ONE, Op("seq_rm", (0,)), NEW]),
    "refcount_leak_on_remove": (BASE, [NEW, ONE, CLONE, Op("seq_rm", (0,)), Op("seq_rm", (1,))]),
    # the padding row's position -1 is row 3 of slab -1 (sequence 0's), where the token went
    "padding_kv_written": (SOLO, [NEW, step([0] * 3), step([0], 2)]),
    "step_never_stale": (BASE, [NEW, ONE, CLONE]),
    "window_off_by_one_at_edge": (WINDOWED, [NEW, step([0, 0])]),
    "gqa_mapping": (BASE, [NEW, step([0], None, 2)]),
    "masked_mode_differs": (BASE, [NEW, step([0, 0], None, 1, "masked")]),
}


DIRECT = {  # bugs no op script of today's kit can show: a verb between declare and prepare,
    "decl_survives_rm": pending_declaration,  # attend without write, attend with a scale
    "attend_before_write_accepted": attention_unwritten,
    "scale_ignored": scaled_attention,
}


def test_every_planted_bug_has_one_witness():
    assert len(slab.BUGS) >= 9
    assert sorted({*WITNESSES, *DIRECT}) == sorted(slab.BUGS)
    assert not set(WITNESSES) & set(DIRECT)


@pytest.mark.parametrize("bug", sorted(WITNESSES))
def test_each_op_script_witness_catches_its_bug(bug):
    assert_witness(slab.SlabCache, *WITNESSES[bug], bug)


@pytest.mark.parametrize("bug", sorted(DIRECT))
def test_each_direct_witness_catches_its_bug(bug):
    assert agree(slab.SlabCache, BASE, DIRECT[bug])
    assert not agree(slab.SlabCache, BASE, DIRECT[bug], frozenset({bug}))


def test_slabs_double_mid_step_and_clones_copy_their_rows():
    cache = slab.SlabCache(make_config(dtype="float16"), initial_rows=2)
    assert isinstance(cache, CacheUnderTest)
    a = cache.seq_new()
    cache.declare_step([a] * 3)
    assert cache.prepare_step(width=4).positions.tolist() == [0, 1, 2, -1]
    assert cache.slab_rows(a) == 4 and cache._slabs[a].k.dtype == np.float16
    k, v, _ = step_inputs(BASE, 4, 1, 3, 0)
    cache.write(0, k, v)
    b = cache.seq_clone(a, 3)
    assert cache.slab_rows(b) == 4 and cache.used_cells == 3
    source, clone = cache._slabs[a], cache._slabs[b]
    assert clone.k is not source.k and np.array_equal(clone.k[:, :3], source.k[:, :3])
    cache.check_invariants()
    cache._cells[b].append(99)  # a position whose cell nobody counts
    with pytest.raises(AssertionError, match="counts"):
        cache.check_invariants()


def test_the_example_refuses_what_it_cannot_do():
    with pytest.raises(ConfigError):
        slab.SlabCache(BASE, frozenset({"no_such_bug"}))
    with pytest.raises(ConfigError):
        slab.SlabCache(make_config(dtype="bfloat16"))
    with pytest.raises(ConfigError):
        slab.SlabCache(BASE, initial_rows=0)
