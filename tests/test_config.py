"""CacheConfig validates itself: each bad field gets a ConfigError naming field and bound."""

import numpy as np
import pytest

from numbakv.errors import ConfigError
from numbakv.reference import CacheConfig

GOOD = dict(n_layers=2, n_kv_heads=2, head_dim=8, capacity=64, max_width=16, max_seqs=4)


def make(**overrides) -> CacheConfig:
    return CacheConfig(**{**GOOD, **overrides})


def test_defaults():
    cfg = make()
    assert cfg.windows == (0, 0)
    assert cfg.initial_cells == 64  # min(256, capacity)
    assert make(capacity=1024).initial_cells == 256
    assert cfg.dtype == "float32"
    assert cfg.distinct_windows == (0,)
    assert cfg.max_seq_len == 64  # capacity


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (dict(n_layers=0), ["n_layers", "1"]),
        (dict(n_kv_heads=0), ["n_kv_heads", "1"]),
        (dict(head_dim=-1), ["head_dim", "1"]),
        (dict(max_seqs=0), ["max_seqs", "1"]),
        (dict(max_width=0), ["max_width", "1"]),
        (dict(capacity=15), ["capacity", "16"]),  # capacity >= max_width
        (dict(windows=(0, -1)), ["windows", "0"]),
        (dict(windows=(0,)), ["windows", "n_layers=2"]),
        (dict(initial_cells=0), ["initial_cells", "1"]),
        (dict(initial_cells=65), ["initial_cells", "capacity=64"]),
        (dict(dtype="float64"), ["dtype", "float32"]),
        (dict(dtype="int8"), ["dtype", "float16"]),
        (dict(dtype="bogus"), ["dtype"]),
        (dict(head_dim=2.5), ["head_dim", "integer"]),
        (dict(capacity=True), ["capacity", "integer"]),
        (dict(max_seq_len=0), ["max_seq_len", "1"]),
        (dict(max_seq_len=65), ["max_seq_len", "capacity=64"]),
    ],
)
def test_refusals_name_field_and_bound(overrides, words):
    with pytest.raises(ConfigError) as info:
        make(**overrides)
    for word in words:
        assert word in str(info.value)


def test_normalises_types():
    cfg = make(windows=[4, np.int64(0)], dtype=np.float16, capacity=np.int32(32))
    assert cfg.windows == (4, 0)
    assert cfg.dtype == "float16"
    assert type(cfg.capacity) is int
    assert cfg.distinct_windows == (0, 4)


@pytest.mark.parametrize(("max_seqs", "words"), [(1, 1), (64, 1), (65, 2), (200, 4)])
def test_owner_words(max_seqs, words):
    assert make(max_seqs=max_seqs).n_owner_words == words


def test_row_bytes():
    assert make(dtype="float16").row_bytes == 2 * 2 * 8 * 2
    assert make().row_bytes == 2 * 2 * 8 * 4


def test_frozen():
    with pytest.raises(AttributeError):
        make().capacity = 5
