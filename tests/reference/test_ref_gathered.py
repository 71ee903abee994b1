"""Gathered attention in the reference: each token reads its own sequence's cells of its
window in position order (`CellTable.cells_of`, `attention.attend_gathered`), with no
[width x read_len] mask.

On random workloads (decodes, chunked prefills mixed with decodes, clones at any upto,
rewinds, removals, padding, windows 1, 2, odd, even and wider than any history, GQA 1/2/4,
float32, float16 and bfloat16 storage, ids past 63) it must equal the masked mode and
solo attention over each sequence's own history, while every cell a token must not see is
NaN or another sequence's values: the pool is allocated NaN-filled (free cells and rows past
read_len stay NaN until written) and one sequence always writes NaN K/V (foreign cells, and
free cells once it rewinds or leaves). A gathered attend computes no mask.

Tolerance. Both modes read the same keys with the same scores; gathered sums the softmax
normaliser and the weighted V in position order, masked in cell order, so they differ only
by float32 rounding of a reordered sum: at most n·u·Σ|w·v| ≲ n·u·max|v| for n keys
(u = 2⁻²⁴ ≈ 6e-8). With n ≤ 64 (capacity ≤ 64) and standard-normal V (|v| ≲ 5 here)
that is ≤ 2e-5 in the worst case and ~√n·u·max|v| ≈ 2.4e-6 typically (seen: ≤ 4e-7 over
3 800 random steps), so ORDER_TOL is 1e-5 absolute and relative, the solo oracle's TOL
(which also sums in its own order, per head). A wrong cell, window edge or owner is off by
O(1), far past either.
"""

from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numbakv.core.calls import default_scale
from numbakv.reference import CellCache, solo_attention
from numbakv.reference import step as step_module
from numbakv.reference.attention import attend_gathered
from numbakv.reference.step import window_mask

from helpers import as_stored, churn, small_config, step_with
from workload_model import TOL, configs

ORDER_TOL = dict(rtol=1e-5, atol=1e-5)  # see the module docstring
BF16_NAN = 0x7FC0  # the quiet bfloat16 NaN, as a uint16 pattern


