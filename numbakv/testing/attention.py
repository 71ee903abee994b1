"""`check_attention`: hold your own attention kernel to numbakv's solo oracle.

`check_attention(fn, layout=...)` builds random, seeded workloads, hands each to `fn` as one
dataclass, and compares every token's output [n_tokens, n_heads, head_dim] with
`numbakv.reference.solo_attention`, which knows nothing of cells or pages. Window W = the W
keys up to and including the token's own position (0 = global); query head h reads KV head
h // (n_heads // n_kv_heads); `scale` is always passed, not always 1/sqrt(head_dim).

    layout="cells": fn(CellsInputs)        layout="paged": fn(PagedInputs)
    q          [n_tokens, n_heads, d] f32  q                [n_tokens, n_heads, d]    f32
    k_pool     [n_cells, n_kv, d] f32|f16  k_cache, v_cache [n_pages, bs, n_kv, d] f32|f16
    v_pool     [n_cells, n_kv, d] f32|f16  block_table      [n_seqs, max_blocks]      i32
    seq_cells  [n_seqs, max_len]      i32  seq_lens         [n_seqs]                  i32
    seq_lens   [n_seqs]               i32  kv_indptr        [n_seqs + 1]              i32
    seq_ids    [n_tokens]             i32  kv_indices       [nnz_pages]               i32
    positions  [n_tokens]             i32  kv_last_page_len [n_seqs]                  i32
    mask       [n_tokens, n_cells]     u8  qo_indptr        [n_seqs + 1]              i32
    window, scale               int, float positions        [n_tokens]                i32
                                           window, scale, block_size     int, float, int

Quantized pools ("q8_0", "q4_0", "fp8_e4m3", docs/contract.md §4.1) are uint8 [..., n_kv,
row_width] of ggml's blocks or e4m3 bytes (scale 1), held to float32 over their values.

Every pool slot no token of the batch may read is NaN (free cells and pages, the tail of
each last page, positions before every window), so a kernel that reads one returns NaN and
fails. Pages and cells lie in random pool order with sequences interleaved; in the cells
layout tokens may be shuffled and padded rows (seq_id -1) must give 0.
"""

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from numbakv.core.config import TOLERANCE
from numbakv.core.formats import ARRAY_DTYPES, row_width
from numbakv.reference import solo_attention
from numbakv.reference.storage import to_float32, to_storage
from numbakv.testing.attention_types import (
    AttentionCase,
    AttentionCheckResult,
    CellsInputs,
    PagedInputs,
)

Layout = Literal["cells", "paged"]
MODES = ("decode", "prefill", "mixed")
WINDOWS = ("global", "W=1", "W=len", "W=len-1", "W=len+1", "random")
ONE = np.ones(1, np.float32)  # fp8's scale, every KV head: a byte is its value
DTYPES = ("float32", "float16", "q8_0", "q4_0", "fp8_e4m3")  # the K/V dtypes of the cases


