"""The naive table model the reference workload test holds the reference to, and the configs
it draws: dicts, lists and sets, nothing shared with `reference/`."""

from hypothesis import strategies as st

from numbakv.config import TOLERANCE, CacheConfig

# global, 1, 2, odd, even, and wider than any history (capacity <= 64)
WINDOWS = (0, 1, 2, 3, 4, 5, 8, 100)
TOL = dict(rtol=TOLERANCE["float32"], atol=TOLERANCE["float32"])  # float32 arithmetic


@st.composite
def configs(draw, max_seqs: int) -> tuple[CacheConfig, int]:
    """(config, n_heads): a small cache that grows often."""
    n_layers = draw(st.integers(1, 3))
    windows = tuple(draw(st.lists(st.sampled_from(WINDOWS), min_size=n_layers, max_size=n_layers)))
    n_kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from((1, 2, 4)))
    config = CacheConfig(
        n_layers=n_layers,
        n_kv_heads=n_kv_heads,
        head_dim=draw(st.sampled_from((12, 16, 20))),
        capacity=draw(st.one_of(st.integers(24, 32), st.integers(24, 64))),  # often nearly full
        max_width=draw(st.integers(1, 12)),
        max_seqs=max_seqs,
        windows=windows,
        initial_cells=draw(st.integers(1, 8)),
        dtype=draw(st.sampled_from(("float32", "float16", "bfloat16"))),
    )
    return config, group * n_kv_heads


class TableModel:
    """The cell table as plain Python: no bitsets, no numpy."""

    def __init__(self, capacity: int, max_seqs: int):
        self.capacity = capacity
        self.max_seqs = max_seqs
        self.clear()

    def clear(self) -> None:
        self.seqs: dict[int, list[int]] = {}  # live id -> its cells, index = position
        self.cell_pos: dict[int, int] = {}  # occupied cell -> position
        self.cell_owners: dict[int, set[int]] = {}  # occupied cell -> owning ids

    @property
    def read_len(self) -> int:
        return max(self.cell_pos) + 1 if self.cell_pos else 0

    @property
    def used_cells(self) -> int:
        return len(self.cell_pos)

    @property
    def free_cells(self) -> int:
        return self.capacity - len(self.cell_pos)

    @property
    def live(self) -> list[int]:
        return sorted(self.seqs)

    @property
    def dead(self) -> list[int]:
        return [s for s in range(self.max_seqs) if s not in self.seqs]

    def seq_new(self) -> int:
        seq = self.dead[0]  # the lowest free id
        self.seqs[seq] = []
        return seq

    def seq_clone(self, src: int, upto: int) -> int:
        seq = self.dead[0]
        self.seqs[seq] = list(self.seqs[src][:upto])
        for cell in self.seqs[seq]:
            self.cell_owners[cell].add(seq)
        return seq

    def _leave(self, seq: int, cells: list[int]) -> None:
        for cell in cells:
            self.cell_owners[cell].remove(seq)
            if not self.cell_owners[cell]:
                del self.cell_owners[cell]
                del self.cell_pos[cell]

    def seq_rm(self, seq: int) -> None:
        self._leave(seq, self.seqs.pop(seq))

    def rewind(self, seq: int, position: int) -> None:
        self._leave(seq, self.seqs[seq][position:])
        self.seqs[seq] = self.seqs[seq][:position]

    def place(self, seq_ids: list[int]) -> tuple[list[int], list[int]]:
        """(cells, positions) of the declared tokens, then claims the cells."""
        positions, seen = [], {}
        for seq in seq_ids:
            positions.append(len(self.seqs[seq]) + seen.get(seq, 0))
            seen[seq] = seen.get(seq, 0) + 1
        cells, cell = [], 0
        for _ in seq_ids:  # each pick scans on from the previous pick
            while cell in self.cell_pos:
                cell += 1
            cells.append(cell)
            cell += 1
        assert cells[-1] < self.capacity
        for cell, seq, p in zip(cells, seq_ids, positions, strict=True):
            assert len(self.seqs[seq]) == p
            self.seqs[seq].append(cell)
            self.cell_pos[cell] = p
            self.cell_owners[cell] = {seq}
        return cells, positions

    def mask(self, seq_ids: list[int], positions: list[int], width: int, window: int) -> list:
        """[width][read_len] of 0/1 by the mask rule; rows past the declared tokens are 0."""
        rows = []
        for t in range(width):
            row = [0] * self.read_len
            if t < len(seq_ids):
                seq, p = seq_ids[t], positions[t]
                for cell in range(self.read_len):
                    if cell not in self.cell_pos or seq not in self.cell_owners[cell]:
                        continue
                    held = self.cell_pos[cell]
                    if held <= p and (window == 0 or held > p - window):
                        row[cell] = 1
            rows.append(row)
        return rows


def assert_matches(model: TableModel, cache) -> None:
    """Everything observable of `cache`'s table equals `model`: cells, owners, live ids,
    read_len, rows, used and free cells, each sequence's length."""
    cfg = cache.config
    snap = cache.snapshot()
    # model
    expect_pos = [model.cell_pos.get(c, -1) for c in range(cfg.capacity)]
    expect_owners = [sorted(model.cell_owners.get(c, ())) for c in range(cfg.capacity)]
    expect_live = [s in model.seqs for s in range(cfg.max_seqs)]
    # compare: a snapshot may stop at read_len (every cell past it is free)
    assert model.read_len <= len(snap.pos) <= cfg.capacity
    assert len(snap.owners) == len(snap.pos)
    got_pos = snap.pos.tolist() + [-1] * (cfg.capacity - len(snap.pos))
    assert got_pos == expect_pos
    got_owners = [
        snap.owners_of(c) if c >= len(snap.owners) or snap.owners[c].any() else []
        for c in range(cfg.capacity)
    ]
    assert got_owners == expect_owners
    assert snap.live.tolist() == expect_live
    assert cache.live_seqs == model.live
    assert snap.read_len == cache.read_len == model.read_len
    assert model.read_len <= snap.rows == cache.rows <= cfg.capacity  # storage for every cell
    assert cache.used_cells == model.used_cells
    assert cache.free_cells == model.free_cells
    for seq, cells in model.seqs.items():
        assert cache.pos(seq) == len(cells)
    # the model's own invariant: each live sequence holds positions 0 .. pos-1
    for seq, cells in model.seqs.items():
        assert [model.cell_pos[c] for c in cells] == list(range(len(cells)))
        assert all(seq in model.cell_owners[c] for c in cells)
