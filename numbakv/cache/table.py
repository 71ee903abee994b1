"""`HostTable`: the cell table of docs/contract.md §2 for the device path, every verb
costing its cells.

The state the contract names is kept as the reference keeps it, so snapshots of the two
compare equal:

    pos      : [capacity] int32, the position each cell holds, -1 = free
    owners   : [capacity, n_owner_words] uint64, bit `s % 64` of word `s // 64` = sequence s
    live     : [max_seqs] bool

Beside it, the indexes that make each verb cost the cells it touches, never capacity:

    n_owners : [capacity] int32, owner bits set in each cell, so freeing a cell is O(1)
    trees    : two bit trees over the cells (`bittree`), [FREE] 1 = free and [OCC]
               1 = occupied: the lowest free cell at or after c, and the highest occupied
               cell (to trim read_len), in O(log64 capacity) words
    id tree  : a bit tree over sequence ids, 1 = free, for `seq_new`'s lowest free id
    segments : each sequence's cells in position order (`arena.Segments`)

Placement is docs/contract.md §2's: tokens in declaration order take the lowest free cells.
Every cell at or past `read_len` is free, so "the lowest free cells" are the holes below
`read_len` first, then `read_len`, `read_len + 1`, ...: one search in the free tree gives
both. The njit kernels of placement are in `place` (a step costs one numba dispatch there).

Example (a prefill step, a decode step, a removal, a decode step):

    [a, a, a, b, b]   -> cells 0 1 2 3 4, positions 0 1 2 0 1
    [b, a]            -> cells 5 6, positions 2 3; read_len 7
    seq_rm(a)         -> returns [0, 1, 2, 6]; read_len trims to 6 (b holds 3 4 5)
    [b]               -> cell 0, position 3: the hole refills before read_len grows
"""

import numbakv.cache.device  # noqa: F401, I001  (sets numba's simulator flag before numba is imported)

import numba
import numpy as np

from numbakv.cache import arena, place
from numbakv.cache.arena import Segments
from numbakv.cache.bittree import (
    ONE,
    fill_tree,
    is_consistent,
    level_bits,
    lowest_set_bits,
    new_tree,
    tree_clear,
    tree_next,
    tree_prev,
    tree_set,
)
from numbakv.cache.place import ARENA, FREE, OCC, READ_LEN, USED
from numbakv.core.calls import check_live, check_position
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError
from numbakv.core.snapshot import Snapshot


