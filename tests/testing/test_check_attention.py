"""`numbakv.testing.check_attention` on NumPy kernels written as a user would: a correct paged
and a correct cell-layout attention pass, planted bugs fail with the worst token named."""

import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest

from numbakv.testing.attention import attention_cases, check_attention
from numbakv.testing.attention_types import AttentionCheckResult, CellsInputs, PagedInputs

FAST = {"block_size": 4, "n_cases": 24, "head_dim": 8}


def attend(q, k, v, scale, kv_head, half=False):
    """[n_heads, head_dim] float32 softmax attention of one token over k, v [n, n_kv, d];
    `half` rounds q and the weights to float16 first, as a tensor-core kernel would."""
    f16 = (lambda x: x.astype(np.float16).astype(np.float32)) if half else (lambda x: x)
    scores = np.einsum("hd,nhd->hn", f16(q), k[:, kv_head]) * np.float32(scale)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return np.einsum("hn,nhd->hd", f16(weights), v[:, kv_head])


def kv_heads(n_heads, n_kv_heads, bug):
    if bug == "gqa_mod":
        return np.arange(n_heads) % n_kv_heads
    return np.arange(n_heads) // (n_heads // n_kv_heads)


def window_start(p, window, bug):
    first = max(0, p - window + 1) if window > 0 else 0
    return max(0, first - 1) if bug == "window" else first


def paged_attention(x: PagedInputs, bug: str | None = None) -> np.ndarray:
    """FlashInfer-style: pages from kv_indptr/kv_indices, length from kv_last_page_len."""
    _, n_heads, head_dim = x.q.shape
    kv_head = kv_heads(n_heads, x.k_cache.shape[2], bug)
    scale = 1 / np.sqrt(head_dim) if bug == "scale" else x.scale
    out = np.zeros(x.q.shape, np.float32)
    for s in range(len(x.qo_indptr) - 1):
        pages = x.kv_indices[x.kv_indptr[s] : x.kv_indptr[s + 1]]
        full = len(pages) * x.block_size
        length = full if bug == "last_page_len" else full - x.block_size + x.kv_last_page_len[s]
        k = x.k_cache[pages].reshape(full, *x.k_cache.shape[2:]).astype(np.float32)
        v = x.v_cache[pages].reshape(full, *x.v_cache.shape[2:]).astype(np.float32)
        first_q, end_q = x.qo_indptr[s], x.qo_indptr[s + 1]
        for t in range(first_q, end_q):
            p = length - (end_q - t)
            end = full if bug == "whole_page" else p + 1
            first = window_start(p, x.window, bug)
            out[t] = attend(x.q[t], k[first:end], v[first:end], scale, kv_head, bug == "fp16")
    return out


def cells_attention(x: CellsInputs, bug: str | None = None) -> np.ndarray:
    """Each token gathers its sequence's cells of positions in its window."""
    _, n_heads, head_dim = x.q.shape
    kv_head = kv_heads(n_heads, x.k_pool.shape[1], bug)
    scale = 1 / np.sqrt(head_dim) if bug == "scale" else x.scale
    out = np.zeros(x.q.shape, np.float32)
    for t, (s, p) in enumerate(zip(x.seq_ids, x.positions, strict=True)):
        if s < 0 and bug != "padding":
            continue
        cells = x.seq_cells[s, window_start(p, x.window, bug) : p + 1]
        k, v = x.k_pool[cells].astype(np.float32), x.v_pool[cells].astype(np.float32)
        out[t] = attend(x.q[t], k, v, scale, kv_head) if len(cells) else np.nan
    return out


def masked_attention(x: CellsInputs) -> np.ndarray:
    """The mask form: one dense masked softmax over every cell, padded rows zeroed."""
    _, n_heads, _ = x.q.shape
    kv_head = kv_heads(n_heads, x.k_pool.shape[1], None)
    k = np.nan_to_num(x.k_pool.astype(np.float32)[:, kv_head])  # [n_cells, n_heads, d]
    v = np.nan_to_num(x.v_pool.astype(np.float32)[:, kv_head])
    scores = np.einsum("thd,chd->thc", x.q, k) * np.float32(x.scale)
    scores = np.where(x.mask[:, None, :] == 1, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - scores.max(axis=2, keepdims=True))
        weights /= weights.sum(axis=2, keepdims=True)
    out = np.einsum("thc,chd->thd", np.nan_to_num(weights), v)
    return np.where(x.mask.any(axis=1)[:, None, None], out, 0).astype(np.float32)


@pytest.mark.parametrize("layout", ["cells", "paged"])
def test_correct_kernels_pass_the_defaults(layout):
    fn = cells_attention if layout == "cells" else paged_attention
    result = check_attention(fn, layout=layout, n_cases=24)
    assert isinstance(result, AttentionCheckResult)
    assert result.cases == 24 and result.layout == layout and result.tokens > 24
    assert result.worst_ratio <= 1 and result.worst_case.startswith("case ")


def test_the_mask_form_passes():
    check_attention(masked_attention, layout="cells", **FAST)


def test_fp16_arithmetic_is_within_the_float16_tolerance():
    """q and the weights rounded to float16 (not a bug): inside the float16 tolerance."""
    fp16 = check_attention(
        lambda x: paged_attention(x, "fp16"), layout="paged", dtypes=("float16",), head_dim=128
    )
    assert 0.01 < fp16.worst_ratio < 0.5


WORST = re.compile(r"worst token (\d+) \(sequence (\d+), position (\d+)\), head (\d+)")


