"""Every kernel against a plain NumPy expectation, on the simulator or a GPU unchanged.

Each test reads `# reference`, `# device`, `# compare`. Everything a kernel must not
touch is poisoned first (garbage pool rows, 0xAB mask bytes, random owners on unlisted
cells) and checked byte for byte afterwards. Sizes straddle the block the launchers use
(SIM_THREADS threads in the simulator, THREADS on a GPU).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.cache._cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels.launch import SIM_THREADS, THREADS
from numbakv.cache.kernels.masks import launch_write_mask
from numbakv.cache.kernels.placement import launch_place_tokens, launch_scatter_kv
from numbakv.cache.kernels.seq_cells import (
    launch_clear_lengths,
    launch_copy_prefix,
    launch_record_tokens,
    launch_set_length,
)
from numbakv.cache.kernels.verbs import launch_add_owner, launch_clear_table, launch_drop_owner
from numbakv.reference import CacheConfig, CellCache
from numbakv.reference.step import window_mask

from helpers import churn

BLOCK = SIM_THREADS if IS_SIMULATOR else THREADS  # threads per block of every launch
MAX_WIDTH = BLOCK + 8
WIDTHS = [1, BLOCK - 1, BLOCK, BLOCK + 1, MAX_WIDTH]
CAPACITY = 3 * BLOCK + 5  # not a multiple of the block
SEQ_IDS = [0, 63, 64, 127, 199]  # first and last bit of words 0 and 1, and word 3
N_WORDS = 4  # owner words for 200 sequence ids
POISON = 0xAB
# the simulator casts float32 -> float16 with NumPy, in kernel threads, where errstate
# does not reach: 65520 -> inf warns there (and is what a GPU's cvt.rn.f16.f32 gives)
OVERFLOW_IN_CAST = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float16): np.uint16}


def to_d(x):
    return cuda.to_device(np.ascontiguousarray(x))


def bit_of(seq: int) -> np.uint64:
    return np.uint64(1) << np.uint64(seq % 64)


def sees_by_hand(cell_pos, cell_owners, seq, position, window) -> np.ndarray:
    """[len(cell_pos)] uint8: the mask rule of SPEC §3 spelled out cell by cell."""
    row = np.zeros(len(cell_pos), np.uint8)
    seq, position = int(seq), int(position)
    if seq < 0:
        return row
    for c, pos in enumerate(cell_pos.tolist()):
        is_owner = int(cell_owners[c, seq // 64]) >> (seq % 64) & 1
        in_window = window == 0 or pos > position - window
        row[c] = pos >= 0 and is_owner and pos <= position and in_window
    return row


def random_owners(rng, n_cells: int, n_words: int = N_WORDS) -> np.ndarray:
    """[n_cells, n_words] uint64: random sparse bitsets, some cells with none."""
    bits = rng.random((n_cells, n_words, 64)) < 0.05
    words = (bits * (np.uint64(1) << np.arange(64, dtype=np.uint64))).sum(axis=2, dtype=np.uint64)
    words[rng.random(n_cells) < 0.2] = 0
    return words


def garbage(rng, shape, dtype) -> np.ndarray:
    """Random bytes viewed as `dtype`: NaNs, infinities, anything."""
    uint = UINT[np.dtype(dtype)]
    return rng.integers(0, np.iinfo(uint).max, shape, dtype=uint, endpoint=True).view(dtype)


def f16_edge_values(rng) -> np.ndarray:
    """float32 values whose cast to float16 must round: ties, ±1 ulp of ties, tiny, huge."""
    lo = rng.integers(0, 0x7BFF, 200, dtype=np.uint16).view(np.float16)  # finite, below max
    hi = np.nextafter(lo, np.float16(np.inf))
    tie = (lo.astype(np.float32) + hi.astype(np.float32)) / np.float32(2)  # exact in float32
    near = [np.nextafter(tie, np.float32(np.inf)), np.nextafter(tie, np.float32(-np.inf))]
    special = np.float32(
        [0, 65504, 65519.99, 65520, 1e6, np.inf, 2**-24, 2**-25, 3 * 2**-26, 2**-26, 1e-9, 6e-5]
    )
    values = np.concatenate([tie, *near, special])
    return np.concatenate([values, -values])


def step_inputs(rng, dtype, shape) -> np.ndarray:
    """[MAX_WIDTH + 3, *shape] K or V rows: rounding edge cases, or every float16 bit pattern."""
    size = (MAX_WIDTH + 3, *shape)
    if dtype == np.float16:
        bits = rng.integers(0, 0xFFFF, size, dtype=np.uint16, endpoint=True)
        is_nan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x03FF) != 0)
        return np.where(is_nan, np.uint16(0x3C00), bits).view(np.float16)
    x = rng.standard_normal(size).astype(np.float32)
    pick = rng.random(size) < 0.7
    x[pick] = rng.choice(f16_edge_values(rng), int(pick.sum()))
    return x


def step_cells(rng, width: int, rows: int) -> np.ndarray:
    """[MAX_WIDTH] int32: distinct cells, about one in five -1; rows t >= width hold real cells."""
    cells = rng.permutation(rows)[:MAX_WIDTH].astype(np.int32)
    cells[:width][rng.random(width) < 0.2] = -1
    return cells


# -- scatter_kv ------------------------------------------------------------------


@OVERFLOW_IN_CAST
@pytest.mark.parametrize("shape", [(1, 1), (2, 3)], ids=["1x1", "2x3"])
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("storage", [np.float32, np.float16], ids=["f32pool", "f16pool"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32in", "f16in"])
def test_scatter_kv_writes_placed_rows_only(dtype, storage, width, shape):
    rng = np.random.default_rng([width, *shape, np.dtype(dtype).num, np.dtype(storage).num])
    rows = MAX_WIDTH + 7  # some rows are in no cell at all
    k, v = step_inputs(rng, dtype, shape), step_inputs(rng, dtype, shape)
    k_pool, v_pool = garbage(rng, (rows, *shape), storage), garbage(rng, (rows, *shape), storage)
    cells = step_cells(rng, width, rows)
    # reference
    expect_k, expect_v = k_pool.copy(), v_pool.copy()
    placed = cells[:width][cells[:width] >= 0]
    with np.errstate(over="ignore"):
        expect_k[placed] = k[:width][cells[:width] >= 0].astype(storage)
        expect_v[placed] = v[:width][cells[:width] >= 0].astype(storage)
    # device
    k_pool_d, v_pool_d = to_d(k_pool), to_d(v_pool)
    launch_scatter_kv(to_d(k), to_d(v), k_pool_d, v_pool_d, to_d(cells), width)
    got_k, got_v = k_pool_d.copy_to_host(), v_pool_d.copy_to_host()
    # compare: bit-exact, garbage rows included
    uint = UINT[np.dtype(storage)]
    np.testing.assert_array_equal(got_k.view(uint), expect_k.view(uint))
    np.testing.assert_array_equal(got_v.view(uint), expect_v.view(uint))


@OVERFLOW_IN_CAST
def test_scatter_kv_rounds_to_nearest_even():
    # ties 1 + 2**-11 (between 1 and 1 + 2**-10) go to even 1; 1 + 3 * 2**-11 goes up
    k = np.float32([1 + 2**-11, 1 + 3 * 2**-11, 65520, -(2**-25), 2**-25 + 2**-40])
    k = k.reshape(5, 1, 1)
    k_pool_d = to_d(np.zeros((5, 1, 1), np.float16))
    v_pool_d = to_d(np.zeros((5, 1, 1), np.float16))
    launch_scatter_kv(to_d(k), to_d(k), k_pool_d, v_pool_d, to_d(np.arange(5, dtype=np.int32)), 5)
    got = k_pool_d.copy_to_host().ravel()
    expect = np.float16([1, 1 + 2**-9, np.inf, -0.0, 2**-24])
    np.testing.assert_array_equal(got.view(np.uint16), expect.view(np.uint16))


def test_scatter_kv_refuses_a_width_past_its_arrays():
    cells_d = to_d(np.zeros(4, np.int32))
    k_d = to_d(np.zeros((4, 1, 1), np.float32))
    with pytest.raises(ValueError, match="width=5"):
        launch_scatter_kv(k_d, k_d, k_d, k_d, cells_d, 5)


# -- place_tokens ----------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
def test_place_tokens_sets_position_and_owner_bit(width):
    rng = np.random.default_rng(width)
    cell_pos = rng.integers(-1, 50, CAPACITY, dtype=np.int32)
    cell_owners = random_owners(rng, CAPACITY)
    cells = step_cells(rng, width, CAPACITY)
    positions = rng.integers(0, 1000, MAX_WIDTH, dtype=np.int32)
    seq_ids = rng.choice([*SEQ_IDS, 1, 100, 150], MAX_WIDTH).astype(np.int32)
    seq_ids[:width][cells[:width] < 0] = -1  # padded rows
    # reference
    expect_pos, expect_owners = cell_pos.copy(), cell_owners.copy()
    for t in range(width):
        if cells[t] >= 0:
            expect_pos[cells[t]] = positions[t]
            expect_owners[cells[t], seq_ids[t] // 64] |= bit_of(seq_ids[t])
    # device
    cell_pos_d, cell_owners_d = to_d(cell_pos), to_d(cell_owners)
    launch_place_tokens(
        to_d(cells), to_d(positions), to_d(seq_ids), width, cell_pos_d, cell_owners_d
    )
    # compare
    np.testing.assert_array_equal(cell_pos_d.copy_to_host(), expect_pos)
    np.testing.assert_array_equal(cell_owners_d.copy_to_host(), expect_owners)


def test_place_tokens_skips_a_row_without_a_sequence():
    # a real cell with seq_id -1 is not a token: writing only its position would leave a
    # cell with a position and no owner
    cell_pos_d = to_d(np.full(4, -1, np.int32))
    cell_owners_d = to_d(np.zeros((4, 1), np.uint64))
    cells, positions, seq_ids = (to_d(np.array(x, np.int32)) for x in ([2, 3], [5, 6], [-1, 0]))
    launch_place_tokens(cells, positions, seq_ids, 2, cell_pos_d, cell_owners_d)
    np.testing.assert_array_equal(cell_pos_d.copy_to_host(), [-1, -1, -1, 6])
    np.testing.assert_array_equal(cell_owners_d.copy_to_host().ravel(), [0, 0, 0, 1])


# -- verbs -----------------------------------------------------------------------


def verb_cells(rng, n: int) -> np.ndarray:
    """[n + 5] int32: n listed distinct cells (some -1), then 5 real cells past n."""
    cells = rng.permutation(CAPACITY)[: n + 5].astype(np.int32)
    cells[:n][rng.random(n) < 0.1] = -1
    return cells


@pytest.mark.parametrize("seq", SEQ_IDS)
@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK + 1, 2 * BLOCK + 3])
def test_add_owner_sets_the_bit_on_listed_cells(n, seq):
    rng = np.random.default_rng([n, seq])
    cell_owners = random_owners(rng, CAPACITY)
    cells = verb_cells(rng, n)
    # reference
    expect = cell_owners.copy()
    listed = cells[:n][cells[:n] >= 0]
    expect[listed, seq // 64] |= bit_of(seq)
    # device
    cell_owners_d = to_d(cell_owners)
    launch_add_owner(to_d(cells), n, seq, cell_owners_d)
    # compare
    np.testing.assert_array_equal(cell_owners_d.copy_to_host(), expect)


@pytest.mark.parametrize("seq", SEQ_IDS)
@pytest.mark.parametrize("n", [1, BLOCK - 1, BLOCK + 1, 2 * BLOCK + 3])
def test_drop_owner_clears_the_bit_and_frees_unowned_cells(n, seq):
    rng = np.random.default_rng([n, seq, 1])
    cell_pos = rng.integers(0, 50, CAPACITY, dtype=np.int32)
    cell_owners = random_owners(rng, CAPACITY)
    cells = verb_cells(rng, n)
    listed = cells[:n][cells[:n] >= 0]
    # listed cells: about half owned by seq alone (freed), the rest shared or not seq's
    alone = listed[rng.random(len(listed)) < 0.5]
    cell_owners[alone] = 0
    cell_owners[alone, seq // 64] = bit_of(seq)
    # reference
    expect_pos, expect_owners = cell_pos.copy(), cell_owners.copy()
    expect_owners[listed, seq // 64] &= ~bit_of(seq)
    unowned = listed[~expect_owners[listed].any(axis=1)]
    expect_pos[unowned] = -1
    assert len(unowned) >= len(alone)  # the test frees cells
    # device
    cell_pos_d, cell_owners_d = to_d(cell_pos), to_d(cell_owners)
    launch_drop_owner(to_d(cells), n, seq, cell_pos_d, cell_owners_d)
    # compare
    np.testing.assert_array_equal(cell_pos_d.copy_to_host(), expect_pos)
    np.testing.assert_array_equal(cell_owners_d.copy_to_host(), expect_owners)


@pytest.mark.parametrize("capacity", [1, BLOCK - 1, BLOCK + 1, CAPACITY])
def test_clear_table_frees_every_cell(capacity):
    rng = np.random.default_rng(capacity)
    cell_pos_d = to_d(rng.integers(-1, 50, capacity, dtype=np.int32))
    cell_owners_d = to_d(random_owners(rng, capacity) | np.uint64(1))
    launch_clear_table(cell_pos_d, cell_owners_d)
    assert (cell_pos_d.copy_to_host() == -1).all()
    assert (cell_owners_d.copy_to_host() == 0).all()


def test_verbs_with_n_zero_touch_nothing():
    cell_pos = np.arange(4, dtype=np.int32)
    cell_owners = np.ones((4, 1), np.uint64)
    cell_pos_d, cell_owners_d = to_d(cell_pos), to_d(cell_owners)
    cells_d = to_d(np.arange(4, dtype=np.int32))
    launch_add_owner(cells_d, 0, 5, cell_owners_d)
    launch_drop_owner(cells_d, 0, 0, cell_pos_d, cell_owners_d)
    np.testing.assert_array_equal(cell_pos_d.copy_to_host(), cell_pos)
    np.testing.assert_array_equal(cell_owners_d.copy_to_host(), cell_owners)


# -- write_mask ------------------------------------------------------------------


def check_write_mask(cell_pos, cell_owners, seq_ids, positions, width, read_len, window):
    """Runs launch_write_mask on a poisoned mask; compares the written region and the rest."""
    # reference
    expect = np.full((len(seq_ids), len(cell_pos)), POISON, np.uint8)
    for t in range(width):
        row = sees_by_hand(cell_pos, cell_owners, seq_ids[t], positions[t], window)
        expect[t, :read_len] = row[:read_len]
    # device
    mask_d = to_d(np.full(expect.shape, POISON, np.uint8))
    launch_write_mask(
        mask_d, to_d(cell_pos), to_d(cell_owners), to_d(seq_ids), to_d(positions),
        width, read_len, window,
    )  # fmt: skip
    got = mask_d.copy_to_host()
    # compare: the region, then the poison around it
    np.testing.assert_array_equal(got[:width, :read_len], expect[:width, :read_len])
    np.testing.assert_array_equal(got, expect)
    return got


def mask_inputs(rng, capacity: int = CAPACITY):
    """A random table and step, adversarial: seq ids at word edges, padding rows.

    Token 0 is real, and every real token owns a cell below BLOCK at its own position, so
    a row with read_len >= BLOCK always sees something.
    """
    cell_pos = rng.integers(-1, 40, capacity, dtype=np.int32)
    cell_owners = random_owners(rng, capacity)
    seq_ids = rng.choice([*SEQ_IDS, -1], MAX_WIDTH).astype(np.int32)
    seq_ids[0] = rng.choice(SEQ_IDS)
    positions = rng.integers(0, 40, MAX_WIDTH, dtype=np.int32)
    positions[seq_ids < 0] = -1
    for c in np.flatnonzero(rng.random(capacity) < 0.5):  # many cells of the step's seqs
        seq = seq_ids[rng.integers(MAX_WIDTH)]
        if seq >= 0:
            cell_owners[c, seq // 64] |= bit_of(seq)
    cells = rng.integers(0, BLOCK, MAX_WIDTH)
    for t in reversed(range(MAX_WIDTH)):  # token 0's cell last, so no later token takes it
        seq, position, c = seq_ids[t], positions[t], cells[t]
        if seq >= 0:
            cell_pos[c] = position
            cell_owners[c, seq // 64] |= bit_of(seq)
    return cell_pos, cell_owners, seq_ids, positions


@pytest.mark.parametrize("window", [0, 1, 2, 5, 1000])
@pytest.mark.parametrize("width", WIDTHS)
def test_write_mask_matches_the_rule(width, window):
    rng = np.random.default_rng([width, window])
    read_len = int(rng.integers(BLOCK + 1, CAPACITY))  # rarely a multiple of the block
    got = check_write_mask(*mask_inputs(rng), width, read_len, window)
    assert got[0, :read_len].any()  # the test is not vacuous


@pytest.mark.parametrize("read_len", [1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 3, CAPACITY])
def test_write_mask_writes_read_len_columns_only(read_len):
    rng = np.random.default_rng(read_len)
    check_write_mask(*mask_inputs(rng), BLOCK + 1, read_len, 3)


def test_write_mask_padding_rows_are_zero():
    rng = np.random.default_rng(7)
    cell_pos, cell_owners, seq_ids, positions = mask_inputs(rng)
    cell_owners[:] = ~np.uint64(0)  # every cell owned by everyone
    seq_ids[::2] = -1
    positions[::2] = 1000  # a padding row's position must not matter
    got = check_write_mask(cell_pos, cell_owners, seq_ids, positions, MAX_WIDTH, CAPACITY, 0)
    assert not got[::2].any()


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    width=st.integers(1, MAX_WIDTH),
    read_len=st.integers(1, CAPACITY),
    window=st.sampled_from([0, 1, 2, 3, 7, 10_000]),
)
def test_write_mask_random(seed, width, read_len, window):
    rng = np.random.default_rng(seed)
    check_write_mask(*mask_inputs(rng), width, read_len, window)


# -- against the reference table ------------------------------------------------


def ref_config(**overrides) -> CacheConfig:
    fields = dict(
        n_layers=2, n_kv_heads=1, head_dim=1, windows=(0, 3), capacity=CAPACITY,
        max_width=MAX_WIDTH, max_seqs=200, initial_cells=BLOCK,
    )  # fmt: skip
    fields.update(overrides)
    return CacheConfig(**fields)


def cache_with_ids(config: CacheConfig, live=SEQ_IDS) -> CellCache:
    """A reference cache whose live ids are `live`: ids at the edges of owner words."""
    cache = CellCache(config)
    for _ in range(max(live) + 1):
        cache.seq_new()
    for seq in set(range(max(live) + 1)) - set(live):
        cache.seq_rm(seq)
    return cache


def mirror_of(cache: CellCache) -> tuple[np.ndarray, np.ndarray]:
    """The reference table as [capacity] mirror arrays (cells past read_len free)."""
    snap = cache.snapshot()
    cell_pos = np.full(snap.capacity, -1, np.int32)
    cell_owners = np.zeros((snap.capacity, cache.config.n_owner_words), np.uint64)
    cell_pos[: snap.read_len] = snap.pos
    cell_owners[: snap.read_len] = snap.owners
    return cell_pos, cell_owners


def holds(cell_owners: np.ndarray, seq: int) -> np.ndarray:
    return (cell_owners[:, seq // 64] & bit_of(seq)) != 0


@settings(max_examples=15, deadline=None)
@given(
    ops=st.lists(st.integers(0, 400), min_size=5, max_size=40),
    window=st.sampled_from([0, 1, 2, 3, 5, 10_000]),
    seed=st.integers(0, 2**32 - 1),
)
def test_write_mask_matches_the_reference_window_mask(ops, window, seed):
    cache = cache_with_ids(ref_config())
    churn(cache, ops)
    snap = cache.snapshot()
    live = cache.live_seqs
    if snap.read_len == 0 or not live:
        return
    # a query step: tokens of live sequences at any position they could hold, then padding
    rng = np.random.default_rng(seed)
    width = int(rng.integers(1, MAX_WIDTH + 1))
    seq_ids = np.full(MAX_WIDTH, -1, np.int32)
    positions = np.full(MAX_WIDTH, -1, np.int32)
    n_tokens = int(rng.integers(1, width + 1))
    seq_ids[:n_tokens] = rng.choice(live, n_tokens)
    positions[:n_tokens] = [rng.integers(0, cache.pos(s) + 2) for s in seq_ids[:n_tokens]]
    # reference
    expect = window_mask(snap.pos, snap.owners, seq_ids[:width], positions[:width], window)
    # device
    cell_pos, cell_owners = mirror_of(cache)
    cell_pos[snap.read_len :] = 0  # past read_len: cells every token would see, if read
    cell_owners[snap.read_len :] = ~np.uint64(0)
    got = check_write_mask(cell_pos, cell_owners, seq_ids, positions, width, snap.read_len, window)
    # compare
    np.testing.assert_array_equal(got[:width, : snap.read_len], expect)


class DeviceMirror:
    """The table mirror driven by the kernels, as the device path drives it."""

    def __init__(self, config: CacheConfig):
        self.config = config
        self.cell_pos_d = to_d(np.full(config.capacity, -1, np.int32))
        self.cell_owners_d = to_d(np.zeros((config.capacity, config.n_owner_words), np.uint64))

    def step(self, step) -> None:
        """place_tokens from the step buffers; rows past the width hold live-looking junk."""
        width = step.width
        junk = np.arange(self.config.max_width, dtype=np.int32)
        cells, positions, seq_ids = junk.copy(), junk.copy(), junk.copy()
        cells[:width], positions[:width], seq_ids[:width] = (
            step.cells,
            step.positions,
            step.seq_ids,
        )
        launch_place_tokens(
            to_d(cells), to_d(positions), to_d(seq_ids), width, self.cell_pos_d, self.cell_owners_d
        )

    def add(self, cells: np.ndarray, seq: int) -> None:
        launch_add_owner(
            to_d(np.append(cells, 0).astype(np.int32)), len(cells), seq, self.cell_owners_d
        )

    def drop(self, cells: np.ndarray, seq: int) -> None:
        cells = np.append(cells, 0).astype(np.int32)  # never empty; the extra cell is past n
        launch_drop_owner(to_d(cells), len(cells) - 1, seq, self.cell_pos_d, self.cell_owners_d)

    def clear(self) -> None:
        launch_clear_table(self.cell_pos_d, self.cell_owners_d)

    def host(self) -> tuple[np.ndarray, np.ndarray]:
        return self.cell_pos_d.copy_to_host(), self.cell_owners_d.copy_to_host()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mirror_follows_the_reference_table(seed):
    rng = np.random.default_rng(seed)
    config = ref_config()
    cache = cache_with_ids(config)
    mirror = DeviceMirror(config)
    n_steps = 0
    for _ in range(40):
        live = cache.live_seqs
        before = mirror_of(cache)[1]
        kind = rng.choice(["step", "step", "step", "clone", "rewind", "rm", "new", "clear"])
        if kind == "clear" and rng.random() < 0.5:
            kind = "step"
        if kind == "new" or not live:
            cache.seq_new()
        elif kind == "step" and cache.free_cells:
            n = int(min(rng.integers(1, MAX_WIDTH + 1), cache.free_cells))
            cache.declare_step(rng.choice(live, n).tolist())
            step = cache.prepare_step(int(rng.integers(n, MAX_WIDTH + 1)))
            mirror.step(step)
            n_steps += 1
            for window in config.distinct_windows:  # the step's masks, from the mirror
                cell_pos, cell_owners = mirror.host()
                got = check_write_mask(
                    cell_pos, cell_owners, pad(step.seq_ids), pad(step.positions),
                    step.width, step.read_len, window,
                )  # fmt: skip
                np.testing.assert_array_equal(got[: step.width, : step.read_len], step.mask(window))
        elif kind == "clone" and len(live) < config.max_seqs:
            src = int(rng.choice(live))
            new = cache.seq_clone(src, upto=int(rng.integers(0, cache.pos(src) + 1)))
            mirror.add(np.flatnonzero(holds(mirror_of(cache)[1], new)), new)
        elif kind in ("rewind", "rm"):
            seq = int(rng.choice(live))
            if kind == "rm":
                cache.seq_rm(seq)
            else:
                cache.rewind(seq, int(rng.integers(0, cache.pos(seq) + 1)))
            after = mirror_of(cache)[1]
            mirror.drop(np.flatnonzero(holds(before, seq) & ~holds(after, seq)), seq)
        elif kind == "clear":
            cache.clear()
            mirror.clear()
            for _ in range(3):
                cache.seq_new()
        # compare after every verb
        expect_pos, expect_owners = mirror_of(cache)
        got_pos, got_owners = mirror.host()
        np.testing.assert_array_equal(got_pos, expect_pos)
        np.testing.assert_array_equal(got_owners, expect_owners)
    assert n_steps >= 5


def pad(x: np.ndarray) -> np.ndarray:
    """A step buffer at full size: [MAX_WIDTH] int32, junk past the step's width."""
    out = np.full(MAX_WIDTH, 7, np.int32)
    out[: len(x)] = x
    return out


