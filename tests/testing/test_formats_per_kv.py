"""Formats spelled per K/V and per layer (issue 45): the example caches store what
`k_dtype`/`v_dtype` say, not `dtype`; the kit's default tolerance is that of the loosest
format a config stores; a format that is no format's name is a ConfigError naming the
field."""

import numpy as np
import pytest
from example_caches import load_example, step

from numbakv.core.config import TOLERANCE, CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.testing import Op, run_script

SHAPE = dict(n_layers=2, n_kv_heads=1, head_dim=32, capacity=16, max_width=4, max_seqs=2)
EXAMPLES = [("ring_cache.py", "RingCache"), ("slab_cache.py", "SlabCache"),
            ("paged_cache.py", "PagedCache")]  # fmt: skip


@pytest.mark.parametrize(("file", "name"), EXAMPLES)
def test_an_example_stores_the_format_k_and_v_name(file, name):
    cache_class = getattr(load_example(file), name)
    config = CacheConfig(**SHAPE, k_dtype="float16", v_dtype="float16")  # dtype float32
    ops = [Op("seq_new", ()), step([0, 0, 0]), step([0])]
    # float32 attention over the float16 values the reference stores: the float32 values
    # an example would store if it read `dtype` are ~1e-3 away, 100x the tolerance
    run_script(cache_class, config, ops, tolerance=TOLERANCE["float32"])


def test_the_default_tolerance_is_the_loosest_format_stored():
    assert CacheConfig(**SHAPE).tolerance == TOLERANCE["float32"]
    assert CacheConfig(**SHAPE, v_dtype="float16").tolerance == TOLERANCE["float16"]
    per_layer = CacheConfig(**SHAPE, layer_dtypes=[None, ("q8_0", "bfloat16")])
    assert per_layer.tolerance == TOLERANCE["bfloat16"]
    assert CacheConfig(**SHAPE, k_dtype="float16", v_dtype="float16").storage_dtype == np.float16
    assert per_layer.pool_dtype(1, 0) == np.uint8 and per_layer.pool_dtype(1, 1) == np.uint16


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype", {"names": ["a"], "formats": ["f4"], "offsets": [-5]}),  # NumPy: ValueError
        ("dtype", {"format": "float16"}),
        ("k_dtype", ["float16"]),
        ("v_dtype", b"float16"),
        ("dtype", 16),
    ],
)
def test_a_format_that_is_no_name_is_a_config_error(field, value):
    with pytest.raises(ConfigError, match=f"^{field}="):
        CacheConfig(**SHAPE, **{field: value})


def test_a_layer_format_that_is_no_name_is_a_config_error():
    with pytest.raises(ConfigError, match=r"layer_dtypes\[1\]=b'float16'"):
        CacheConfig(**SHAPE, layer_dtypes=[None, b"float16"])
