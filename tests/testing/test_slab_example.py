"""`examples/slab_cache.py`, one contiguous K/V slab per sequence that doubles as it grows:
each of its planted bugs is caught by a hand-written witness of at most 6 ops (or by direct
calls compared with the reference) and the correct cache passes every witness; the kit's
default run on it, bugs and all, is tests/testing/test_bug_corpus.py's."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from numbakv.config import CacheConfig
from numbakv.errors import ConfigError, StepError
from numbakv.reference import CellCache
from numbakv.testing import CacheUnderTest, Divergence, Op, run_script
from numbakv.testing.ops import step_inputs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "slab_cache.py"


def load_example():
    spec = importlib.util.spec_from_file_location("slab_cache", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


slab = load_example()


class Unchecked(slab.SlabCache):
    """The slab cache without `check_invariants`: what the protocol alone shows."""

    check_invariants = None


def make_config(**fields) -> CacheConfig:
    shape = dict(n_layers=1, n_kv_heads=2, head_dim=4, capacity=16, max_width=4, max_seqs=3)
    return CacheConfig(**{**shape, **fields})


BASE = make_config()  # slabs of 4 rows: a sequence's 5th position grows its slab
WINDOWED = make_config(windows=(2,))
SOLO = make_config(max_seqs=1)  # sequence -1 (a padding row's) is sequence 0


def step(ids, width=None, group=1, *mode) -> Op:
    return Op("step", (tuple(ids), width, group, 0, *mode))


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


def pending_declaration(cache) -> object:
    """declare [a, a, a]; seq_rm(a); seq_new() (a again); prepare_step(): StepError, or
    the positions it placed."""
    a = cache.seq_new()
    cache.declare_step([a, a, a])
    cache.seq_rm(a)
    cache.seq_new()
    try:
        return cache.prepare_step().positions.tolist()
    except StepError:
        return StepError


def attention_unwritten(cache) -> object:
    """attend(0, q) of a prepared step before any write: StepError, or the output."""
    cache.declare_step([cache.seq_new()])
    cache.prepare_step()
    try:
        return np.asarray(cache.attend(0, step_inputs(BASE, 1, 1, 7, 0)[2]))
    except StepError:
        return StepError


def scaled_attention(cache) -> np.ndarray:
    """[2, 4, head_dim] float32: attend(0, q, scale=0.25) of a two-token prefill."""
    a = cache.seq_new()
    cache.declare_step([a, a])
    cache.prepare_step()
    k, v, q = step_inputs(BASE, 2, 2, 7, 0)
    cache.write(0, k, v)
    return np.asarray(cache.attend(0, q, scale=0.25))


DIRECT = {  # bugs no op script of today's kit can show: a verb between declare and prepare,
    "decl_survives_rm": pending_declaration,  # attend without write, attend with a scale
    "attend_before_write_accepted": attention_unwritten,
    "scale_ignored": scaled_attention,
}


def agree(calls, bugs=frozenset()) -> bool:
    """Whether `calls` gives the slab cache (with `bugs`) what it gives the reference."""
    want, have = calls(CellCache(BASE)), calls(slab.SlabCache(BASE, bugs))
    if isinstance(want, np.ndarray) and isinstance(have, np.ndarray):
        return bool(np.allclose(want, have, rtol=0, atol=1e-5))
    return type(want) is type(have) and want == have


def test_every_planted_bug_has_one_witness():
    assert len(slab.BUGS) >= 9
    assert sorted({*WITNESSES, *DIRECT}) == sorted(slab.BUGS)
    assert not set(WITNESSES) & set(DIRECT)


@pytest.mark.parametrize("bug", sorted(WITNESSES))
def test_each_op_script_witness_catches_its_bug(bug):
    config, ops = WITNESSES[bug]
    assert len(ops) <= 6
    run_script(slab.SlabCache, config, ops)
    run_script(Unchecked, config, ops)
    with pytest.raises(Divergence):
        run_script(lambda c: slab.SlabCache(c, frozenset({bug})), config, ops)
    with pytest.raises(Divergence) as caught:  # seen through the protocol, not the invariants
        run_script(lambda c: Unchecked(c, frozenset({bug})), config, ops)
    assert caught.value.index == len(ops) - 1, caught.value


@pytest.mark.parametrize("bug", sorted(DIRECT))
def test_each_direct_witness_catches_its_bug(bug):
    assert agree(DIRECT[bug])
    assert not agree(DIRECT[bug], frozenset({bug}))


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