# -- the position -> cell table (seq_cells) ----------------------------------------------


@pytest.mark.parametrize("width", [1, BLOCK + 1])
def test_record_tokens_writes_each_position_and_the_longest_length(width):
    # reference: tokens of 3 sequences (ids 0, 64, 199), one repeated, plus padding rows
    rng = np.random.default_rng(width)
    seq_ids = rng.choice([0, 64, 199], size=MAX_WIDTH).astype(np.int32)
    seq_ids[width // 2 :: 3] = -1  # padding inside the width is skipped
    positions = np.zeros(MAX_WIDTH, np.int32)
    for s in (0, 64, 199):
        positions[seq_ids == s] = 5 + np.arange(np.count_nonzero(seq_ids == s))
    cells = rng.permutation(CAPACITY)[:MAX_WIDTH].astype(np.int32)
    seq_cells = np.full((200, 64), -9, np.int32)
    seq_len = np.full(200, 5, np.int32)
    expect_cells, expect_len = seq_cells.copy(), seq_len.copy()
    for t in range(width):
        if seq_ids[t] >= 0:
            expect_cells[seq_ids[t], positions[t]] = cells[t]
            expect_len[seq_ids[t]] = max(expect_len[seq_ids[t]], positions[t] + 1)
    # device
    seq_cells_d, seq_len_d = to_d(seq_cells), to_d(seq_len)
    launch_record_tokens(to_d(cells), to_d(positions), to_d(seq_ids), width, seq_cells_d, seq_len_d)
    # compare
    np.testing.assert_array_equal(seq_cells_d.copy_to_host(), expect_cells)
    np.testing.assert_array_equal(seq_len_d.copy_to_host(), expect_len)


@pytest.mark.parametrize("upto", [0, 1, BLOCK, BLOCK + 3])
def test_copy_prefix_copies_a_row_and_sets_the_length(upto):
    seq_cells = np.arange(3 * 64, dtype=np.int32).reshape(3, 64)
    seq_len = np.array([40, 50, 7], np.int32)
    expect_cells, expect_len = seq_cells.copy(), seq_len.copy()
    expect_cells[2, :upto] = seq_cells[1, :upto]
    expect_len[2] = upto
    seq_cells_d, seq_len_d = to_d(seq_cells), to_d(seq_len)
    launch_copy_prefix(seq_cells_d, seq_len_d, 1, 2, upto)
    np.testing.assert_array_equal(seq_cells_d.copy_to_host(), expect_cells)
    np.testing.assert_array_equal(seq_len_d.copy_to_host(), expect_len)


def test_set_length_and_clear_lengths_touch_only_lengths():
    seq_cells = np.arange(3 * 8, dtype=np.int32).reshape(3, 8)
    seq_cells_d, seq_len_d = to_d(seq_cells), to_d(np.array([8, 6, 3], np.int32))
    launch_set_length(seq_len_d, 1, 2)
    assert seq_len_d.copy_to_host().tolist() == [8, 2, 3]
    launch_clear_lengths(seq_len_d)
    assert seq_len_d.copy_to_host().tolist() == [0, 0, 0]
    np.testing.assert_array_equal(seq_cells_d.copy_to_host(), seq_cells)
