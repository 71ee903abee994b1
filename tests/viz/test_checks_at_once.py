"""The checks of a loading trace read every change at once. Their first form, a replay of
the table frame by frame checking each frame against the table before it (`Replay` here,
as numbakv 1.0 made them), is the oracle: on traces damaged one value at a time, both
refuse the same traces with the same message, and accept the same."""

import numpy as np
import pytest

from numbakv.core.config import CacheConfig
from numbakv.core.errors import TraceError
from numbakv.core.snapshot import FREE, SHARED
from numbakv.trace import checks, sweep
from numbakv.trace.scan import TableReplay, id_bits, owner_bits, previous_changes

import trace_variants as fuzz

TABLE = ("delta_cells", "delta_pos", "delta_codes", "toggle_counts", "toggle_seqs", "read_len",
         "rows", "live", "step_cells", "step_positions", "step_seq_ids")  # fmt: skip
_first = checks._first


def frame_by_frame(config, arrays) -> str | None:
    """What the checks of numbakv 1.0 say of `arrays` (the table replayed from frame 0):
    the message of the first rule broken, or None."""
    try:
        for check in (checks._check_layout, checks._check_values, checks._check_rows):
            check(config, arrays)
        Replay(config, arrays).run()
    except TraceError as error:
        return str(error)
    return None


def at_once(config, arrays) -> str | None:
    try:
        checks.check_arrays(config, arrays)
    except TraceError as error:
        return str(error)
    return None


def damaged(arrays: dict, rng: np.random.Generator) -> dict:
    """A copy of `arrays` with one value of one table array nudged (+-1, -1, 0, a bit, +2),
    or two neighbours of one swapped."""
    name = TABLE[int(rng.integers(len(TABLE)))]
    array = arrays[name].copy()
    if array.size < 2:
        return arrays
    flat = array.reshape(-1)
    i = int(rng.integers(flat.size - 1))
    if rng.random() < 0.2:
        flat[[i, i + 1]] = flat[[i + 1, i]]
    elif flat.dtype == np.bool_:
        flat[i] = not flat[i]
    else:
        old, bit = int(flat[i]), int(rng.integers(8 * flat.itemsize - 1))
        new = [old + 1, old - 1, -1, 0, old ^ (1 << bit), old + 2][int(rng.integers(6))]
        flat[i] = np.array(new, dtype=np.int64).astype(flat.dtype)
    return dict(arrays, **{name: array})


@pytest.mark.parametrize("seed", range(6))
def test_damaged_tables_are_refused_as_the_replay_refuses_them(seed, monkeypatch):
    trace = fuzz.record(seed)
    # owned cells counted for every frame at once, one frame at a time, or three
    blocks = [sweep.OWNED_AT_ONCE, 1, 3 * trace.config.max_seqs][seed % 3]
    monkeypatch.setattr(sweep, "OWNED_AT_ONCE", blocks)
    rng = np.random.default_rng(seed)
    refused = 0
    for _ in range(300):
        arrays = trace.arrays
        for _ in range(int(rng.integers(1, 3))):
            arrays = damaged(arrays, rng)
        expect = frame_by_frame(trace.config, arrays)
        assert at_once(trace.config, arrays) == expect
        refused += expect is not None
    assert refused > 150


@pytest.mark.parametrize("seed", range(4))
def test_a_good_trace_is_accepted_with_what_each_change_found(seed):
    """The changes by cell the checks leave the trace: each change's change before, how
    many owners it leaves its cell, and the owner bitset a change to SHARED leaves when a
    plain change follows it (and takes those owners away), as a replay finds them."""
    trace = fuzz.record(seed)
    a, config = trace.arrays, trace.config
    assert frame_by_frame(config, a) is None
    index = checks.check_arrays(config, a)
    np.testing.assert_array_equal(index.previous, previous_changes(a))
    codes = a["delta_codes"]
    over = index.previous[codes != SHARED]  # what each plain change follows
    ended = np.sort(over[(over >= 0) & (codes[over] == SHARED)])
    np.testing.assert_array_equal(index.owners[0], ended)
    replay = TableReplay(a, int(a["read_len"].max(initial=0)) + 1, config.n_owner_words)
    offsets, kept = a["delta_offsets"], 0
    for f in range(trace.n_frames):
        owners = replay.owners[replay.apply(f)]
        changes = np.arange(offsets[f], offsets[f + 1])
        np.testing.assert_array_equal(index.n_owners[changes], np.bitwise_count(owners).sum(1))
        sets = owners[np.isin(changes, ended)]
        np.testing.assert_array_equal(index.owners[1][kept : kept + len(sets)], sets)
        kept += len(sets)
    assert kept == len(ended)


# -- the oracle: numbakv 1.0's replay, frame by frame -----------------------------------


