"""Attention kernels against the reference cache and the solo oracle, on the simulator or a GPU.

Each case builds a table with the reference `CellCache` (new sequences, prefills, a clone
sharing a prefix, a removal whose holes refill, a rewind), writes random K/V through it,
then uploads its pool, its step's masks and a position -> cell table to the device and
runs the launchers. Everything a kernel must not read is poisoned first: NaN in every pool
row past read_len and in every free cell, 1s in the mask outside the written region,
foreign cell ids and -7 in seq_cells past each sequence's length, live-looking junk in the
step buffer's columns past the width, and a sentinel in `out` rows past the width. Tests
read `# reference`, `# device`, `# compare`.
"""

import dataclasses

import numpy as np
import pytest

from numbakv.cache.cuda import IS_SIMULATOR
from numbakv.cache.kernels.attention import (
    DECODE_MAX_WIDTH,
    HEAD_DIM_MAX,
    MAX_SPLITS,
    MIN_SPLIT_CELLS,
    PREFILL_TILE,
    AttentionPlan,
    choose_splits,
    decode,
    decode_width_limit,
    is_decode_shape,
    launch_attend_gathered,
    launch_attend_masked,
    plan_attention,
    run_attention,
    split_workspace,
    tiles,
)
from numbakv.cache.kernels.attention import launch as attention_launch
from numbakv.cache.kernels.attention.merge import merge_kernel
from numbakv.cache.kernels.attention.prefill import KERNELS as prefill_kernels
from numbakv.cache.kernels.step_buffer import POSITIONS, SEQ_IDS, host_step
from numbakv.reference import CellCache, solo_attention
from numbakv.reference.attention import attend_cells

from attention_cases import (
    CAPACITY,
    DECODE_STEP,
    MAX_WIDTH,
    PREFILL_STEP,
    SENTINEL,
    SHAPES,
    Case,
    build_case,
    poisoned_mask,
    poisoned_pool,
    step_buffer,
    to_d,
)
from helpers import assert_close

# (n_heads, n_kv_heads, head_dim): GQA 1, 2, 4, 8 and head_dim 16, 40, 64, 128
HEADS = [(2, 2, 16), (4, 2, 40), (4, 1, 64), (8, 1, 128)]
HEADS_IDS = ["gqa1-d16", "gqa2-d40", "gqa4-d64", "gqa8-d128"]