class HostTable:
    """Which cell holds which position of which sequences, with O(cells touched) verbs.

    Per step, `check_declaration` asks `admits` of the declared ids (one njit pass), and
    the device cache, once the pool has grown to read_len + n rows, calls `place` (one njit
    call: find, then claim). `find_cells` (pure) and `claim` are the same two halves apart.
    The verbs `seq_new`, `seq_clone`, `seq_rm`, `rewind`, `clear` return the cells they
    touched so that the device mirror can follow. Every refused call raises before it
    changes anything.
    """

    def __init__(self, config: CacheConfig):
        self.config = config
        capacity, max_seqs = config.capacity, config.max_seqs
        self._pos = np.full(capacity, -1, dtype=np.int32)
        self._owners = np.zeros((capacity, config.n_owner_words), dtype=np.uint64)
        self._n_owners = np.zeros(capacity, dtype=np.int32)
        self._live = np.zeros(max_seqs, dtype=bool)
        bits, self._offs = new_tree(capacity)
        self._trees = np.stack([bits, bits])
        self._id_bits, self._id_offs = new_tree(max_seqs)  # 1 = free id
        self._meta = np.zeros(4, dtype=np.int64)  # READ_LEN, USED, the arena's TOP, GARBAGE
        self._touched: list[np.ndarray] = []  # cells the verbs touched since take_touched
        self._segments = Segments(max_seqs, self._meta[ARENA:])
        # what the njit verbs take, in their order (the arrays are filled, never replaced)
        self._arrays = self._pos, self._owners, self._n_owners, self._trees, self._offs, self._meta
        self.clear()

    # -- state -----------------------------------------------------------------

    @property
    def read_len(self) -> int:
        """Every occupied cell lies in [0, read_len)."""
        return int(self._meta[READ_LEN])

    @property
    def used_cells(self) -> int:
        return int(self._meta[USED])

    @property
    def free_cells(self) -> int:
        return self.config.capacity - int(self._meta[USED])

    @property
    def live(self) -> np.ndarray:
        """[max_seqs] bool, a read-only view: which sequence ids are live."""
        view = self._live.view()
        view.flags.writeable = False
        return view

    def check_live(self, seq) -> int:
        """`seq` as an int; SequenceError when it is not an integer or not a live id."""
        return check_live(seq, self._live)

    def admits(self, seq_ids: np.ndarray, max_seq_len: int = 0) -> bool:
        """Whether every id of `seq_ids` ([n] integers, any dtype) is a live id and, for
        max_seq_len > 0, no sequence would pass max_seq_len positions with one more token
        per entry; one njit pass (`check_declaration`'s, before it checks id by id or counts
        with NumPy to name what is wrong)."""
        return _admits(seq_ids, self._live, self._segments.seg[arena.LEN], max_seq_len)

    def length(self, seq: int) -> int:
        """pos(seq): positions `seq` holds (0 for a free id). `seq` is not checked."""
        return self._segments.length(seq)

    def cells_of(self, seq: int) -> np.ndarray:
        """[pos(seq)] int32, a copy: `seq`'s cells in position order. `seq` is not checked."""
        return self._segments.cells(seq)

    def cells_state(self, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([n] int32 pos, [n, n_owner_words] uint64 owners) of `cells` ([n] ints in [0,
        capacity)), copies."""
        return self._pos[cells], np.take(self._owners, cells, axis=0)  # rows: faster than [cells]

    def take_touched(self) -> np.ndarray:
        """[n] int32: every cell a verb or placement touched since the last call (repeats
        allowed); O(cells touched)."""
        touched = np.concatenate([np.zeros(0, np.int32), *self._touched]).astype(np.int32)
        self._touched = []
        return touched

    def snapshot(self, rows: int) -> Snapshot:
        """A host copy of cells [0, read_len) and the live ids; O(read_len)."""
        read_len = self.read_len
        return Snapshot(
            pos=self._pos[:read_len].copy(),
            owners=self._owners[:read_len].copy(),
            live=self._live.copy(),
            read_len=read_len,
            capacity=self.config.capacity,
            rows=rows,
        )

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        """Reserves the lowest free id: live, empty. CapacityError when every id is live."""
        seq = self.next_id()
        self._take_id(seq)
        return seq

    def seq_clone(self, src, upto=None) -> tuple[int, np.ndarray]:
        """A new id (the lowest free) sharing `src`'s cells at positions [0, upto).

        upto : int in [0, pos(src)], default pos(src)
        Returns (id, cells): cells [upto] int32, the shared cells in position order.
        Refused (nothing changes): `src` not live, `upto` out of range (SequenceError);
        every id live (CapacityError).
        """
        src = self.check_live(src)
        n = self.length(src)
        upto = n if upto is None else check_position("upto", upto, n, src)
        seq = self.next_id()
        shared = self._segments.open_prefix(seq, src, upto)
        _share(shared, seq, self._owners, self._n_owners)
        self._take_id(seq)
        self._touched.append(shared)
        return seq, shared

    def seq_rm(self, seq) -> np.ndarray:
        """Releases `seq`; returns the [pos(seq)] int32 cells it held, in position order.

        Cells left without owners become free and `read_len` is trimmed. SequenceError when
        `seq` is not live.
        """
        seq = self.check_live(seq)
        held = self.cells_of(seq)
        self._release(held, seq)
        self._touched.append(held)
        self._segments.close(seq)
        self._live[seq] = False
        tree_set(self._id_bits, self._id_offs, seq)
        return held

    def rewind(self, seq, position) -> np.ndarray:
        """Drops `seq`'s positions >= position; returns those [pos(seq) - position] int32 cells.

        The id stays live. SequenceError when `seq` is not live or `position` is outside
        [0, pos(seq)].
        """
        seq = self.check_live(seq)
        position = check_position("position", position, self.length(seq), seq)
        dropped = self._segments.cells(seq, position)
        self._release(dropped, seq)
        self._touched.append(dropped)
        self._segments.truncate(seq, position)
        return dropped

    def clear(self) -> None:
        """Every cell free, every id released; O(capacity)."""
        self._touched.append(np.arange(self.read_len, dtype=np.int32))
        self._pos.fill(-1)
        self._owners.fill(0)
        self._n_owners.fill(0)
        self._live.fill(False)
        fill_tree(self._trees[FREE], self._offs, self.config.capacity)
        self._trees[OCC].fill(0)
        fill_tree(self._id_bits, self._id_offs, self.config.max_seqs)
        self._segments.clear()
        self._meta.fill(0)

    # -- placement: find, then claim (the cache grows the pool in between) --------

    def find_cells(self, n: int) -> np.ndarray:
        """[n] int32: the n lowest free cells, ascending (holes below read_len, then fresh).

        Pure: claims nothing.
        """
        if n > self.free_cells:
            raise CapacityError(f"find_cells({n}) with only {self.free_cells} free cells")
        return lowest_set_bits(self._trees[FREE], self._offs, n)

    def claim(self, cells: np.ndarray, seq_ids: np.ndarray) -> np.ndarray:
        """Claims `cells` (from `find_cells`) for one token per entry of `seq_ids` ([n] int32
        live ids, checked by the caller); returns the tokens' [n] int32 positions.

        Token i of sequence s gets position pos(s) + (earlier tokens of s in seq_ids) and
        cell cells[i]: its position and owner bit, appended to s's cells.
        """
        seq_ids = np.ascontiguousarray(seq_ids, dtype=np.int32)
        positions = np.empty(len(seq_ids), dtype=np.int32)
        segments = self._segments
        segments.reserve(seq_ids)
        place.claim(cells, positions, seq_ids, *self._arrays, segments.arena, segments.seg)
        self._touched.append(np.array(cells, dtype=np.int32))
        return positions

    def place(self, seq_ids: np.ndarray, rows: np.ndarray) -> None:
        """`find_cells` then `claim` in one njit call: a step's whole placement on the host,
        written where the step buffer wants it.

        seq_ids : [n] int32, C-contiguous live ids (checked by the caller)
        rows    : [>= 3, >= n] int32, C-contiguous; written: rows[0, :n] the tokens' cells
                  (the n lowest free cells, ascending), rows[1, :n] their positions,
                  rows[2, :n] the ids; nothing else

        CapacityError (ValueError when `rows` is too small), before anything changes, when
        n > free_cells. The arena compacts (a Python call, then the kernel again) only when
        it lacks room for the segments.
        """
        segments = self._segments
        while True:
            short = place.place(seq_ids, rows, *self._arrays, segments.arena, segments.seg)
            if short <= 0:
                break
            segments._compact(short)  # a new arena: the kernel runs again with it
        if short == 0:
            self._touched.append(rows[0, : len(seq_ids)].copy())
        if short < 0:
            n = len(seq_ids)
            if n > self.free_cells:
                raise CapacityError(f"place() of {n} tokens with only {self.free_cells} free cells")
            raise ValueError(f"place(): {n} ids into rows of shape {rows.shape}")

    # -- invariants ------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raises AssertionError naming the first broken invariant; O(capacity), for tests.

        docs/contract.md §2's (each live sequence holds positions 0 .. pos-1 once, each in a
        cell with its bit; a cell without owners is free; owners are live; every occupied
        cell lies below read_len, which is trimmed; used + free = capacity) and the indexes'
        (owner counts, the trees, the segments disjoint and each equal to its sequence's
        cells by position).
        """
        pos, owners, live = self._pos, self._owners, self._live
        capacity = self.config.capacity
        n_set = np.bitwise_count(owners).sum(axis=1, dtype=np.int64)
        occupied = pos >= 0
        _require(np.array_equal(occupied, n_set > 0), "a cell's position and owners disagree")
        _require(np.array_equal(n_set, self._n_owners), "n_owners differs from the bitsets")
        _require(int(occupied.sum()) == self.used_cells, "used_cells miscounted")
        n_free = int(np.count_nonzero(level_bits(self._trees[FREE], self._offs, 0, capacity)))
        _require(n_free + self.used_cells == capacity, "free + used != capacity")
        top = int(np.flatnonzero(occupied)[-1]) + 1 if occupied.any() else 0
        _require(top == self.read_len, f"read_len {self.read_len}, highest occupied + 1 {top}")
        for row, expect in ((FREE, ~occupied), (OCC, occupied)):
            bits = self._trees[row]
            is_same = np.array_equal(level_bits(bits, self._offs, 0, capacity), expect)
            _require(is_same, "a cell tree disagrees with the positions")
            _require(is_consistent(bits, self._offs), "a cell tree's summaries are stale")
        ids = level_bits(self._id_bits, self._id_offs, 0, self.config.max_seqs)
        _require(np.array_equal(ids, ~live), "the id tree disagrees with the live ids")
        _require(self._segments.is_consistent(live), "segments overlap or pass the arena's top")
        for seq in range(self.config.max_seqs):
            word, bit = seq // 64, ONE << np.uint64(seq % 64)
            holds = np.flatnonzero(owners[:, word] & bit)
            _require(live[seq] or len(holds) == 0, f"sequence {seq} owns cells but is not live")
            cells = self.cells_of(seq)
            _require(np.array_equal(np.sort(cells), holds), f"sequence {seq}'s segment")
            _require(
                np.array_equal(pos[cells], np.arange(len(cells))),
                f"sequence {seq} does not hold positions 0..{len(cells) - 1} once",
            )

    # -- helpers ---------------------------------------------------------------

    def next_id(self) -> int:
        """The id `seq_new` reserves next (the lowest free); CapacityError when every id is
        live. Pure."""
        seq = tree_next(self._id_bits, self._id_offs, 0)
        if seq < 0:
            raise CapacityError(
                f"all {self.config.max_seqs} sequence ids are live; seq_rm() one or raise max_seqs"
            )
        return int(seq)

    def _take_id(self, seq: int) -> None:
        self._live[seq] = True
        tree_clear(self._id_bits, self._id_offs, seq)

    def _release(self, cells: np.ndarray, seq: int) -> None:
        _release(cells, seq, *self._arrays)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"host table invariant broken: {what}")


