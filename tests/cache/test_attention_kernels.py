"""Attention kernels against the reference cache and the solo oracle, on the simulator or a GPU.

Each case builds a table with the reference `CellCache` (new sequences, prefills, a clone
sharing a prefix, a removal whose holes refill, a rewind), writes random K/V through it,
then uploads its pool, its step's masks and a position -> cell table to the device and
runs the launchers. Everything a kernel must not read is poisoned first: NaN in every pool
row past read_len and in every free cell, 1s in the mask outside the written region,
foreign cell ids and -7 in seq_cells past each sequence's length, junk in the step rows past
the width, and a sentinel in `out` rows past the width. Tests read `# reference`,
`# device`, `# compare`.
"""

import numpy as np
import pytest

from numbakv.cache._cuda import IS_SIMULATOR
from numbakv.cache.kernels.attention import (
    DECODE_MAX_WIDTH,
    DECODE_TILE,
    HEAD_DIM_MAX,
    MAX_SPLITS,
    MIN_SPLIT_CELLS,
    PREFILL_TILE,
    choose_splits,
    is_decode_shape,
    launch_attend_gathered,
    launch_attend_masked,
    split_workspace,
)
from numbakv.cache.kernels.attention import launch as attention_launch
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
    to_d,
)

# (n_heads, n_kv_heads, head_dim): GQA 1, 2, 4, 8 and head_dim 16, 40, 64, 128
HEADS = [(2, 2, 16), (4, 2, 40), (4, 1, 64), (8, 1, 128)]
HEADS_IDS = ["gqa1-d16", "gqa2-d40", "gqa4-d64", "gqa8-d128"]
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-3}  # rtol = atol


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


def padded(x: np.ndarray, junk: int) -> np.ndarray:
    """A [MAX_WIDTH] int32 step buffer: x, then junk (a live-looking id or position)."""
    out = np.full(MAX_WIDTH, junk, np.int32)
    out[: len(x)] = x
    return out


def run_masked(case: Case, layer: int, **options) -> np.ndarray:
    """launch_attend_masked on the poisoned buffers; returns out [MAX_WIDTH, n_heads, head_dim]."""
    step = case.step
    k, v = poisoned_pool(case, layer)
    mask = poisoned_mask(step, case.cache.config.windows[layer])
    out_d = to_d(np.full(case.q.shape, SENTINEL, np.float32))
    scale = 1 / np.sqrt(case.q.shape[2])
    launch_attend_masked(
        to_d(case.q), to_d(k), to_d(v), to_d(mask), step.width, step.read_len, scale, out_d,
        **options,
    )  # fmt: skip
    return out_d.copy_to_host()


def run_gathered(case: Case, layer: int, seed: int = 0, **options) -> np.ndarray:
    """launch_attend_gathered on the poisoned buffers; returns out like run_masked."""
    step = case.step
    k, v = poisoned_pool(case, layer)
    seq_cells = seq_cells_of(case.cache, np.random.default_rng(seed))
    live = case.cache.live_seqs[0]
    seq_ids, positions = padded(step.seq_ids, live), padded(step.positions, 3)
    out_d = to_d(np.full(case.q.shape, SENTINEL, np.float32))
    scale = 1 / np.sqrt(case.q.shape[2])
    launch_attend_gathered(
        to_d(case.q), to_d(k), to_d(v), to_d(seq_cells), to_d(seq_ids), to_d(positions),
        step.width, case.cache.config.windows[layer], scale, out_d, **options,
    )  # fmt: skip
    return out_d.copy_to_host()


def check(case: Case, layer: int, got: np.ndarray) -> None:
    """got against the reference cache's attend and, token by token, the solo oracle."""
    step, cache = case.step, case.cache
    width, window = step.width, cache.config.windows[layer]
    tol = TOLERANCE[cache.config.dtype]
    # reference
    expect = cache.attend(layer, case.q[:width])
    # compare
    assert np.isfinite(got[:width]).all()
    np.testing.assert_allclose(got[:width], expect, rtol=tol, atol=tol)
    assert (got[width:] == SENTINEL).all(), "a row past the width was written"
    for t, (seq, p) in enumerate(zip(step.seq_ids.tolist(), step.positions.tolist(), strict=True)):
        if seq < 0:
            assert (got[t] == 0).all(), f"padding row {t} is not exactly 0"
            continue
        k_hist, v_hist = case.history[seq]
        solo = solo_attention(case.q[t : t + 1], k_hist, v_hist, [p], window)
        np.testing.assert_allclose(got[t], solo[0], rtol=tol, atol=tol)


