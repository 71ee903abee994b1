"""The host table and the reference table driven alike: configs, a step's placement on
either, and comparisons of everything observable of the two."""

import numpy as np

from numbakv.cache.table import HostTable
from numbakv.config import CacheConfig
from numbakv.errors import CacheError
from numbakv.reference.table import CellTable

MAX_SEQS = (1, 3, 64, 65, 130)


def config(capacity: int, max_seqs: int, max_width: int = 8) -> CacheConfig:
    return CacheConfig(
        n_layers=1,
        n_kv_heads=1,
        head_dim=4,
        capacity=capacity,
        max_width=min(max_width, capacity),
        max_seqs=max_seqs,
    )


def ref_cells(snap, seq: int) -> np.ndarray:
    """[pos(seq)] int32: `seq`'s cells ordered by position, read off a reference snapshot."""
    word, bit = divmod(seq, 64)
    held = np.flatnonzero((snap.owners[:, word] >> np.uint64(bit)) & np.uint64(1))
    return held[np.argsort(snap.pos[held], kind="stable")].astype(np.int32)


def step(table, seq_ids) -> tuple[np.ndarray, np.ndarray]:
    """A step's placement, as prepare_step does it: find, then claim; (cells, positions)."""
    seq_ids = np.asarray(seq_ids, dtype=np.int32)
    cells = table.find_cells(len(seq_ids))
    if isinstance(table, HostTable):
        return cells, table.claim(cells, seq_ids)
    positions = table.positions_of(seq_ids)
    table.claim(cells, positions, seq_ids)
    return cells, positions


def assert_same(host: HostTable, ref: CellTable) -> None:
    """Everything observable of the two tables is equal."""
    expect = ref.snapshot(rows=0)
    assert host.snapshot(rows=0) == expect
    assert (host.read_len, host.used_cells, host.free_cells) == (
        ref.read_len,
        ref.used_cells,
        ref.free_cells,
    )
    np.testing.assert_array_equal(host.live, ref.live)
    for seq in np.flatnonzero(ref.live).tolist():
        assert host.length(seq) == ref.length(seq)
        np.testing.assert_array_equal(host.cells_of(seq), ref_cells(expect, seq))


def refuse_both(host_call, ref_call, host: HostTable, ref: CellTable):
    """Runs both calls; if either raises, both must raise the same class and change nothing.

    Returns (host result, ref result), or None when both refused.
    """
    before = ref.snapshot(rows=0)
    errors = []
    results = []
    for call in (host_call, ref_call):
        try:
            results.append(call())
            errors.append(None)
        except CacheError as exc:
            errors.append(type(exc))
    assert errors[0] == errors[1]
    if errors[0] is None:
        return tuple(results)
    assert host.snapshot(rows=0) == before
    assert ref.snapshot(rows=0) == before
    return None


def drive_both(cfg: CacheConfig, ops) -> None:
    """Runs `ops` (callables taking a table, returning plain values) on both tables alike."""
    host, ref = HostTable(cfg), CellTable(cfg)
    for op in ops:
        assert op(host) == op(ref)
        assert_same(host, ref)


def new_id(table) -> int:
    return table.seq_new()


def clone_id(table, src: int, upto: int) -> int:
    """The id seq_clone gave (the host returns (id, cells), the reference the id)."""
    got = table.seq_clone(src, upto)
    return got[0] if isinstance(got, tuple) else got


def step_cells(table, seq_ids) -> list[int]:
    return step(table, seq_ids)[0].tolist()


def remove(table, seq: int) -> None:
    table.seq_rm(seq)
