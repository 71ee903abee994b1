"""The table mirror's kernels (add_owner, drop_owner, clear_table, prepare_tokens,
copy_prefix, set_length, clear_lengths), alone and driven like the device path against the
reference table; listed cells only, everything else byte for byte unchanged."""

import numpy as np
import pytest

from numbakv import CacheConfig
from numbakv.cache.kernels.placement import launch_prepare_tokens
from numbakv.cache.kernels.seq_cells import (
    launch_clear_lengths,
    launch_copy_prefix,
    launch_set_length,
)
from numbakv.cache.kernels.verbs import launch_add_owner, launch_clear_table, launch_drop_owner

from kernel_inputs import (
    BLOCK,
    CAPACITY,
    MAX_WIDTH,
    SEQ_IDS,
    bit_of,
    cache_with_ids,
    check_write_mask,
    holds,
    mirror_of,
    random_owners,
    ref_config,
    step_buffer,
    to_d,
)

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


class DeviceMirror:
    """The table mirror and the position -> cell table driven by the kernels, as the device
    path drives them."""

    def __init__(self, config: CacheConfig):
        self.config = config
        self.cell_pos_d = to_d(np.full(config.capacity, -1, np.int32))
        self.cell_owners_d = to_d(np.zeros((config.capacity, config.n_owner_words), np.uint64))
        self.seq_cells_d = to_d(np.full((config.max_seqs, config.max_seq_len), -1, np.int32))
        self.seq_len_d = to_d(np.zeros(config.max_seqs, np.int32))

    def step(self, step) -> None:
        """prepare_tokens from the step buffer; columns past the width hold live-looking junk."""
        width = step.width
        junk = np.arange(self.config.max_width, dtype=np.int32)  # real cells, ids, positions
        cells, positions, seq_ids = junk.copy(), junk.copy(), junk.copy()
        cells[:width], positions[:width], seq_ids[:width] = (
            step.cells,
            step.positions,
            step.seq_ids,
        )
        step_d = to_d(step_buffer(cells, positions, seq_ids, width, step.read_len))
        launch_prepare_tokens(
            step_d, width, self.cell_pos_d, self.cell_owners_d, self.seq_cells_d, self.seq_len_d
        )

    def add(self, cells: np.ndarray, seq: int) -> None:
        launch_add_owner(
            to_d(np.append(cells, 0).astype(np.int32)), len(cells), seq, self.cell_owners_d
        )

    def clone(self, src: int, seq: int, upto: int) -> None:
        launch_copy_prefix(self.seq_cells_d, self.seq_len_d, src, seq, upto)

    def drop(self, cells: np.ndarray, seq: int, length: int) -> None:
        cells = np.append(cells, 0).astype(np.int32)  # never empty; the extra cell is past n
        launch_drop_owner(to_d(cells), len(cells) - 1, seq, self.cell_pos_d, self.cell_owners_d)
        launch_set_length(self.seq_len_d, seq, length)

    def clear(self) -> None:
        launch_clear_table(self.cell_pos_d, self.cell_owners_d)
        launch_clear_lengths(self.seq_len_d)

    def host(self) -> tuple[np.ndarray, np.ndarray]:
        return self.cell_pos_d.copy_to_host(), self.cell_owners_d.copy_to_host()

    def seq_table(self) -> tuple[np.ndarray, np.ndarray]:
        return self.seq_cells_d.copy_to_host(), self.seq_len_d.copy_to_host()


def check_seq_table(cache, mirror: DeviceMirror) -> None:
    """Each live sequence's length and cells by position, as the reference table holds them;
    dead ids hold no length."""
    expect_pos, expect_owners = mirror_of(cache)
    seq_cells, seq_len = mirror.seq_table()
    live = set(cache.live_seqs)
    for seq in range(cache.config.max_seqs):
        if seq not in live:
            assert seq_len[seq] == 0, seq
            continue
        mine = np.flatnonzero(holds(expect_owners, seq))
        mine = mine[np.argsort(expect_pos[mine])]
        assert seq_len[seq] == cache.pos(seq) == len(mine), seq
        np.testing.assert_array_equal(seq_cells[seq, : len(mine)], mine, err_msg=str(seq))


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
            mirror.clone(src, new, cache.pos(new))
        elif kind in ("rewind", "rm"):
            seq = int(rng.choice(live))
            if kind == "rm":
                cache.seq_rm(seq)
            else:
                cache.rewind(seq, int(rng.integers(0, cache.pos(seq) + 1)))
            after = mirror_of(cache)[1]
            length = cache.pos(seq) if kind == "rewind" else 0
            mirror.drop(np.flatnonzero(holds(before, seq) & ~holds(after, seq)), seq, length)
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
        check_seq_table(cache, mirror)
    assert n_steps >= 5


def pad(x: np.ndarray) -> np.ndarray:
    """A step buffer at full size: [MAX_WIDTH] int32, junk past the step's width."""
    out = np.full(MAX_WIDTH, 7, np.int32)
    out[: len(x)] = x
    return out


# -- the position -> cell table (seq_cells) ----------------------------------------------


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