# -- every head shape, both storage dtypes, both kernels of each mode ---------------------------


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "head_dim"), HEADS, ids=HEADS_IDS)
def test_attention_matches_reference(n_heads, n_kv_heads, head_dim, dtype, kernel):
    final = DECODE_STEP if kernel == "decode" else PREFILL_STEP
    case = build_case(n_heads, n_kv_heads, head_dim, dtype, final, windows=(0, 3))
    read_len = case.step.read_len
    assert read_len % PREFILL_TILE and read_len % DECODE_TILE  # tiles end mid-way
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

    spied = {
        (mode, kind): tuple(
            Spy(f"attend_{mode}_{shape}", k) for shape, k in zip(SHAPES, pair, strict=True)
        )
        for (mode, kind), pair in attention_launch.KERNELS.items()  # (decode, prefill)
    }
    monkeypatch.setattr(attention_launch, "KERNELS", spied)
    for layer in range(2):
        check(case, layer, run_masked(case, layer))
        check(case, layer, run_gathered(case, layer))
    shape = "decode" if expect_decode else "prefill"
    assert ran == [f"attend_{mode}_{shape}" for _ in range(2) for mode in ("masked", "gathered")]


@pytest.mark.parametrize("n_splits", [1, 4, 7])
def test_decode_splits_merge_to_the_same_result(n_splits):
    # 7 splits of histories of 2 to 12 cells: some splits hold one cell, some none
    case = build_case(2, 1, 16, "float32", DECODE_STEP, windows=(0, 5), seed=3)
    for layer in range(2):
        check(case, layer, run_masked(case, layer, kernel="decode", n_splits=n_splits))
        check(case, layer, run_gathered(case, layer, kernel="decode", n_splits=n_splits))


def test_decode_workspace_is_reused_and_clamps_the_splits():
    case = build_case(4, 2, 16, "float32", DECODE_STEP, windows=(0, 2), seed=4)
    workspace = split_workspace(MAX_WIDTH, 4, 16, max_splits=2)
    part_shape = (MAX_WIDTH, 4, 2)  # [max_width, n_heads, max_splits]
    assert [w.shape for w in workspace] == [(*part_shape, 16), part_shape, part_shape]
    for part in workspace:  # garbage: an empty split's partial must never be read
        part.copy_to_device(np.full(part.shape, np.nan, np.float32))
    for layer in range(2):  # asked for 5 splits, the workspace holds 2
        got = run_masked(case, layer, kernel="decode", n_splits=5, workspace=workspace)
        check(case, layer, got)
        check(case, layer, run_gathered(case, layer, kernel="decode", workspace=workspace))
    with pytest.raises(ValueError, match="workspace"):
        run_masked(case, 0, kernel="decode", workspace=split_workspace(MAX_WIDTH, 2, 16))


@pytest.mark.parametrize("kernel", ["decode", "prefill"])
def test_gathered_skips_a_cell_id_past_the_pool(kernel):
    # a corrupt seq_cells entry inside a token's range is seen by no one, never dereferenced
    rng = np.random.default_rng(6)
    rows, n_heads, head_dim = 6, 2, 8
    q = rng.standard_normal((2, n_heads, head_dim)).astype(np.float32)
    k, v = rng.standard_normal((2, rows, 1, head_dim)).astype(np.float32)
    seq_cells = np.array([[4, 1, rows + 3, 0, 2]], np.int32)
    seq_ids, positions = np.zeros(2, np.int32), np.array([4, 1], np.int32)
    # reference: token 0 sees cells 4, 1, 0, 2; token 1 sees 4, 1
    expect = attend_cells(q, k, v, np.array([[1, 1, 1, 0, 1, 0], [0, 1, 0, 0, 1, 0]]), 0.5)
    # device
    out_d = to_d(np.zeros(q.shape, np.float32))
    launch_attend_gathered(
        to_d(q), to_d(k), to_d(v), to_d(seq_cells), to_d(seq_ids), to_d(positions), 2, 0, 0.5,
        out_d, kernel=kernel,
    )  # fmt: skip
    # compare
    np.testing.assert_allclose(out_d.copy_to_host(), expect, rtol=1e-5, atol=1e-5)


