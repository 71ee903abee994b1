"""Inputs the kernel tests share: sizes that straddle the launch block, poison, float16
edge values, random owner bitsets, step buffers with junk past the width, and the
reference table as mirror arrays."""

import numpy as np
import pytest

from numbakv import CacheConfig
from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels.launch import SIM_THREADS, THREADS
from numbakv.cache.kernels.masks import launch_write_masks
from numbakv.cache.kernels.step_buffer import CELLS, POSITIONS, SCALARS, host_step
from numbakv.cache.kernels.step_buffer import SEQ_IDS as SEQ_ID_ROW
from numbakv.reference import CellCache

BLOCK = SIM_THREADS if IS_SIMULATOR else THREADS  # threads per block of every launch
MAX_WIDTH = BLOCK + 8
WIDTHS = [1, BLOCK - 1, BLOCK, BLOCK + 1, MAX_WIDTH]
CAPACITY = 3 * BLOCK + 5  # not a multiple of the block
SEQ_IDS = [0, 63, 64, 127, 199]  # first and last bit of words 0 and 1, and word 3
N_WORDS = 4  # owner words for 200 sequence ids
POISON = 0xAB
SCALAR_JUNK = 1 << 20  # the SCALARS row past WIDTH and READ_LEN: a width no kernel may take
# the simulator casts float32 -> float16 with NumPy, in kernel threads, where errstate
# does not reach: 65520 -> inf warns there (and is what a GPU's cvt.rn.f16.f32 gives)
OVERFLOW_IN_CAST = pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float16): np.uint16}


def to_d(x):
    return cuda.to_device(np.ascontiguousarray(x))


def bit_of(seq: int) -> np.uint64:
    return np.uint64(1) << np.uint64(seq % 64)


def sees_by_hand(cell_pos, cell_owners, seq, position, window) -> np.ndarray:
    """[len(cell_pos)] uint8: the mask rule of docs/contract.md §3 spelled out cell by cell."""
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


def step_buffer(cells, positions, seq_ids, width: int, read_len: int = 0) -> np.ndarray:
    """[4, len(cells)] int32 host step buffer of the first `width` tokens of the [columns]
    arrays, built by `host_step`, with the arrays' own values kept in the columns past the
    width (live-looking junk a kernel must ignore) and SCALAR_JUNK in the SCALARS row past
    the two scalars."""
    columns = len(cells)
    assert len(positions) == len(seq_ids) == columns >= max(width, 2)
    step = host_step(cells[:width], positions[:width], seq_ids[:width], read_len, columns)
    assert step.shape == (4, columns) and (step[:SCALARS, width:] == -1).all()
    assert step[SCALARS, :2].tolist() == [width, read_len]
    for row, values in ((CELLS, cells), (POSITIONS, positions), (SEQ_ID_ROW, seq_ids)):
        step[row, width:] = values[width:]
    step[SCALARS, 2:] = SCALAR_JUNK
    return step


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


def check_write_mask(cell_pos, cell_owners, seq_ids, positions, width, read_len, window):
    """Runs launch_write_masks on a poisoned stack of two masks, `window` and another one
    (every window is written by one launch); compares each written region and the rest.
    seq_ids, positions: [columns] int32, junk past the width (the step buffer keeps it).
    Returns `window`'s mask."""
    windows = (window, 1 if window != 1 else 0)
    # reference
    expect = np.full((2, len(seq_ids), len(cell_pos)), POISON, np.uint8)
    for i, w in enumerate(windows):
        for t in range(width):
            row = sees_by_hand(cell_pos, cell_owners, seq_ids[t], positions[t], w)
            expect[i, t, :read_len] = row[:read_len]
    # device: the step's cells are junk (write_masks reads none), real cells past the width
    cells = np.arange(len(seq_ids), dtype=np.int32) % len(cell_pos)
    step = step_buffer(cells, positions, seq_ids, width, read_len)
    masks_d = to_d(np.full(expect.shape, POISON, np.uint8))
    windows_d = to_d(np.array(windows, np.int32))
    launch_write_masks(masks_d, windows_d, to_d(cell_pos), to_d(cell_owners), to_d(step), width)
    got = masks_d.copy_to_host()
    # compare: the regions, then the poison around them
    np.testing.assert_array_equal(got[:, :width, :read_len], expect[:, :width, :read_len])
    np.testing.assert_array_equal(got, expect)
    return got[0]