def _cycle(rng: np.random.Generator, options: Sequence[Any], n: int) -> list[Any]:
    """n picks where each option comes once in every len(options) (shuffled rounds)."""
    rounds = -(-n // len(options))
    return [options[i] for _ in range(rounds) for i in rng.permutation(len(options))][:n]


def _window(kind: str, length: int, rng: np.random.Generator) -> tuple[int, str]:
    """A window at an edge of `length`, and how it was chosen."""
    edges = {"global": 0, "W=1": 1, "W=len": length, "W=len-1": length - 1, "W=len+1": length + 1}
    value = edges[kind] if kind in edges else int(rng.integers(1, length + 1))
    return value, f"{value} ({kind} of len {length})"


def _n_queries(mode: str, length: int, rng: np.random.Generator) -> int:
    if mode == "decode" or length == 1 or (mode == "mixed" and rng.random() < 0.5):
        return 1
    return length if rng.random() < 0.25 else int(rng.integers(2, length + 1))


def attention_cases(
    *,
    layout: Layout = "cells",
    block_size: int = 16,
    n_cases: int = 48,
    seed: int = 0,
    head_dim: int = 32,
    gqa: Sequence[int] = (1, 2, 4, 8),
    dtypes: Sequence[str] = ("float32", "float16"),
    modes: Sequence[str] = MODES,
    padding: bool = True,
    tolerance: float | None = None,
) -> list[AttentionCase]:
    """The workloads `check_attention` runs (same arguments), to rerun a failing case alone."""
    if layout not in ("cells", "paged"):
        raise ValueError(f"layout must be 'cells' or 'paged', not {layout!r}")
    if min(block_size, n_cases, head_dim, *gqa, 1 if gqa and dtypes and modes else 0) < 1:
        raise ValueError("need positive block_size, n_cases, head_dim, gqa; non-empty lists")
    if bad := [d for d in dtypes if d not in DTYPES] + [m for m in modes if m not in MODES]:
        raise ValueError(f"unknown {bad}: dtypes from {list(DTYPES)}, modes from {MODES}")
    rng = np.random.default_rng(seed)
    lengths = sorted({n for n in (1, 2, block_size - 1, block_size, block_size + 1) if n >= 1})
    lengths += [2 * block_size, 2 * block_size + 1, 3 * block_size - 1]
    options = (dtypes, gqa, modes, WINDOWS)
    picks = zip(*(_cycle(rng, list(o), n_cases) for o in options), strict=True)
    cases = []
    for index, (dtype, group, mode, window_kind) in enumerate(picks):
        n_seqs = int(rng.integers(1, 5))
        seq_lens = [int(rng.choice(lengths)) for _ in range(n_seqs)]
        seq_lens = [
            n if rng.random() < 0.75 else int(rng.integers(1, 4 * block_size)) for n in seq_lens
        ]
        window, window_label = _window(window_kind, seq_lens[rng.integers(n_seqs)], rng)
        n_kv_heads = int(rng.integers(1, 3))
        n_heads = group * n_kv_heads
        off = rng.uniform(1.25, 2) ** rng.choice([-1, 1]) if rng.random() < 0.5 else 1
        scale = float(off / np.sqrt(head_dim))  # 1/sqrt(head_dim), or 1.25-2x off it
        n_q = [_n_queries(mode, n, rng) for n in seq_lens]
        rtol = TOLERANCE[dtype] if tolerance is None else tolerance
        world = _World(rng, seq_lens, n_q, window, n_heads, n_kv_heads, head_dim, dtype, scale)
        pad = padding and layout == "cells" and rng.random() < 0.5
        build = _cells if layout == "cells" else _paged
        inputs = build(world, rng, block_size, int(rng.integers(1, 4)) if pad else 0)
        seq_ids = np.array(getattr(inputs, "seq_ids", np.repeat(np.arange(n_seqs), n_q)))
        positions = inputs.positions.copy()  # fn may write its inputs
        expected = np.zeros(np.shape(inputs.q), dtype=np.float32)
        for s in range(n_seqs):
            rows = np.flatnonzero(seq_ids == s)
            expected[rows] = solo_attention(
                inputs.q[rows], world.k[s], world.v[s], positions[rows], window, scale
            )
        label = (
            f"case {index}: layout={layout!r}, block_size={block_size}, window={window_label}, "
            f"gqa={group} (n_heads={n_heads}, n_kv_heads={n_kv_heads}), head_dim={head_dim}, "
            f"dtype={dtype}, scale={scale:.6g}, mode={mode}, seq_lens={seq_lens}, "
            f"queries per seq={n_q}, padded rows={len(seq_ids) - sum(n_q)}"
        )
        tol = rtol * max(1.0, world.vmax)
        cases.append(AttentionCase(index, inputs, expected, tol, seq_ids, positions, label))
    return cases


class _World:
    """Each sequence's K/V by position ([length, n_kv_heads, head_dim] float32 of values the
    storage dtype holds, NaN where no query's window reaches) and its queries."""

    def __init__(self, rng, seq_lens, n_q, window, n_heads, n_kv_heads, head_dim, dtype, scale):
        self.seq_lens, self.n_q, self.window, self.dtype = seq_lens, n_q, window, dtype
        self.scale = scale
        self.k, self.v, self.q, self.stored = [], [], [], []  # stored: (K, V) as the pool holds
        for length, count in zip(seq_lens, n_q, strict=True):
            k, v = rng.standard_normal((2, length, n_kv_heads, head_dim)).astype(np.float32)
            first_read = max(0, length - count - window + 1) if window > 0 else 0
            k[:first_read] = v[:first_read] = np.nan
            self.stored.append(tuple(to_storage(x, dtype, ONE) for x in (k, v)))
            self.k.append(to_float32(self.stored[-1][0], dtype, ONE))
            self.v.append(to_float32(self.stored[-1][1], dtype, ONE))
            self.q.append(rng.standard_normal((count, n_heads, head_dim)).astype(np.float32))
        self.vmax = float(max(np.nanmax(np.abs(v)) for v in self.v))  # each has a read key
        self.slot_shape = (n_kv_heads, row_width(dtype, head_dim))

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        """A pool of slots that read NaN: NaN floats, or 0xFF bytes (a NaN scale or e4m3 NaN)."""
        dtype = ARRAY_DTYPES[self.dtype]
        return np.full(shape, 0xFF if dtype == np.uint8 else np.nan, dtype=dtype)

    def queries(self) -> list[tuple[int, int, np.ndarray]]:
        """(sequence, position, q [n_heads, head_dim]) of every query, sequence-major."""
        return [
            (s, length - count + i, self.q[s][i])
            for s, (length, count) in enumerate(zip(self.seq_lens, self.n_q, strict=True))
            for i in range(count)
        ]


def _cells(world: _World, rng: np.random.Generator, block_size: int, n_pad: int) -> CellsInputs:
    del block_size  # cells have no blocks; block_size only sets the lengths
    total = sum(world.seq_lens)
    n_cells = total + int(rng.integers(1, 8))
    cell_of = rng.permutation(n_cells - 1)[:total].astype(np.int32)  # last cell stays free
    k_pool = world.empty((n_cells, *world.slot_shape))
    v_pool = k_pool.copy()
    seq_cells = np.full((len(world.seq_lens), max(world.seq_lens)), -1, dtype=np.int32)
    for s, own in enumerate(np.split(cell_of, np.cumsum(world.seq_lens)[:-1])):
        seq_cells[s, : len(own)] = own
        k_pool[own], v_pool[own] = world.stored[s]
    queries = world.queries()
    if rng.random() < 0.5:
        queries = [queries[i] for i in rng.permutation(len(queries))]
    n_heads = world.q[0].shape[1]
    pad_q = rng.standard_normal((n_pad, n_heads, world.q[0].shape[2])).astype(np.float32)
    queries += [(-1, -1, pad_q[i]) for i in range(n_pad)]
    mask = np.zeros((len(queries), n_cells), dtype=np.uint8)
    for t, (s, p, _) in enumerate(queries):
        if s >= 0:
            first = max(0, p - world.window + 1) if world.window > 0 else 0
            mask[t, seq_cells[s, first : p + 1]] = 1
    return CellsInputs(
        q=np.stack([q for _, _, q in queries]),
        k_pool=k_pool,
        v_pool=v_pool,
        seq_cells=seq_cells,
        seq_lens=np.array(world.seq_lens, dtype=np.int32),
        seq_ids=np.array([s for s, _, _ in queries], dtype=np.int32),
        positions=np.array([p for _, p, _ in queries], dtype=np.int32),
        mask=mask,
        window=world.window,
        scale=world.scale,
    )


def _paged(world: _World, rng: np.random.Generator, block_size: int, n_pad: int) -> PagedInputs:
    del n_pad  # a paged batch has no padding
    n_blocks = [-(-n // block_size) for n in world.seq_lens]
    used = sum(n_blocks)
    n_pages = used + int(rng.integers(1, 4))
    pages = rng.permutation(n_pages).astype(np.int32)  # pages[:used] in use, shuffled
    shape = (n_pages, block_size, *world.slot_shape)
    k_cache = world.empty(shape)
    v_cache = k_cache.copy()
    block_table = np.full((len(n_blocks), max(n_blocks) + 1), pages[used], dtype=np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(n_blocks)]).astype(np.int32)
    for s, length in enumerate(world.seq_lens):
        own = pages[kv_indptr[s] : kv_indptr[s + 1]]
        block_table[s, : len(own)] = own
        pos = np.arange(length)
        k_cache[own[pos // block_size], pos % block_size] = world.stored[s][0]
        v_cache[own[pos // block_size], pos % block_size] = world.stored[s][1]
    queries = world.queries()
    seq_lens = np.array(world.seq_lens, dtype=np.int32)
    return PagedInputs(
        q=np.stack([q for _, _, q in queries]),
        k_cache=k_cache,
        v_cache=v_cache,
        block_table=block_table,
        seq_lens=seq_lens,
        kv_indptr=kv_indptr,
        kv_indices=pages[:used].copy(),
        kv_last_page_len=(seq_lens - (np.array(n_blocks) - 1) * block_size).astype(np.int32),
        qo_indptr=np.concatenate([[0], np.cumsum(world.n_q)]).astype(np.int32),
        positions=np.array([p for _, p, _ in queries], dtype=np.int32),
        window=world.window,
        scale=world.scale,
        block_size=block_size,
    )


def _compare(case: AttentionCase, out: ArrayLike, seed: int, how: str) -> tuple[float, float]:
    """(max abs error, max error / tolerance), or AssertionError naming the worst token."""
    got = np.asarray(out)
    if got.shape != case.expected.shape:
        raise AssertionError(
            f"check_attention {case.label}\n  fn returned shape {got.shape}, "
            f"expected {case.expected.shape} [n_tokens, n_heads, head_dim]"
        )
    got = got.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(np.isfinite(got), np.abs(got - case.expected), np.inf)
    worst = float(err.max())
    if worst <= case.tolerance:
        return worst, worst / case.tolerance
    t, h, d = np.unravel_index(int(np.argmax(err)), err.shape)
    bad_tokens = int((err > case.tolerance).any(axis=(1, 2)).sum())
    s, p = int(case.seq_ids[t]), int(case.positions[t])
    where = "padding, must be 0" if s < 0 else f"sequence {s}, position {p}"
    with np.printoptions(precision=5, suppress=True, threshold=16, edgeitems=4, linewidth=10**4):
        raise AssertionError(
            f"check_attention {case.label}\n"
            f"  worst token {t} ({where}), head {h}, dim {d}: expected "
            f"{case.expected[t, h, d]:.6g}, got {got[t, h, d]:.6g}; max abs error {worst:.3g} "
            f"(tolerance {case.tolerance:.3g}); {bad_tokens} of {len(err)} tokens wrong\n"
            f"  expected[{t}, {h}] = {case.expected[t, h]}\n"
            f"  got[{t}, {h}]      = {got[t, h]}\n"
            f"  rerun it: attention_cases({how}, seed={seed})[{case.index}]"
        )


def check_attention(
    fn: Callable[[Any], ArrayLike],
    *,
    layout: Layout = "cells",
    block_size: int = 16,
    n_cases: int = 48,
    seed: int = 0,
    head_dim: int = 32,
    gqa: Sequence[int] = (1, 2, 4, 8),
    dtypes: Sequence[str] = ("float32", "float16"),
    modes: Sequence[str] = MODES,
    padding: bool = True,
    tolerance: float | None = None,
) -> AttentionCheckResult:
    """Run `fn` on `n_cases` random workloads and hold each token's output to the solo oracle.

    fn         : takes `CellsInputs` (layout "cells") or `PagedInputs` (layout "paged") and
                 returns [n_tokens, n_heads, head_dim] (anything `np.asarray` takes)
    block_size : page size (paged); the length scale lengths straddle (both layouts)
    head_dim   : fixed for every case; n_heads = ratio * n_kv_heads, n_kv_heads 1 or 2
    gqa        : the n_heads / n_kv_heads ratios to cover
    dtypes     : K/V storage dtypes to cover, of "float32", "float16", "q8_0", "q4_0" and
                 "fp8_e4m3" (quantized: head_dim a multiple of 32, pools of bytes)
    modes      : "decode" (one query per sequence), "prefill" (a chunk of consecutive
                 queries ending at the sequence's end), "mixed" (each sequence either)
    padding    : cells only: some cases end with padded rows (seq_id -1), which must give 0
    tolerance  : the absolute tolerance as a fraction of max(1, max |V|); by default
                 `numbakv.core.config.TOLERANCE[dtype]` (1e-5 for float32, 2e-3 for float16: a
                 kernel may compute in its K/V's precision; the output is a convex
                 combination of V)

    Raises AssertionError at the first case with a token past tolerance (a NaN or inf where
    the oracle is finite counts), naming the case, the worst token, expected and got.
    """
    options = dict(
        layout=layout, block_size=block_size, n_cases=n_cases, head_dim=head_dim, gqa=tuple(gqa)
    )
    options.update(dtypes=tuple(dtypes), modes=tuple(modes), padding=padding, tolerance=tolerance)
    how = ", ".join(f"{k}={v!r}" for k, v in options.items())
    worst = (0.0, 0.0, "")
    tokens = 0
    for case in attention_cases(seed=seed, **options):
        error, ratio = _compare(case, fn(case.inputs), seed, how)
        tokens += len(case.expected)
        if ratio >= worst[1]:
            worst = (error, ratio, case.label)
    return AttentionCheckResult(layout, n_cases, tokens, *worst)