def seq_cells_of(cache: CellCache, rng) -> np.ndarray:
    """[max_seqs, CAPACITY] int32: each live sequence's cells by position; past its length
    foreign cells (other sequences' or free, NaN) and -7; rows of dead ids all junk."""
    snap = cache.snapshot()
    table = np.full((cache.config.max_seqs, CAPACITY), -7, np.int32)
    for seq in range(cache.config.max_seqs):
        is_owner = (snap.owners[:, seq // 64] >> np.uint64(seq % 64)) & np.uint64(1) == 1
        mine = np.flatnonzero(is_owner)
        mine = mine[np.argsort(snap.pos[mine])]
        assert (snap.pos[mine] == np.arange(len(mine))).all()
        foreign = np.flatnonzero(~is_owner)  # occupied by others, or free
        junk = rng.choice(foreign, CAPACITY - len(mine)).astype(np.int32)
        junk[1::3] = -7
        table[seq] = np.concatenate([mine, junk])
    return table


def run_masked(case: Case, layer: int, **options) -> np.ndarray:
    """launch_attend_masked on the poisoned buffers; returns out [MAX_WIDTH, n_heads, head_dim]."""
    step = case.step
    k, v = poisoned_pool(case, layer)
    mask = poisoned_mask(step, case.cache.config.windows[layer])
    step_d = to_d(step_buffer(step, case.cache.live_seqs[0]))
    out_d = to_d(np.full(case.q.shape, SENTINEL, np.float32))
    scale = 1 / np.sqrt(case.q.shape[2])
    launch_attend_masked(
        to_d(case.q), to_d(k), to_d(v), to_d(mask), step_d, step.width, step.read_len, scale,
        out_d, **options,
    )  # fmt: skip
    return out_d.copy_to_host()


def run_gathered(case: Case, layer: int, seed: int = 0, **options) -> np.ndarray:
    """launch_attend_gathered on the poisoned buffers; returns out like run_masked."""
    step = case.step
    k, v = poisoned_pool(case, layer)
    seq_cells = seq_cells_of(case.cache, np.random.default_rng(seed))
    step_d = to_d(step_buffer(step, case.cache.live_seqs[0]))  # junk past the width
    out_d = to_d(np.full(case.q.shape, SENTINEL, np.float32))
    scale = 1 / np.sqrt(case.q.shape[2])
    launch_attend_gathered(
        to_d(case.q), to_d(k), to_d(v), to_d(seq_cells), step_d, step.width,
        case.cache.config.windows[layer], scale, out_d, **options,
    )  # fmt: skip
    return out_d.copy_to_host()


def check(case: Case, layer: int, got: np.ndarray) -> None:
    """got against the reference cache's attend and, token by token, the solo oracle."""
    step, cache = case.step, case.cache
    width, window = step.width, cache.config.windows[layer]
    # reference
    expect = cache.attend(layer, case.q[:width])
    # compare
    assert np.isfinite(got[:width]).all()
    assert_close(got[:width], expect)
    assert (got[width:] == SENTINEL).all(), "a row past the width was written"
    for t, (seq, p) in enumerate(zip(step.seq_ids.tolist(), step.positions.tolist(), strict=True)):
        if seq < 0:
            assert (got[t] == 0).all(), f"padding row {t} is not exactly 0"
            continue
        k_hist, v_hist = case.history[seq]
        solo = solo_attention(case.q[t : t + 1], k_hist, v_hist, [p], window)
        assert_close(got[t], solo[0])


# -- every head shape, both storage dtypes, both kernels of each mode ---------------------------


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS, ids=HEADS_IDS)
def test_attention_matches_reference(n_heads, n_kv_heads, head_dim, dtype, kernel):
    final = DECODE_STEP if kernel == "decode" else PREFILL_STEP
    case = build_case(n_heads, n_kv_heads, head_dim, dtype, final, windows=(0, 3))
    read_len = case.step.read_len
    assert read_len % PREFILL_TILE and read_len % (decode.TILE * decode.WARPS)  # tiles end mid-way
    for layer in range(2):
        check(case, layer, run_masked(case, layer, kernel=kernel, n_splits=2))
        check(case, layer, run_gathered(case, layer, kernel=kernel, n_splits=3))


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS[1:3], ids=HEADS_IDS[1:3])
def test_bfloat16_attention_matches_reference(n_heads, n_kv_heads, head_dim, kernel):
    # the bfloat16 kernels of their own: widened bit patterns, poisoned with NaN patterns
    test_attention_matches_reference(n_heads, n_kv_heads, head_dim, "bfloat16", kernel)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize(
    ("n_heads", "n_kv_heads", "head_dim"),
    [(3, 1, 3), (16, 1, 8), (64, 2, 1)],
    ids=["gqa3-d3", "gqa16-d8", "gqa32-d1"],
)
def test_any_group_and_head_dim(n_heads, n_kv_heads, head_dim, kernel):
    # groups that do not divide a block's rows (3), or span several head blocks (16, 32)
    final = DECODE_STEP if kernel == "decode" else PREFILL_STEP
    case = build_case(n_heads, n_kv_heads, head_dim, "float32", final, windows=(0, 4), seed=7)
    check(case, 0, run_masked(case, 0, kernel=kernel, n_splits=2))
    check(case, 1, run_gathered(case, 1, kernel=kernel, n_splits=2))


# -- window edges ------------------------------------------------------------------------


def edge_windows(final) -> tuple[int, ...]:
    """0, 1, 2 and at / just below / just above the longest history of the final step."""
    longest = build_case(2, 1, 8, "float32", final).longest
    return (0, 1, 2, longest - 1, longest, longest + 1)


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_windows_at_the_edges_of_the_history(kernel):
    final = DECODE_STEP if kernel == "decode" else PREFILL_STEP
    windows = edge_windows(final)
    case = build_case(4, 2, 16, "float32", final, windows=windows, seed=1)
    for layer in range(len(windows)):
        check(case, layer, run_masked(case, layer, kernel=kernel, n_splits=2))
        check(case, layer, run_gathered(case, layer, kernel=kernel, n_splits=2))


