"""CacheConfig validates itself: each bad field gets a ConfigError naming field and bound."""

import dataclasses
import re

import numpy as np
import pytest

from numbakv import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.core.values import short_repr

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
        (dict(windows=5), ["windows", "5"]),
        (dict(windows="0,0"), ["windows", "'0,0'"]),
        (dict(windows=(0, True)), ["windows[1]", "True"]),
        (dict(windows=(0, 2.0)), ["windows[1]", "2.0"]),
        (dict(windows=(0, 2**31)), ["windows[1]", "2147483647"]),
        (dict(n_layers=None), ["n_layers", "None"]),
        (dict(max_width="16"), ["max_width", "'16'"]),
        (dict(max_seqs=np.True_), ["max_seqs", "True"]),
        (dict(capacity=2**31), ["capacity", "2147483647"]),
        (dict(capacity=2**40), ["capacity", "2147483647"]),
        (dict(max_seqs=10**9), ["fixed buffers", "seq_cells 256,000,000,000", "max_seqs"]),
        (dict(capacity=2**30, n_layers=64), ["full pool", "8,796,093,022,208"]),
        (dict(capacity=2**20, max_width=2**16), ["fixed buffers", "masks", "max_width"]),
        (dict(dtype=None), ["dtype", "None"]),
        (dict(n_layers=2**34), ["n_layers", "65536"]),
        (dict(n_kv_heads=2**31), ["n_kv_heads", "2147483647"]),
        (dict(head_dim=2**31), ["head_dim", "2147483647"]),
    ],
)
def test_refusals_name_field_and_bound(overrides, words):
    with pytest.raises(ConfigError) as info:
        make(**overrides)
    for word in words:
        assert word in str(info.value)


NUMPY_NAMES = [("f4", "float32"), ("<f2", "float16"), ("half", "float16"), (np.float32, "float32")]


@pytest.mark.parametrize(("given", "name"), NUMPY_NAMES)
def test_dtype_takes_what_numpy_names(given, name):
    assert make(dtype=given).dtype == name


def test_normalises_types():
    cfg = make(windows=[4, np.int64(0)], dtype=np.float16, capacity=np.int32(32))
    assert cfg.windows == (4, 0)
    assert cfg.dtype == "float16"
    assert type(cfg.capacity) is int
    assert cfg.distinct_windows == (0, 4)


@pytest.mark.parametrize(("max_seqs", "words"), [(1, 1), (64, 1), (65, 2), (200, 4)])
def test_owner_words(max_seqs, words):
    assert make(max_seqs=max_seqs).n_owner_words == words


def test_cell_bytes():
    n_layers = make().n_layers
    assert make(dtype="float16").cell_bytes == n_layers * 2 * 2 * 8 * 2
    assert make(dtype="bfloat16").cell_bytes == n_layers * 2 * 2 * 8 * 2
    assert make().cell_bytes == n_layers * 2 * 2 * 8 * 4


def test_bfloat16_is_kept_as_bit_patterns():
    assert make(dtype="bfloat16").storage_dtype == np.uint16
    assert make(dtype="float16").storage_dtype == np.float16


def test_device_bytes_are_what_the_device_cache_allocates():
    import numbakv

    cfg = make(windows=(0, 4), max_seq_len=32, dtype="bfloat16")
    cache = numbakv.CellCache(cfg)
    sizes = cfg.device_bytes()
    buffers = {name: buf.nbytes for name, buf in cache.buffers.all().items()}
    assert sizes["masks"] == sum(n for name, n in buffers.items() if name.startswith("mask"))
    for name in ("cell_pos", "cell_owners", "seq_cells", "seq_len"):
        assert sizes[name] == buffers[name], name
    assert sizes["step"] == buffers["step"] == 4 * 4 * cfg.max_width  # [4, max_width] int32
    assert "cells" not in buffers and "read_len" not in buffers  # rows of the step buffer
    cache.declare_step([cache.seq_new()] * 16)
    cache.prepare_step()
    assert sizes["pool"] == cache.allocated_bytes * cfg.capacity // cache.rows
    assert sizes["total"] == sum(v for k, v in sizes.items() if k != "total")


def test_the_step_buffer_has_room_for_the_scalars():
    # [4, max(max_width, 2)] int32: the SCALARS row holds the width and read_len
    assert make(max_width=1).device_bytes()["step"] == 4 * 4 * 2
    assert make(max_width=2).device_bytes()["step"] == 4 * 4 * 2
    assert make(max_width=3).device_bytes()["step"] == 4 * 4 * 3