# -- njit kernels of the verbs ---------------------------------------------------


@numba.njit(cache=True)
def _admits(seq_ids, live, lengths, max_seq_len):
    """Whether every id is in [0, max_seqs) and live (live: [max_seqs] bool) and, for
    max_seq_len > 0, lengths[s] + (tokens of s in seq_ids) <= max_seq_len for every s."""
    for s in seq_ids:
        if s < 0 or s >= len(live) or not live[s]:
            return False
    if max_seq_len > 0:
        counts = np.zeros(len(lengths), dtype=np.int64)
        for s in seq_ids:
            counts[s] += 1
            if lengths[s] + counts[s] > max_seq_len:
                return False
    return True


@numba.njit(cache=True)
def _share(cells, seq, owners, n_owners):
    """Sets sequence `seq`'s owner bit on `cells` ([n] int32)."""
    bit = ONE << np.uint64(seq & 63)
    for c in cells:
        owners[c, seq >> 6] |= bit
        n_owners[c] += 1


@numba.njit
def _release(cells, seq, pos, owners, n_owners, trees, offs, meta):
    """Clears `seq`'s bit on `cells`, frees the cells left unowned, trims read_len."""
    keep = ~(ONE << np.uint64(seq & 63))
    for c32 in cells:
        c = np.int64(c32)
        owners[c, seq >> 6] &= keep
        n_owners[c] -= 1
        if n_owners[c] == 0:
            pos[c] = -1
            tree_set(trees[FREE], offs, c)
            tree_clear(trees[OCC], offs, c)
            meta[USED] -= 1
    if meta[READ_LEN] > 0:
        meta[READ_LEN] = tree_prev(trees[OCC], offs, meta[READ_LEN] - 1) + 1