# -- the launchers' own choices ----------------------------------------------------------


@pytest.mark.parametrize("final", [DECODE_STEP, PREFILL_STEP], ids=["decode", "prefill"])
def test_launchers_pick_the_kernel_by_shape(final, monkeypatch):
    case = build_case(4, 2, 16, "float16", final, windows=(0, 2), seed=2)
    expect_decode = is_decode_shape(case.step.width, 4, 2)
    assert expect_decode == (final is DECODE_STEP or not IS_SIMULATOR)
    ran = []

    class Spy:  # records the launch, then launches
        def __init__(self, name, original):
            self.name, self.original = name, original

        def __getitem__(self, config):
            ran.append(self.name)
            return self.original[config]

    original = attention_launch.kernels

    def spied(mode, *kinds):  # (decode, merge, prefill), the attention kernels each a Spy
        decode, merge, prefill = original(mode, *kinds)
        shapes = dict(zip(SHAPES, (decode, prefill), strict=True))
        spies = {shape: Spy(f"attend_{mode}_{shape}", k) for shape, k in shapes.items()}
        return spies["decode"], merge, spies["prefill"]

    monkeypatch.setattr(attention_launch, "kernels", spied)
    for layer in range(2):
        check(case, layer, run_masked(case, layer))
        check(case, layer, run_gathered(case, layer))
    shape = "decode" if expect_decode else "prefill"
    assert ran == [f"attend_{mode}_{shape}" for _ in range(2) for mode in ("masked", "gathered")]


@pytest.mark.parametrize("threads", [64, 128])
@pytest.mark.parametrize("head_dim", [16, 128])
def test_the_warps_of_a_decode_block_merge_through_shared_memory(head_dim, threads):
    # GQA 8: at head_dim 16 one warp holds the 8 heads and the block's other warps walk other
    # cells (merged through shared memory); at 128 a warp holds 4, so two warps share each
    # row. The simulator plans one warp a block: launched here with two and four.
    case = build_case(8, 1, head_dim, "float16", DECODE_STEP, windows=(0, 3), seed=5)
    step, n_kv = case.step, case.cache.config.n_kv_heads
    for layer in range(2):
        k, v = poisoned_pool(case, layer)
        seq_cells = seq_cells_of(case.cache, np.random.default_rng(0))
        window = case.cache.config.windows[layer]
        for n_splits in (1, 3):
            plan = plan_attention("gathered", "float", step.width, 8, n_kv, head_dim, CAPACITY,
                                  kernel="decode", n_splits=n_splits)  # fmt: skip
            plan = dataclasses.replace(plan, threads=threads)
            out_d = to_d(np.full(case.q.shape, SENTINEL, np.float32))
            run_attention(
                plan, to_d(case.q), to_d(k), to_d(v), to_d(np.ones((2, n_kv), np.float32)),
                to_d(step_buffer(step, case.cache.live_seqs[0])), (to_d(seq_cells),
                np.int32(window)), np.float32(1 / np.sqrt(head_dim)), out_d,
                split_workspace(MAX_WIDTH, 8, head_dim, n_splits), 0,
            )  # fmt: skip
            check(case, layer, out_d.copy_to_host())


@pytest.mark.parametrize("n_splits", [1, 4, 7])
def test_decode_splits_merge_to_the_same_result(n_splits):
    # 7 splits of histories of 2 to 12 cells: some splits hold one cell, some none
    case = build_case(2, 1, 16, "float32", DECODE_STEP, windows=(0, 5), seed=3)
    for layer in range(2):
        check(case, layer, run_masked(case, layer, kernel="decode", n_splits=n_splits))
        check(case, layer, run_gathered(case, layer, kernel="decode", n_splits=n_splits))