def caught(fn, layout, **options):
    """The AssertionError's message, checked to name a token that is really wrong."""
    with pytest.raises(AssertionError) as info:
        check_attention(fn, layout=layout, **{**FAST, **options})
    message = str(info.value)
    assert f"layout={layout!r}" in message and "max abs error" in message
    match = WORST.search(message)
    assert match, message
    token, seq, position, head = map(int, match.groups())
    index = int(re.search(r"\)\[(\d+)\]$", message).group(1))
    case = attention_cases(layout=layout, **{**FAST, **options})[index]
    assert (case.seq_ids[token], case.positions[token]) == (seq, position)
    got = np.asarray(fn(case.inputs))[token, head]
    assert not np.allclose(got, case.expected[token, head], atol=case.tolerance), message
    return message


BUGS = [
    ("window", "cells"),
    ("window", "paged"),
    ("whole_page", "paged"),
    ("gqa_mod", "paged"),
    ("gqa_mod", "cells"),
    ("scale", "paged"),
    ("last_page_len", "paged"),
]


@pytest.mark.parametrize(("bug", "layout"), BUGS)
def test_planted_bugs_are_caught(bug, layout):
    kernel = cells_attention if layout == "cells" else paged_attention
    message = caught(lambda x: kernel(x, bug), layout)
    if bug in ("whole_page", "last_page_len"):
        assert "got nan" in message  # the poisoned tail of the last page


def test_padding_is_named_as_such():
    with pytest.raises(AssertionError, match=r"worst token \d+ \(padding, must be 0\)"):
        check_attention(lambda x: cells_attention(x, "padding"), layout="cells", **FAST)


def test_nan_where_the_oracle_is_finite_fails():
    def one_nan(x):
        out = paged_attention(x)
        out[-1, 0, 0] = np.nan
        return out

    message = caught(one_nan, "paged")
    assert "got nan" in message and "max abs error inf" in message


def test_wrong_shape_and_lists_are_handled():
    with pytest.raises(AssertionError, match="fn returned shape"):
        check_attention(lambda x: paged_attention(x)[:, :1], layout="paged", **FAST)
    check_attention(lambda x: paged_attention(x).tolist(), layout="paged", **FAST)


def test_workloads_cover_the_edges():
    cases = attention_cases(layout="paged", block_size=4, n_cases=48)
    labels = " ".join(c.label for c in cases)
    for needle in [
        "(global",
        "(W=1 ",
        "(W=len ",
        "(W=len-1 ",
        "(W=len+1 ",
        "gqa=8",
        "float16",
        "decode",
    ]:
        assert needle in labels
    assert any(len(c.inputs.qo_indptr) > 2 for c in cases)
    for case in cases:
        x = case.inputs
        assert x.q.dtype == np.float32 and x.kv_indices.dtype == np.int32
        used = np.zeros(len(x.k_cache), bool)
        used[x.kv_indices] = True
        assert np.isnan(x.k_cache[~used]).all()  # unused pages are poison
        assert len(set(x.kv_indices.tolist())) == len(x.kv_indices)


def test_cases_are_seeded():
    a, b = (attention_cases(layout="cells", seed=3, **FAST)[5] for _ in range(2))
    assert a.label == b.label and np.array_equal(a.expected, b.expected)
    assert attention_cases(layout="cells", seed=4, **FAST)[5].label != a.label


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="layout"):
        check_attention(paged_attention, layout="ring")
    with pytest.raises(ValueError, match="bfloat16"):
        check_attention(paged_attention, layout="paged", dtypes=("bfloat16",))


def dequantized(fn, fmt: str, bug: str | None = None):
    """`fn` over float pools made from the quantized pools it is handed, by a dequantizer
    written here as a user would (ggml's block layout); bug "nibbles": q4_0 read as
    adjacent pairs, "q8_signed": q8_0 codes read unsigned."""

    def values(pool: np.ndarray) -> np.ndarray:
        lead, width = pool.shape[:-1], pool.shape[-1]
        if fmt == "fp8_e4m3":
            return pool.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        size = 34 if fmt == "q8_0" else 18
        blocks = pool.reshape(*lead, width // size, size)
        d = blocks[..., :2].copy().view(np.float16).astype(np.float32)
        if fmt == "q8_0":
            codes = blocks[..., 2:].astype(np.float32) if bug == "q8_signed" else (
                blocks[..., 2:].view(np.int8).astype(np.float32))  # fmt: skip
        else:
            low, high = blocks[..., 2:] & 15, blocks[..., 2:] >> 4
            pairs = np.stack([low, high], axis=-1).reshape(*low.shape[:-1], 32)
            codes = (pairs if bug == "nibbles" else np.concatenate([low, high], axis=-1)) - 8.0
        return (codes * d).reshape(*lead, -1).astype(np.float32)

    def kernel(x):
        names = ("k_pool", "v_pool") if isinstance(x, CellsInputs) else ("k_cache", "v_cache")
        return fn(dataclasses.replace(x, **{n: values(getattr(x, n)) for n in names}))

    return kernel


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "fp8_e4m3"])
@pytest.mark.parametrize("layout", ["cells", "paged"])
def test_quantized_pools_are_held_to_float32_over_their_values(fmt, layout):
    fn = cells_attention if layout == "cells" else paged_attention
    options = dict(layout=layout, n_cases=12, block_size=4, dtypes=(fmt,))
    result = check_attention(dequantized(fn, fmt), **options)
    assert result.worst_ratio <= 1
    case = attention_cases(**options)[0]
    pool = case.inputs.k_pool if layout == "cells" else case.inputs.k_cache
    assert pool.dtype == np.uint8 and pool.shape[-1] == {"q8_0": 34, "q4_0": 18}.get(fmt, 32)
    bug = {"q8_0": "q8_signed", "q4_0": "nibbles"}.get(fmt)
    if bug:
        with pytest.raises(AssertionError, match="case"):
            check_attention(dequantized(fn, fmt, bug), **options)
