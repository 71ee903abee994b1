"""The example caches of `examples/` (scripts, not a package), loaded by file; the check that
a hand-written witness script shows one planted bug through the protocol alone; and the
direct witnesses, calls beside the reference for what an op script cannot say."""

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from numbakv.core.config import CacheConfig
from numbakv.core.errors import StepError
from numbakv.reference import CellCache
from numbakv.testing import Divergence, Op, run_script
from numbakv.testing.ops import step_inputs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(file: str) -> ModuleType:
    """`examples/<file>` imported afresh, as module `example_<stem>`."""
    spec = importlib.util.spec_from_file_location(f"example_{file[:-3]}", EXAMPLES / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step(ids, width=None, group=1, *mode) -> Op:
    """One whole step of `ids` (declare, prepare, write, attend) at layer 0's seed 0."""
    return Op("step", (tuple(ids), width, group, 0, *mode))


def assert_witness(cls: type, config: CacheConfig, ops: list[Op], bug: str) -> None:
    """`ops` (at most 6) pass on `cls` and on `cls` without `check_invariants`; with `bug`
    planted they diverge, and without the invariants they diverge at the last op."""
    unchecked = type(f"Unchecked{cls.__name__}", (cls,), {"check_invariants": None})
    assert len(ops) <= 6
    run_script(cls, config, ops)
    run_script(unchecked, config, ops)
    with pytest.raises(Divergence):
        run_script(lambda c: cls(c, frozenset({bug})), config, ops)
    with pytest.raises(Divergence) as caught:  # seen through the protocol, not the invariants
        run_script(lambda c: unchecked(c, frozenset({bug})), config, ops)
    assert caught.value.index == len(ops) - 1, caught.value


def pending_declaration(cache, config: CacheConfig) -> object:
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


def attention_unwritten(cache, config: CacheConfig) -> object:
    """attend(0, q) of a prepared step before any write: StepError, or the output."""
    cache.declare_step([cache.seq_new()])
    cache.prepare_step()
    try:
        return np.asarray(cache.attend(0, step_inputs(config, 1, 1, 7, 0)[2]))
    except StepError:
        return StepError


def scaled_attention(cache, config: CacheConfig) -> np.ndarray:
    """[2, n_kv_heads * 2, head_dim] float32: attend(0, q, scale=0.25) of a two-token
    prefill with two query heads per KV head."""
    a = cache.seq_new()
    cache.declare_step([a, a])
    cache.prepare_step()
    k, v, q = step_inputs(config, 2, 2, 7, 0)
    cache.write(0, k, v)
    return np.asarray(cache.attend(0, q, scale=0.25))


def agree(cls: type, config: CacheConfig, calls, bugs=frozenset()) -> bool:
    """Whether `calls(cache, config)` gives `cls(config, bugs)` what it gives the reference:
    the same error class, the same values, or outputs within 1e-5."""
    want, have = calls(CellCache(config), config), calls(cls(config, bugs), config)
    if isinstance(want, np.ndarray) and isinstance(have, np.ndarray):
        return bool(np.allclose(want, have, rtol=0, atol=1e-5))
    return type(want) is type(have) and want == have