def test_decode_workspace_is_reused_and_must_hold_the_splits():
    case = build_case(4, 2, 16, "float32", DECODE_STEP, windows=(0, 2), seed=4)
    workspace = split_workspace(MAX_WIDTH, 4, 16, max_splits=2)
    part_shape = (MAX_WIDTH, 4, 2)  # [max_width, n_heads, max_splits]
    assert [w.shape for w in workspace] == [(*part_shape, 16), part_shape, part_shape]
    for part in workspace:  # garbage: an empty split's partial must never be read
        part.copy_to_device(np.full(part.shape, np.nan, np.float32))
    for layer in range(2):  # reused by both layers and both modes: what a fresh one gives
        for run in (run_masked, run_gathered):
            got = run(case, layer, kernel="decode", n_splits=2, workspace=workspace)
            check(case, layer, got)
            np.testing.assert_array_equal(got, run(case, layer, kernel="decode", n_splits=2))
    # too few splits for the plan: refused, never clamped (a plan's grid is fixed)
    for n_splits in (3, MAX_SPLITS):
        with pytest.raises(ValueError, match=f"n_splits={n_splits}"):
            run_masked(case, 0, kernel="decode", n_splits=n_splits, workspace=workspace)
        with pytest.raises(ValueError, match=f"n_splits={n_splits}"):
            run_gathered(case, 0, kernel="decode", n_splits=n_splits, workspace=workspace)
    with pytest.raises(ValueError, match="workspace"):  # n_heads 2, not 4
        run_masked(case, 0, kernel="decode", workspace=split_workspace(MAX_WIDTH, 2, 16))
    with pytest.raises(ValueError, match="workspace"):  # rows for 3 tokens, not 4
        run_gathered(case, 0, kernel="decode", n_splits=1, workspace=split_workspace(3, 4, 16))
    with pytest.raises(ValueError, match="workspace"):  # head_dim 8, not 16
        run_masked(case, 0, kernel="decode", n_splits=1, workspace=split_workspace(4, 4, 8))


# -- splits past a token's range: empty partials, ignored by the merge ------------------------

LONG = 2 * MIN_SPLIT_CELLS + 22  # a range of two whole splits and part of a third
FORCED_SPLITS = (1, 2, 3, MAX_SPLITS)