def nan_allocator(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Pool storage that is NaN until written (uint16 storage holds bfloat16 patterns)."""
    dtype = np.dtype(dtype)
    return np.full(shape, BF16_NAN if dtype == np.uint16 else np.nan, dtype=dtype)


def no_mask(*args):
    raise AssertionError("a gathered attend computed a mask")


class Workload:
    """One reference cache and each live sequence's K/V history by position, per layer, as
    stored (float32); the tokens of sequence `poisoner` write NaN K/V."""

    def __init__(self, config, n_heads: int):
        self.cfg, self.n_heads = config, n_heads
        self.cache = CellCache(config, allocator=nan_allocator)
        self.hist: dict[int, list[list[tuple[np.ndarray, np.ndarray]]]] = {}
        self.poisoner: int | None = self.new()

    def new(self) -> int:
        seq = self.cache.seq_new()
        self.hist[seq] = [[] for _ in range(self.cfg.n_layers)]
        return seq

    def clone(self, src: int, upto: int) -> None:
        seq = self.cache.seq_clone(src, upto)
        self.hist[seq] = [layer[:upto] for layer in self.hist[src]]

    def rewind(self, seq: int, position: int) -> None:
        self.cache.rewind(seq, position)
        self.hist[seq] = [layer[:position] for layer in self.hist[seq]]

    def rm(self, seq: int) -> None:
        self.cache.seq_rm(seq)
        del self.hist[seq]
        if seq == self.poisoner:
            self.poisoner = None

    def step(self, seq_ids: list[int], width: int | None, rng: np.random.Generator) -> None:
        """One step through every layer: gathered (with no mask computed) equals masked and
        the solo oracle; padded rows give exactly 0."""
        cfg, cache = self.cfg, self.cache
        cache.declare_step(seq_ids)
        step = cache.prepare_step(width)
        width, n = step.width, len(seq_ids)
        positions = step.positions
        is_poison = np.array([s == self.poisoner for s in seq_ids] + [False] * (width - n))
        for layer, window in enumerate(cfg.windows):
            k, v = (rng.standard_normal((width, cfg.n_kv_heads, cfg.head_dim), np.float32)
                    for _ in "kv")  # fmt: skip
            k[is_poison] = v[is_poison] = np.nan
            q = rng.standard_normal((width, self.n_heads, cfg.head_dim), dtype=np.float32)
            cache.write(layer, k, v)
            stored_k, stored_v = as_stored(k, cfg.dtype), as_stored(v, cfg.dtype)
            for t, seq in enumerate(seq_ids):
                self.hist[seq][layer].append((stored_k[t], stored_v[t]))
            # reference, both modes
            with mock.patch.object(step_module, "window_mask", no_mask):
                got = cache.attend(layer, q, mode="gathered")
            masked = cache.attend(layer, q, mode="masked")
            # compare: the two modes
            assert got.dtype == np.float32 and got.shape == q.shape
            assert (got[n:] == 0).all() and (masked[n:] == 0).all(), "padding attends nothing"
            np.testing.assert_allclose(got, masked, **ORDER_TOL, err_msg=f"layer {layer}")
            # compare: the solo oracle, each sequence over its own history
            for seq in set(seq_ids) - {self.poisoner}:
                rows = [t for t, s in enumerate(seq_ids) if s == seq]
                k_hist, v_hist = (np.stack(h) for h in zip(*self.hist[seq][layer], strict=True))
                expect = solo_attention(q[rows], k_hist, v_hist, positions[rows], window)
                np.testing.assert_allclose(
                    got[rows], expect, **TOL, err_msg=f"layer {layer} window {window} seq {seq}"
                )


OPS = ("new", "clone", "rewind", "rm", "decode", "prefill", "prefill")


def run_op(work: Workload, data) -> None:
    """One random op of the workload, drawn against its current state."""
    cache, cfg = work.cache, work.cfg
    live = cache.live_seqs
    op = data.draw(st.sampled_from(OPS), label="op")
    if op == "new" or not live:
        if len(live) < cfg.max_seqs:
            seq = work.new()
            if work.poisoner is None:
                work.poisoner = seq
        return
    seq = data.draw(st.sampled_from(live), label="seq")
    if op == "clone":
        if len(live) < cfg.max_seqs and seq != work.poisoner:
            work.clone(seq, data.draw(st.integers(0, cache.pos(seq)), label="upto"))
    elif op == "rewind":
        work.rewind(seq, data.draw(st.integers(0, cache.pos(seq)), label="position"))
    elif op == "rm":
        work.rm(seq)
    else:
        limit = min(cfg.max_width, cache.free_cells)
        if limit == 0:
            return
        if op == "decode":  # one token each of some sequences
            seq_ids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=limit,
                                         unique=True), label="decodes")  # fmt: skip
        else:  # a chunk of one sequence's prefill, with decodes of others, in any order
            chunk = [seq] * data.draw(st.integers(1, limit), label="chunk")
            others = st.sampled_from([s for s in live if s != seq] or [seq])
            decodes = data.draw(st.lists(others, max_size=limit - len(chunk), unique=True))
            seq_ids = data.draw(st.permutations(chunk + [s for s in decodes if s != seq]))
        n = len(seq_ids)
        width = data.draw(st.one_of(st.none(), st.integers(n, cfg.max_width)), label="width")
        work.step(seq_ids, width, np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
    HealthCheck.data_too_large]
)  # fmt: skip
@given(st.sampled_from((4, 65)).flatmap(configs), st.integers(1, 40), st.data())
def test_gathered_equals_masked_and_solo(config_heads, n_ops, data):
    config, n_heads = config_heads
    work = Workload(config, n_heads)
    if config.max_seqs > 64:  # ids past 63 (the second owner word) carry tokens
        for _ in range(62):
            work.new()
    for _ in range(n_ops):
        run_op(work, data)
        work.cache.check_invariants()


def test_gathered_attend_computes_no_mask():
    cache = CellCache(small_config(windows=(0, 2, 3), n_layers=3))
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, b, a, a])
    cache.rewind(a, 1)  # a hole below read_len: a's cells leave position order
    step = step_with(cache, [b, a, a, b, a], width=7)
    shape = (7, 1, 4)
    calls = []
    counting = lambda *args: calls.append(args[-1]) or window_mask(*args)  # noqa: E731
    with mock.patch.object(step_module, "window_mask", counting):
        for layer in range(3):
            cache.write(layer, np.ones(shape), np.ones(shape))
            cache.attend(layer, np.ones(shape), mode="gathered")
        assert calls == [], "gathered attention computed a mask"
        step.mask(2)  # still computed on first read
        step.mask(2)  # and kept
        cache.attend(2, np.ones(shape), mode="masked")  # window 3
        assert calls == [2, 3]


def seen_cells(snap, seq: int, p: int, window: int) -> list[int]:
    """Cells token (seq, p) sees, by position, from a snapshot in plain Python."""
    first = max(0, p - window + 1) if window > 0 else 0
    by_pos = {int(snap.pos[c]): c for c in range(snap.read_len) if seq in snap.owners_of(c)}
    return [by_pos[i] for i in range(first, p + 1)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 200), max_size=30), st.lists(st.integers(0, 7), min_size=1,
       max_size=8), st.sampled_from((0, 1, 2, 3, 100)), st.integers(0, 2**32 - 1))  # fmt: skip
def test_gathered_reads_only_what_a_token_sees(ops, picks, window, seed):
    """Every row but a token's own cells of its window NaN (free, foreign, its own outside
    the window, past read_len): the token's output is exactly the cache's gathered one."""
    cfg = small_config(windows=(window,), n_layers=1, n_kv_heads=2, head_dim=4)
    cache = CellCache(cfg)
    churn(cache, ops)
    live = cache.live_seqs or [cache.seq_new()]
    ids = [live[p % len(live)] for p in picks][: min(cfg.max_width, cache.free_cells)]
    if not ids:
        return
    step = step_with(cache, ids, width=cfg.max_width)
    rng = np.random.default_rng(seed)
    kv_shape = (cfg.max_width, cfg.n_kv_heads, cfg.head_dim)
    k, v = rng.standard_normal(kv_shape), rng.standard_normal(kv_shape)
    q = rng.standard_normal((cfg.max_width, 4, cfg.head_dim)).astype(np.float32)
    cache.write(0, k, v)
    # reference
    got = cache.attend(0, q, mode="gathered")
    # oracle: per token, a pool where every other row is NaN, and its cells from the snapshot
    snap, scale = cache.snapshot(), default_scale(cfg.head_dim)
    for t, (seq, p) in enumerate(zip(step.seq_ids.tolist(), step.positions.tolist(), strict=True)):
        if seq < 0:
            assert (got[t] == 0).all()
            continue
        cells = seen_cells(snap, seq, p, window)
        k_pool, v_pool = (np.full_like(x, np.nan) for x in cache.pool_kv(0))
        k_pool[cells], v_pool[cells] = (x[cells] for x in cache.pool_kv(0))
        seq_cells = {seq: np.full(cache.pos(seq), len(k_pool))}  # outside: an IndexError
        seq_cells[seq][p + 1 - len(cells) : p + 1] = cells
        expect = attend_gathered(q[t : t + 1], k_pool, v_pool, seq_cells, np.array([seq]),
                                 np.array([p]), window, scale)  # fmt: skip
        # compare
        np.testing.assert_array_equal(got[t], expect[0], err_msg=f"token {t}")