def test_frozen():
    with pytest.raises(AttributeError):
        make().capacity = 5


def test_formats_per_layer_and_per_k_and_v():
    cfg = make(n_layers=3, head_dim=32, dtype="float16", k_dtype="q8_0",
               layer_dtypes=[None, "q4_0", ("fp8_e4m3", "bfloat16")])  # fmt: skip
    assert cfg.formats == (("q8_0", "float16"), ("q4_0", "q4_0"), ("fp8_e4m3", "bfloat16"))
    assert cfg.uniform_dtype is None and make(head_dim=32, dtype="q8_0").uniform_dtype == "q8_0"
    assert make(dtype=np.float16).formats == (("float16", "float16"),) * 2
    assert CacheConfig(**dataclasses.asdict(cfg)) == cfg  # what traces and op logs store


def test_bytes_per_cell_count_the_block_scales():
    per_head = {"float32": 128 * 4, "q8_0": 4 * 34, "q4_0": 4 * 18, "fp8_e4m3": 128}
    for fmt, n in per_head.items():
        cfg = make(head_dim=128, dtype=fmt)
        assert cfg.cell_bytes == 2 * 2 * 2 * n  # layers x K/V x heads
        assert cfg.device_bytes()["pool"] == cfg.capacity * cfg.cell_bytes
    mixed = make(head_dim=128, k_dtype="q8_0", v_dtype="q4_0")
    assert mixed.cell_bytes == 2 * 2 * (4 * 34 + 4 * 18)
    assert make().device_bytes()["fp8_scales"] == 2 * 2 * 2 * 4


def test_fp8_scales_one_or_per_layer_k_v_and_head():
    assert make(fp8_scales=0.5).fp8_scale(1, 1).tolist() == [0.5, 0.5]
    scales = [[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]]
    cfg = make(dtype="fp8_e4m3", fp8_scales=scales)
    assert cfg.fp8_scale(1, 0).tolist() == [5.0, 6.0] and cfg.fp8_scale(0, 1).dtype == np.float32
    assert make().fp8_scale(0, 0).tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (dict(dtype="q8_0"), "head_dim=8"),
        (dict(head_dim=48, v_dtype="q4_0"), "head_dim=48"),
        (dict(layer_dtypes=["float32", ("float16", "q4_0")]), "head_dim=8"),
        (dict(dtype="int8"), "dtype='int8'"),
        (dict(k_dtype="q5_1"), "k_dtype='q5_1'"),
        (dict(layer_dtypes=["float16"]), "n_layers=2"),
        (dict(layer_dtypes="float16"), "n_layers=2"),
        (dict(layer_dtypes=[None, ("float16",)]), "layer_dtypes[1]"),
        (dict(layer_dtypes=[None, ("float16", "fp4")]), "layer_dtypes[1]='fp4'"),
        (dict(fp8_scales=0.0), "fp8_scales=0.0"),
        (dict(fp8_scales=float("nan")), "fp8_scales=nan"),
        (dict(fp8_scales=1e39), "fp8_scales=1e+39"),
        (dict(fp8_scales=True), "fp8_scales"),
        (dict(fp8_scales=[[[1.0] * 3] * 2] * 2), "shape (2, 2, 3)"),
        (dict(fp8_scales=[[[1.0, -1.0]] * 2] * 2), "fp8_scales[0][0][1]=-1.0"),
        (dict(fp8_scales=[[[1.0, 1.0], [1.0, 1.0]]] * 3), "shape (3, 2, 2)"),
    ],
)
def test_bad_formats_and_scales_are_refused_by_name(fields, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        make(**fields)


@pytest.mark.parametrize(
    "value", [3, "x", [1, 2, (3, "a")], {"k": None}, np.int64(7), 2.5, list(range(15))]
)
def test_short_repr_is_repr_when_repr_fits(value):
    assert short_repr(value) == repr(value)


def test_short_repr_cuts_huge_values_to_60_characters():
    for value in (list(range(10**6)), "y" * 10**7, [[[[[[[[1]]]]]]]] * 3, 10**400):
        shown = short_repr(value)
        assert len(shown) <= 60 and shown.endswith("...") == (len(repr(value)) > 60), shown
    assert short_repr(list(range(10**6))).startswith("[0, 1, 2, 3")
    assert short_repr("y" * 10**7) == repr("y" * 57)[:57] + "..."