def fill(length: int) -> tuple[int, int]:
    """Bounds on the splits a range of `length` cells fills at MIN_SPLIT_CELLS cells a split:
    whole splits (floor) to splits covering it (ceil); either is a reading of the rule."""
    return max(1, length // MIN_SPLIT_CELLS), max(1, -(-length // MIN_SPLIT_CELLS))


def split_inputs(seed: int):
    """A pool of LONG rows (float32) with queries for 5 tokens of 2 heads over 1 KV head."""
    rng = np.random.default_rng(seed)
    k, v = rng.standard_normal((2, LONG, 1, 8)).astype(np.float32)
    q = rng.standard_normal((5, 2, 8)).astype(np.float32)
    return rng, q, k, v


def run_with_splits(mode, q, k, v, table, step, n_splits, lengths, **launch):
    """One decode launch of `mode` with n_splits forced, over a NaN-poisoned workspace: the
    splits past a token's range fill (`lengths`: its cells) must write an empty partial
    (else the merge would read the NaN), and the splits past n_splits nothing."""
    width = len(q)  # the step's width; its buffer has MAX_WIDTH columns
    workspace = split_workspace(width, q.shape[1], q.shape[2])  # MAX_SPLITS splits
    for part in workspace:
        part.copy_to_device(np.full(part.shape, np.nan, np.float32))
    out_d = to_d(np.full(q.shape, SENTINEL, np.float32))
    args = (to_d(q), to_d(k), to_d(v), to_d(table), to_d(step))
    options = dict(kernel="decode", n_splits=n_splits, workspace=workspace)
    if mode == "masked":
        launch_attend_masked(*args, width, launch["read_len"], 0.5, out_d, **options)
    else:
        launch_attend_gathered(*args, width, launch["window"], 0.5, out_d, **options)
    part_l = workspace[2].copy_to_host()  # [width, n_heads, MAX_SPLITS]
    for t, length in enumerate(lengths):
        np.testing.assert_array_equal(part_l[t, :, fill(length)[1] : n_splits], tiles.EMPTY)
    assert np.isnan(part_l[:, :, n_splits:]).all()
    return out_d.copy_to_host()


def check_forced_splits(outs: dict, expect: np.ndarray, lengths: list[int]) -> None:
    """Every n_splits against the reference; bit for bit equal wherever the same splits are
    used, the rest of the n_splits empty: every n_splits on a range of at most
    MIN_SPLIT_CELLS cells (one split), and 3 and MAX_SPLITS on any (at most 3 are filled)."""
    for n_splits, got in outs.items():
        assert_close(got, expect, f"x{n_splits}")
    for t, length in enumerate(lengths):
        assert fill(length)[1] <= 3
        np.testing.assert_array_equal(outs[MAX_SPLITS][t], outs[3][t], err_msg=f"token {t}")
        if length <= MIN_SPLIT_CELLS:
            for n_splits, got in outs.items():
                np.testing.assert_array_equal(got[t], outs[1][t], err_msg=f"{t} x{n_splits}")


@pytest.mark.parametrize("read_len", [MIN_SPLIT_CELLS - 24, MIN_SPLIT_CELLS, LONG])
def test_masked_decode_gives_one_result_for_any_forced_splits(read_len):
    # every token sweeps [0, read_len): one split up to MIN_SPLIT_CELLS cells, 2 or 3 of LONG
    rng, q, k, v = split_inputs(read_len)
    width = len(q)
    mask = np.ones((width, LONG), np.uint8)  # attend everything past read_len: never read
    mask[:, :read_len] = rng.random((width, read_len)) < 0.7
    mask[3, :read_len] = 0  # a real token that sees nothing gives 0
    k[read_len:], v[read_len:] = np.nan, np.nan
    step = host_step(np.zeros(width), np.full(width, 7), np.zeros(width), read_len, MAX_WIDTH)
    step[POSITIONS, width:], step[SEQ_IDS, width:] = 0, 0  # junk past the width: a token
    # reference
    expect = attend_cells(q, k[:read_len], v[:read_len], mask[:, :read_len], np.float32(0.5))
    # device
    outs = {
        n: run_with_splits("masked", q, k, v, mask, step, n, [read_len] * width, read_len=read_len)
        for n in FORCED_SPLITS
    }
    # compare
    assert (outs[MAX_SPLITS][3] == 0).all()
    check_forced_splits(outs, expect, [read_len] * width)


@pytest.mark.parametrize("window", [0, MIN_SPLIT_CELLS + 6])
def test_gathered_decode_gives_one_result_for_any_forced_splits(window):
    # tokens whose ranges are shorter than, exactly, just past and far past MIN_SPLIT_CELLS
    # cells (11, 64, 65 and LONG at window 0; the window cuts the last two), and a padding row
    rng, q, k, v = split_inputs(window + 1)
    table = np.full((2, LONG + 8), -7, np.int32)  # past a sequence's length: -7
    table[0, :LONG] = rng.permutation(LONG)
    table[1, :LONG] = rng.permutation(LONG)
    seq_ids = [0, 1, 0, 1, -1]
    positions = [10, MIN_SPLIT_CELLS - 1, MIN_SPLIT_CELLS, LONG - 1, 3]
    step = host_step(np.zeros(5), positions, seq_ids, 0, MAX_WIDTH)
    step[POSITIONS, 5:], step[SEQ_IDS, 5:] = LONG - 1, 1  # junk past the width: a token
    # reference: token t sees the cells of its sequence at positions [lo, p]
    mask = np.zeros((5, LONG), np.uint8)
    lengths = []
    for t, (seq, p) in enumerate(zip(seq_ids, positions, strict=True)):
        lo = max(0, p - window + 1) if window else 0
        lengths.append(p + 1 - lo if seq >= 0 else 0)
        if seq >= 0:
            mask[t, table[seq, lo : p + 1]] = 1
    expect = attend_cells(q, k, v, mask, np.float32(0.5))
    assert max(lengths) == (LONG if window == 0 else window)  # more than one split filled
    # device
    outs = {
        n: run_with_splits("gathered", q, k, v, table, step, n, lengths, window=window)
        for n in FORCED_SPLITS
    }
    # compare
    assert (outs[MAX_SPLITS][4] == 0).all()
    check_forced_splits(outs, expect, lengths)


def test_split_range_uses_the_splits_a_range_fills():
    # the device function run as Python: near-equal parts covering [lo, hi) in order, as
    # many as the range fills (see `fill`), never more than n_splits; the rest empty
    split_range = getattr(decode.split_range, "py_func", decode.split_range)
    ranges = [(0, 0), (5, 6), (0, MIN_SPLIT_CELLS), (3, 4 + MIN_SPLIT_CELLS), (0, LONG), (7, 4000)]
    for lo, hi in ranges:
        for n_splits in (*FORCED_SPLITS, 5):
            parts = [split_range(lo, hi, s, n_splits) for s in range(n_splits)]
            used = sum(b > a for a, b in parts)
            assert all(b > a for a, b in parts[:used])  # the used splits come first
            assert [c for a, b in parts for c in range(a, b)] == list(range(lo, hi))
            low, high = fill(hi - lo)
            assert used == 0 if hi == lo else min(n_splits, low) <= used <= min(n_splits, high)
            sizes = [b - a for a, b in parts[:used]]
            assert not sizes or max(sizes) - min(sizes) <= max(1, used)  # near-equal


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_gathered_skips_a_cell_id_past_the_pool(kernel):
    # a corrupt seq_cells entry inside a token's range is seen by no one, never dereferenced
    rng = np.random.default_rng(6)
    rows, n_heads, head_dim = 6, 2, 8
    q = rng.standard_normal((2, n_heads, head_dim)).astype(np.float32)
    k, v = rng.standard_normal((2, rows, 1, head_dim)).astype(np.float32)
    seq_cells = np.array([[4, 1, rows + 3, 0, 2]], np.int32)
    step = host_step([-1, -1], [4, 1], [0, 0])  # the cells are the placement's, unread here
    # reference: token 0 sees cells 4, 1, 0, 2; token 1 sees 4, 1
    expect = attend_cells(q, k, v, np.array([[1, 1, 1, 0, 1, 0], [0, 1, 0, 0, 1, 0]]), 0.5)
    # device
    out_d = to_d(np.zeros(q.shape, np.float32))
    launch_attend_gathered(
        to_d(q), to_d(k), to_d(v), to_d(seq_cells), to_d(step), 2, 0, 0.5, out_d, kernel=kernel
    )
    # compare
    assert_close(out_d.copy_to_host(), expect)


def test_a_real_token_that_sees_nothing_gives_zero():
    rng = np.random.default_rng(5)
    width, read_len, n_heads, head_dim = 3, 20, 2, 8
    q = rng.standard_normal((width, n_heads, head_dim)).astype(np.float32)
    k, v = rng.standard_normal((2, read_len, 1, head_dim)).astype(np.float32)
    mask = np.zeros((width, read_len), np.uint8)
    mask[1, ::3] = 1  # only token 1 sees anything
    k[mask.sum(axis=0) == 0] = np.inf  # every cell no token sees: garbage
    v[mask.sum(axis=0) == 0] = np.nan
    step_d = to_d(host_step(np.arange(width), np.arange(width), np.zeros(width), read_len))
    for kernel in ("decode", "prefill"):
        # reference
        expect = attend_cells(q, k, v, mask, np.float32(0.5))
        # device
        out_d = to_d(np.full(q.shape, SENTINEL, np.float32))
        launch_attend_masked(
            to_d(q), to_d(k), to_d(v), to_d(mask), step_d, width, read_len, 0.5, out_d,
            kernel=kernel,
        )  # fmt: skip
        got = out_d.copy_to_host()
        # compare
        assert (got[[0, 2]] == 0).all()
        assert_close(got, expect)


def test_choose_splits_and_the_shape_rule():
    assert choose_splits(1, 1) == 1
    assert choose_splits(MIN_SPLIT_CELLS - 1, 1) == 1  # too short to split
    assert 1 < choose_splits(1 << 20, 1) <= MAX_SPLITS
    assert choose_splits(1 << 20, 1 << 20) == 1  # the grid is full already
    assert is_decode_shape(1, 32, 8) and is_decode_shape(DECODE_MAX_WIDTH, 2, 2)
    assert not is_decode_shape(4096, 32, 8)  # 8192 prefill blocks fill any GPU
    assert is_decode_shape(DECODE_MAX_WIDTH + 1, 2, 2) == (not IS_SIMULATOR)


@pytest.mark.parametrize(("n_heads", "n_kv_heads"), [(2, 2), (8, 2), (32, 8), (64, 1)])
@pytest.mark.parametrize("max_width", [1, DECODE_MAX_WIDTH, 512])
def test_decode_width_limit_is_the_widest_decode_shape(max_width, n_heads, n_kv_heads):
    limit = decode_width_limit(max_width, n_heads, n_kv_heads)
    assert min(max_width, DECODE_MAX_WIDTH) <= limit <= max_width
    assert all(is_decode_shape(w, n_heads, n_kv_heads) for w in range(1, limit + 1))
    assert limit == max_width or not is_decode_shape(limit + 1, n_heads, n_kv_heads)


def test_plans_depend_on_the_shape_only():
    # a plan is the width's and the config's: forced kernels and splits, the split default
    # from max_len, and the merge over width x n_heads x head_dim
    plan = plan_attention("masked", "float", 3, 4, 2, 16, 4096, kernel="decode", n_splits=5)
    assert isinstance(plan, AttentionPlan) and plan.is_decode and plan.n_splits == 5
    assert plan.kernel is decode.KERNELS("masked", "float", "float", head_dim=16, group=2)
    assert plan.merge is merge_kernel("float")
    assert plan.merge_threads > 0 and plan.merge_grid
    one = plan_attention("masked", "float", 3, 4, 2, 16, 4096, kernel="decode", n_splits=1)
    assert one.merge is None and one.kernel is plan.kernel  # the kernel writes out itself
    io = ("bfloat16", "bfloat16")  # q and out of bfloat16 patterns: their own kernels
    prefill = plan_attention("gathered", "bfloat16", 3, 4, 2, 16, 4096, kernel="prefill", io=io)
    assert not prefill.is_decode and prefill.n_splits == 0
    assert prefill.kernel is prefill_kernels("gathered", "bfloat16", "bfloat16", *io, head_dim=16)
    assert prefill.kernel is not prefill_kernels("gathered", "bfloat16", "bfloat16", head_dim=16)
    default = plan_attention("gathered", "float", 2, 4, 2, 16, 1 << 20, kernel="decode")
    assert default.n_splits == choose_splits(1 << 20, 2 * 2)  # width x head blocks
    short = plan_attention("masked", "float", 2, 4, 2, 16, MIN_SPLIT_CELLS - 1, kernel="decode")
    assert short.n_splits == 1
    by_shape = plan_attention("masked", "float", DECODE_MAX_WIDTH, 4, 2, 16, 100)
    assert by_shape.is_decode == is_decode_shape(DECODE_MAX_WIDTH, 4, 2)
    with pytest.raises(ValueError, match="kernel='fast'"):
        plan_attention("masked", "float", 2, 4, 2, 16, 100, kernel="fast")


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_one_plan_serves_steps_of_any_read_len_and_positions(kernel):
    # planned once for the width, run over two steps whose read_len and positions differ:
    # what each step's own launcher call gives, bit for bit
    rng = np.random.default_rng(8)
    width, rows, n_heads, head_dim = 3, 40, 4, 8
    q = to_d(rng.standard_normal((width, n_heads, head_dim)).astype(np.float32))
    k, v = (to_d(rng.standard_normal((rows, 2, head_dim)).astype(np.float32)) for _ in "kv")
    mask = to_d((rng.random((width, rows)) < 0.6).astype(np.uint8))
    seq_cells = to_d(rng.permutation(rows).astype(np.int32).reshape(1, rows))
    scale = np.float32(0.25)
    shape = (width, n_heads, 2, head_dim, rows)
    masked = plan_attention("masked", "float", *shape, kernel=kernel)
    gathered = plan_attention("gathered", "float", *shape, kernel=kernel)
    workspace = split_workspace(width, n_heads, head_dim)
    for read_len, positions in ((rows, [5, 39, 0]), (17, [16, 2, 30])):
        step_d = to_d(host_step([-1] * width, positions, [0, 0, -1], read_len, MAX_WIDTH))
        runs = {
            "masked": (masked, (mask,), launch_attend_masked, (mask, step_d, width, read_len)),
            "gathered": (gathered, (seq_cells, np.int32(0)), launch_attend_gathered,
                         (seq_cells, step_d, width, 0)),
        }  # fmt: skip
        for mode, (plan, view, launcher, args) in runs.items():
            out_d, expect_d = (to_d(np.full((width, n_heads, head_dim), SENTINEL)) for _ in "oe")
            run_attention(
                plan,
                q,
                k,
                v,
                to_d(np.ones((2, 2), np.float32)),
                step_d,
                view,
                scale,
                out_d,
                workspace,
                0,
            )
            launcher(q, k, v, *args, scale, expect_d, kernel=kernel)
            got, expect = out_d.copy_to_host(), expect_d.copy_to_host()
            np.testing.assert_array_equal(got, expect, err_msg=f"{mode} read_len={read_len}")
            assert mode == "masked" or (got[2] == 0).all()  # gathered: the padding row


# -- refusals ----------------------------------------------------------------------------


def refusal_inputs(n_heads=2, n_kv_heads=1, head_dim=8):
    """q and out of 2 rows, a pool of 4, a [2, 4] mask, a step buffer of 2 columns (width 2,
    read_len 4) and a [1, 4] seq_cells."""
    q = to_d(np.zeros((2, n_heads, head_dim), np.float32))
    kv = to_d(np.zeros((4, n_kv_heads, head_dim), np.float32))
    step = to_d(host_step([0, 1], [0, 1], [0, 0], read_len=4))
    return q, kv, to_d(np.zeros((2, 4), np.uint8)), step, to_d(np.zeros((1, 4), np.int32))


@pytest.mark.parametrize(
    ("heads", "match"),
    [((2, 1, HEAD_DIM_MAX + 1), "head_dim=129"), ((3, 2, 8), "multiple of n_kv_heads")],
)
def test_launchers_refuse_shapes_they_cannot_run(heads, match):
    q, kv, mask, step, seq_cells = refusal_inputs(*heads)
    with pytest.raises(ValueError, match=match):
        launch_attend_masked(q, kv, kv, mask, step, 2, 4, 1.0, q)
    with pytest.raises(ValueError, match=match):
        launch_attend_gathered(q, kv, kv, seq_cells, step, 2, 0, 1.0, q)


def test_launchers_refuse_extents_past_their_arrays():
    q, kv, mask, step, seq_cells = refusal_inputs()
    with pytest.raises(ValueError, match="width=3"):
        launch_attend_masked(q, kv, kv, mask, step, 3, 4, 1.0, q)
    with pytest.raises(ValueError, match="read_len=5"):
        launch_attend_masked(q, kv, kv, mask, step, 2, 5, 1.0, q)
    with pytest.raises(ValueError, match="kernel='fast'"):
        launch_attend_masked(q, kv, kv, mask, step, 2, 4, 1.0, q, kernel="fast")
    with pytest.raises(ValueError, match="window=-1"):
        launch_attend_gathered(q, kv, kv, seq_cells, step, 2, -1, 1.0, q)
    with pytest.raises(ValueError, match="width=3"):
        launch_attend_gathered(q, kv, kv, seq_cells, step, 3, 0, 1.0, q)
    # a step buffer narrower than the width: q, out and the mask hold 3 rows, the step 2
    q3 = to_d(np.zeros((3, 2, 8), np.float32))
    mask3 = to_d(np.zeros((3, 4), np.uint8))
    with pytest.raises(ValueError, match="width=3"):
        launch_attend_masked(q3, kv, kv, mask3, step, 3, 4, 1.0, q3)
    with pytest.raises(ValueError, match="width=3"):
        launch_attend_gathered(q3, kv, kv, seq_cells, step, 3, 0, 1.0, q3)
