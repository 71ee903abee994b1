"""Shared test helpers and hypothesis profiles (`HYPOTHESIS_PROFILE=ci` under CI)."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from numbakv.reference import CacheConfig, CellCache

settings.register_profile("dev", deadline=None)
settings.register_profile(
    "ci", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def small_config(**overrides) -> CacheConfig:
    """A small cache: 2 layers (global and window 2), 1 KV head of 4, 16 cells, 4 seqs."""
    fields = dict(
        n_layers=2,
        n_kv_heads=1,
        head_dim=4,
        windows=(0, 2),
        capacity=16,
        max_width=8,
        max_seqs=4,
        initial_cells=4,
    )
    fields.update(overrides)
    return CacheConfig(**fields)


def full_state(cache: CellCache) -> tuple:
    """Everything a refused call must leave unchanged: table, pool and its storage."""
    kv = [np.concatenate(cache.pool_kv(layer)).tobytes() for layer in range(cache.config.n_layers)]
    return (
        cache.snapshot(),
        cache.rows,
        cache.generation,
        cache.growth_count,
        cache.allocated_bytes,
        kv,
    )


def step_with(cache: CellCache, seq_ids, width=None):
    """Declares and prepares one step."""
    cache.declare_step(seq_ids)
    return cache.prepare_step(width)


@pytest.fixture
def cache() -> CellCache:
    return CellCache(small_config())