def test_a_real_token_that_sees_nothing_gives_zero():
    rng = np.random.default_rng(5)
    width, read_len, n_heads, head_dim = 3, 20, 2, 8
    q = rng.standard_normal((width, n_heads, head_dim)).astype(np.float32)
    k, v = rng.standard_normal((2, read_len, 1, head_dim)).astype(np.float32)
    mask = np.zeros((width, read_len), np.uint8)
    mask[1, ::3] = 1  # only token 1 sees anything
    k[mask.sum(axis=0) == 0] = np.inf  # every cell no token sees: garbage
    v[mask.sum(axis=0) == 0] = np.nan
    for kernel in ("decode", "prefill"):
        # reference
        expect = attend_cells(q, k, v, mask, np.float32(0.5))
        # device
        out_d = to_d(np.full(q.shape, SENTINEL, np.float32))
        launch_attend_masked(
            to_d(q), to_d(k), to_d(v), to_d(mask), width, read_len, 0.5, out_d, kernel=kernel
        )
        got = out_d.copy_to_host()
        # compare
        assert (got[[0, 2]] == 0).all()
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)


def test_choose_splits_and_the_shape_rule():
    assert choose_splits(1, 1) == 1
    assert choose_splits(MIN_SPLIT_CELLS - 1, 1) == 1  # too short to split
    assert 1 < choose_splits(1 << 20, 1) <= MAX_SPLITS
    assert choose_splits(1 << 20, 1 << 20) == 1  # the grid is full already
    assert is_decode_shape(1, 32, 8) and is_decode_shape(DECODE_MAX_WIDTH, 2, 2)
    assert not is_decode_shape(4096, 32, 8)  # 8192 prefill blocks fill any GPU
    assert is_decode_shape(DECODE_MAX_WIDTH + 1, 2, 2) == (not IS_SIMULATOR)


# -- refusals ----------------------------------------------------------------------------


def refusal_inputs(n_heads=2, n_kv_heads=1, head_dim=8):
    q = to_d(np.zeros((2, n_heads, head_dim), np.float32))
    kv = to_d(np.zeros((4, n_kv_heads, head_dim), np.float32))
    return q, kv, to_d(np.zeros((2, 4), np.uint8))


@pytest.mark.parametrize(
    ("heads", "match"),
    [((2, 1, HEAD_DIM_MAX + 1), "head_dim=129"), ((3, 2, 8), "multiple of n_kv_heads")],
)
def test_launchers_refuse_shapes_they_cannot_run(heads, match):
    q, kv, mask = refusal_inputs(*heads)
    seq = to_d(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=match):
        launch_attend_masked(q, kv, kv, mask, 2, 4, 1.0, q)
    with pytest.raises(ValueError, match=match):
        launch_attend_gathered(q, kv, kv, to_d(np.zeros((1, 4), np.int32)), seq, seq, 2, 0, 1.0, q)


def test_launchers_refuse_extents_past_their_arrays():
    q, kv, mask = refusal_inputs()
    with pytest.raises(ValueError, match="width=3"):
        launch_attend_masked(q, kv, kv, mask, 3, 4, 1.0, q)
    with pytest.raises(ValueError, match="read_len=5"):
        launch_attend_masked(q, kv, kv, mask, 2, 5, 1.0, q)
    with pytest.raises(ValueError, match="kernel='fast'"):
        launch_attend_masked(q, kv, kv, mask, 2, 4, 1.0, q, kernel="fast")
    seq = to_d(np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="window=-1"):
        launch_attend_gathered(q, kv, kv, to_d(np.zeros((1, 4), np.int32)), seq, seq, 2, -1, 1.0, q)