class Replay:
    """The table replayed frame by frame, each frame's changes checked against the table
    before them (`scan.TableReplay`), with each id's owned cells counted."""

    def __init__(self, config: CacheConfig, a: dict[str, np.ndarray]):
        self.config, self.a = config, a
        self.table = TableReplay(a, int(a["read_len"].max(initial=0)) + 1, config.n_owner_words)
        self.codes = np.full(len(self.table.pos), FREE, dtype=np.int32)
        self.owned = np.zeros(config.max_seqs, dtype=np.int64)  # cells each id owns
        self.steps = a["step_offsets"]

    def run(self) -> None:
        n_cells = len(self.table.pos) - 1
        for f in range(len(self.a["events"])):
            cells = self.table.changes(f)[0]
            if len(cells) and cells[-1] >= n_cells:  # past every read_len: never in bounds
                raise TraceError(
                    f"cell {cells[-1]} is occupied from frame {f} while read_len drops to "
                    f"{self.a['read_len'][f]}; every occupied cell lies below read_len"
                )
            self._check_frame(f)
            self._check_extent(f)
            if self.steps[f + 1] > self.steps[f]:
                self._check_step(f)

    def _check_frame(self, f: int) -> None:
        table, codes, a = self.table, self.codes, self.a
        cells, pos, new = table.changes(f)
        if (i := _first(cells[1:] <= cells[:-1])) is not None:
            raise TraceError(f"frame {f} lists cell {cells[i + 1]} out of order or twice")
        rows, ids, gained = table.toggles(f)
        old = codes[cells]
        if (i := _first(np.diff(rows * self.config.max_seqs + ids) <= 0)) is not None:
            raise TraceError(
                f"frame {f} flips an owner of cell {cells[rows[i + 1]]} out of order or twice"
            )
        words, bits = id_bits(ids)
        had = (table.owners[cells[rows], words] & bits) != 0
        if (t := _first(had == gained)) is not None:
            raise TraceError(
                f"frame {f} {'gives' if gained[t] else 'takes'} cell {cells[rows[t]]} owner "
                f"{ids[t]}, which it {'has' if had[t] else 'lacks'} already"
            )
        flipped = np.zeros(len(cells), dtype=bool)
        flipped[rows] = True
        same = (pos == table.pos[cells]) & (new == old) & ~flipped
        if (i := _first(same)) is not None:
            if old[i] == FREE:
                raise TraceError(f"frame {f} frees cell {cells[i]}, which was never occupied")
            raise TraceError(f"frame {f} records cell {cells[i]} changing to the state it had")
        plain, n_ids = new != SHARED, self.config.max_seqs  # a plain change sets all owners
        self.owned -= np.bincount(old[plain & (old >= 0)], minlength=n_ids)
        self.owned -= _id_counts(table.owners[cells[plain & (old == SHARED)]], n_ids)
        self.owned += np.bincount(new[plain & (new >= 0)], minlength=n_ids)
        self.owned += np.bincount(ids, np.where(gained, 1, -1), n_ids).astype(np.int64)
        table.apply(f)
        codes[cells] = new
        self._check_shared(f, cells[~plain])
        dead = (self.owned > 0) & ~a["live"][f]
        if (s := _first(dead)) is not None:
            word, bit = s // 64, np.uint64(1) << np.uint64(s % 64)
            cell = _first(table.owners[:, word] & bit)
            raise TraceError(
                f"cell {cell} is owned by sequence {s} at frame {f} while that sequence is not live"
            )

    def _check_shared(self, f: int, cells: np.ndarray) -> None:
        """The toggles leave each of `cells` (changed to SHARED) several owners."""
        counts = np.bitwise_count(self.table.owners[cells]).sum(axis=1)
        if (i := _first(counts < 2)) is not None:
            raise TraceError(
                f"frame {f}'s toggles leave cell {cells[i]} {counts[i]} owners; its code "
                f"{SHARED} says several"
            )

    def _check_extent(self, f: int) -> None:
        """Every occupied cell lies below read_len, and the one just below is occupied."""
        read_len, pos = self.a["read_len"], self.table.pos
        cells, new_pos, _ = self.table.changes(f)
        before = read_len[f - 1] if f else 0
        occupied = np.concatenate(
            [cells[new_pos >= 0], np.flatnonzero(pos[read_len[f] : before] >= 0) + read_len[f]]
        )
        if (i := _first(occupied >= read_len[f])) is not None:
            raise TraceError(
                f"cell {occupied[i]} is occupied from frame {f} while read_len drops to "
                f"{read_len[f]}; every occupied cell lies below read_len"
            )
        if read_len[f] > 0 and pos[read_len[f] - 1] < 0:
            raise TraceError(
                f"frame {f}'s read_len {read_len[f]} is not trimmed: cell {read_len[f] - 1} is free"
            )

    def _check_step(self, f: int) -> None:
        """Each real row's cell holds the token's position and its sequence alone."""
        a, rows = self.a, slice(self.steps[f], self.steps[f + 1])
        seqs = a["step_seq_ids"][rows]
        real = seqs >= 0
        c, p, s = a["step_cells"][rows][real], a["step_positions"][rows][real], seqs[real]
        held_pos, held = self.table.pos[c], self.codes[c]
        if (i := _first((held_pos != p) | (held != s))) is not None:
            raise TraceError(
                f"frame {f}'s step puts sequence {s[i]} position {p[i]} in cell {c[i]}, but "
                f"the table holds position {held_pos[i]} there, or other owners"
            )


def _id_counts(owners: np.ndarray, n_ids: int) -> np.ndarray:
    """[n_ids] int64: how many of the bitsets `owners` ([k, words] uint64) hold each id."""
    return np.bincount(owner_bits(owners)[1], minlength=n_ids)[:n_ids]
