"""`HostTable`: the cell table of SPEC §2 for the device path, every verb costing its cells.

The state the contract names is kept exactly as the reference keeps it, so snapshots of
the two compare equal:

    pos      : [capacity] int32, the position each cell holds, -1 = free
    owners   : [capacity, n_owner_words] uint64, bit `s % 64` of word `s // 64` = sequence s
    live     : [max_seqs] bool

Beside it, the indexes that make each verb cost the cells it touches, never capacity:

    n_owners : [capacity] int32, owner bits set in each cell, so freeing a cell is O(1)
    free     : a bit tree over the cells, 1 = free: 64-bit words with summary levels above
               (bit j of level l+1 = word j of level l is non-zero), so the lowest free cell
               at or after c is found in O(log64 capacity) words
    occupied : the same tree, 1 = occupied, searched downwards to trim `read_len`
    free ids : the same tree over sequence ids, for `seq_new`'s lowest free id
    cells    : each sequence's cells in position order, a segment of one int32 arena
               (`seg_off`, `seg_cap`, `seg_len` per id); a segment that fills up moves to
               the arena's top with double the room, and a full arena is compacted into
               a new one at least twice the held size, so appends cost O(1) amortised

Placement is SPEC §2's: tokens in declaration order take the lowest free cells. Every cell
at or past `read_len` is free, so "the lowest free cells" are the holes below `read_len`
first, then `read_len`, `read_len + 1`, ...: one search in the free tree gives both.

Example (a prefill step, a decode step, a removal, a decode step):

    [a, a, a, b, b]   -> cells 0 1 2 3 4, positions 0 1 2 0 1
    [b, a]            -> cells 5 6, positions 2 3; read_len 7
    seq_rm(a)         -> returns [0, 1, 2, 6]; read_len trims to 6 (b holds 3 4 5)
    [b]               -> cell 0, position 3: the hole refills before read_len grows
"""

# isort: off
import numbakv.device  # noqa: F401  (chooses sim or GPU; numba reads that once, at import)

# isort: on
import numba
import numpy as np

from numbakv.checks import check_live, check_position
from numbakv.config import CacheConfig
from numbakv.errors import CapacityError
from numbakv.snapshot import Snapshot

_ONE = np.uint64(1)
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_HALVINGS = tuple(np.uint64(1 << k) for k in range(5, -1, -1))  # 32, 16, ..., 1
_MIN_SEGMENT = 16  # int32 cells a sequence's segment holds at least once it holds any

# slots of the int64 `meta` array that the njit functions update in place
_READ_LEN, _USED, _TOP, _GARBAGE = 0, 1, 2, 3
# rows of `seg` ([3, max_seqs] int64): each sequence's segment of the arena
_OFF, _CAP, _LEN = 0, 1, 2
# rows of `trees` ([2, words] uint64): the two bit trees over the cells
_FREE, _OCC = 0, 1


class HostTable:
    """Which cell holds which position of which sequences, with O(cells touched) verbs.

    The device cache calls, per step: `check_live` for each declared id, `free_cells`,
    `positions_of`, `find_cells` (pure) and `claim`; and the verbs `seq_new`, `seq_clone`,
    `seq_rm`, `rewind`, `clear`, which return the cells they touched so the device mirror
    can follow. Every refused call raises before it changes anything.
    """

    def __init__(self, config: CacheConfig):
        self.config = config
        capacity, max_seqs = config.capacity, config.max_seqs
        self._pos = np.full(capacity, -1, dtype=np.int32)
        self._owners = np.zeros((capacity, config.n_owner_words), dtype=np.uint64)
        self._n_owners = np.zeros(capacity, dtype=np.int32)
        self._live = np.zeros(max_seqs, dtype=bool)
        bits, self._offs = _tree(capacity)
        self._trees = np.stack([bits, bits])  # [_FREE] 1 = free, [_OCC] 1 = occupied
        self._id_bits, self._id_offs = _tree(max_seqs)  # 1 = free id
        self._seg = np.zeros((3, max_seqs), dtype=np.int64)
        self._seg_off, self._seg_cap, self._seg_len = self._seg  # views, by row
        self._scratch = np.zeros(max_seqs, dtype=np.int64)  # all-zero between calls
        self._arena = np.empty(_MIN_SEGMENT * max(4, max_seqs), dtype=np.int32)  # grows
        self._meta = np.zeros(4, dtype=np.int64)
        self.clear()

    # -- state -----------------------------------------------------------------

    @property
    def read_len(self) -> int:
        """Every occupied cell lies in [0, read_len)."""
        return int(self._meta[_READ_LEN])

    @property
    def used_cells(self) -> int:
        return int(self._meta[_USED])

    @property
    def free_cells(self) -> int:
        return self.config.capacity - int(self._meta[_USED])

    @property
    def live(self) -> np.ndarray:
        """[max_seqs] bool, a read-only view: which sequence ids are live."""
        view = self._live.view()
        view.flags.writeable = False
        return view

    def check_live(self, seq) -> int:
        """`seq` as an int; SequenceError when it is not an integer or not a live id."""
        return check_live(seq, self._live)

    def length(self, seq: int) -> int:
        """pos(seq): positions `seq` holds (0 for a free id). `seq` is not checked."""
        return int(self._seg_len[seq])

    def cells_of(self, seq: int) -> np.ndarray:
        """[pos(seq)] int32, a copy: `seq`'s cells in position order. `seq` is not checked."""
        off = self._seg_off[seq]
        return self._arena[off : off + self._seg_len[seq]].copy()

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
        seq = self._free_id()
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
        seq = self._free_id()
        self._new_segment(seq, 2 * upto)  # may compact the arena: read src's segment after
        src_off, off = self._seg_off[src], self._seg_off[seq]
        shared = self._arena[src_off : src_off + upto].copy()
        self._arena[off : off + upto] = shared
        self._seg_len[seq] = upto
        _share(shared, seq, self._owners, self._n_owners)
        self._take_id(seq)
        return seq, shared

    def seq_rm(self, seq) -> np.ndarray:
        """Releases `seq`; returns the [pos(seq)] int32 cells it held, in position order.

        Cells left without owners become free and `read_len` is trimmed. SequenceError when
        `seq` is not live.
        """
        seq = self.check_live(seq)
        held = self.cells_of(seq)
        self._release(held, seq)
        self._meta[_GARBAGE] += self._seg_cap[seq]
        self._seg_off[seq] = self._seg_cap[seq] = self._seg_len[seq] = 0
        self._live[seq] = False
        _tree_set(self._id_bits, self._id_offs, seq)
        return held

    def rewind(self, seq, position) -> np.ndarray:
        """Drops `seq`'s positions >= position; returns those [pos(seq) - position] int32 cells.

        The id stays live. SequenceError when `seq` is not live or `position` is outside
        [0, pos(seq)].
        """
        seq = self.check_live(seq)
        position = check_position("position", position, self.length(seq), seq)
        off = self._seg_off[seq]
        dropped = self._arena[off + position : off + self._seg_len[seq]].copy()
        self._release(dropped, seq)
        self._seg_len[seq] = position
        return dropped

    def clear(self) -> None:
        """Every cell free, every id released; O(capacity)."""
        self._pos.fill(-1)
        self._owners.fill(0)
        self._n_owners.fill(0)
        self._live.fill(False)
        _fill_tree(self._trees[_FREE], self._offs, self.config.capacity)
        self._trees[_OCC].fill(0)
        _fill_tree(self._id_bits, self._id_offs, self.config.max_seqs)
        self._seg.fill(0)
        self._meta.fill(0)

    # -- placement (find, then claim) ------------------------------------------

    def positions_of(self, seq_ids: np.ndarray) -> np.ndarray:
        """[n] int32: token i of sequence s gets pos(s) + (earlier tokens of s in seq_ids).

        seq_ids : [n] int32 live ids (not checked)
        """
        seq_ids = np.asarray(seq_ids, dtype=np.int32)
        return _positions_of(seq_ids, self._seg_len, self._scratch)

    def find_cells(self, n: int) -> np.ndarray:
        """[n] int32: the n lowest free cells, ascending (holes below read_len, then fresh).

        Pure: claims nothing. The caller has checked n <= free_cells.
        """
        if n > self.free_cells:
            raise CapacityError(f"find_cells({n}) with only {self.free_cells} free cells")
        return _find_cells(self._trees[_FREE], self._offs, n)

    def claim(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Records each token in its cell: position, owner bit; appends it to its sequence.

        cells     : [n] int32, from find_cells(n) (free, distinct)
        positions : [n] int32, from positions_of(seq_ids)
        seq_ids   : [n] int32 live ids, in declaration order
        """
        cells, positions, seq_ids = (
            np.asarray(a, dtype=np.int32) for a in (cells, positions, seq_ids)
        )
        while short := _reserve(self._arena, self._seg, self._meta, seq_ids, self._scratch):
            self._compact(short)
        tables = (self._pos, self._owners, self._n_owners, self._trees, self._offs)
        _claim(cells, positions, seq_ids, *tables, self._arena, self._seg, self._meta)

    # -- helpers ---------------------------------------------------------------

    def _free_id(self) -> int:
        seq = _tree_next(self._id_bits, self._id_offs, 0)
        if seq < 0:
            raise CapacityError(
                f"all {self.config.max_seqs} sequence ids are live; seq_rm() one or raise max_seqs"
            )
        return int(seq)

    def _take_id(self, seq: int) -> None:
        self._live[seq] = True
        _tree_clear(self._id_bits, self._id_offs, seq)

    def _release(self, cells: np.ndarray, seq: int) -> None:
        tables = (self._pos, self._owners, self._n_owners, self._trees, self._offs)
        _release(cells, seq, *tables, self._meta)

    def _new_segment(self, seq: int, room: int) -> None:
        """Gives free id `seq` an empty segment of at least `room` cells."""
        cap = max(_MIN_SEGMENT, room)
        if self._meta[_TOP] + cap > len(self._arena):
            self._compact(cap)
        self._seg_off[seq], self._seg_cap[seq], self._seg_len[seq] = self._meta[_TOP], cap, 0
        self._meta[_TOP] += cap

    def _compact(self, short: int) -> None:
        """Moves the live segments to the start of a new arena with `short` words spare.

        The new arena holds at least twice what is held, so compactions are O(1) amortised
        per appended cell.
        """
        held = int(self._meta[_TOP] - self._meta[_GARBAGE])
        arena = np.empty(max(len(self._arena), 2 * (held + short)), dtype=np.int32)
        top = _pack_segments(self._arena, arena, self._seg)
        self._arena = arena
        self._meta[_TOP], self._meta[_GARBAGE] = top, 0


# -- bit trees -----------------------------------------------------------------
# A bit tree over n bits is a flat uint64 array `bits` and level offsets `offs`
# ([levels + 1] int64): level l is bits[offs[l] : offs[l + 1]], level 0 the n bits themselves
# and each level above one bit per word below (set = that word is non-zero); the top level
# is one word.


def _tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """An all-zero bit tree over n bits: (bits uint64, offs [levels + 1] int64)."""
    sizes = [-(-n // 64)]
    while sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // 64))
    offs = np.zeros(len(sizes) + 1, dtype=np.int64)
    offs[1:] = np.cumsum(sizes)
    return np.zeros(offs[-1], dtype=np.uint64), offs


def _fill_tree(bits: np.ndarray, offs: np.ndarray, n: int) -> None:
    """Sets bits [0, n) of level 0 and the summaries above; clears the rest."""
    bits.fill(0)
    for level in range(len(offs) - 1):
        words = bits[offs[level] : offs[level + 1]]
        words[: n // 64] = _ALL
        if n % 64:
            words[n // 64] = (_ONE << np.uint64(n % 64)) - _ONE
        n = -(-n // 64)


@numba.njit(cache=True)
def _tree_set(bits, offs, i):
    """Sets bit i, and the summary bits above it that were clear."""
    for level in range(len(offs) - 1):
        k = offs[level] + (i >> 6)
        word = bits[k]
        bits[k] = word | (_ONE << np.uint64(i & 63))
        if word != 0:
            return
        i >>= 6


@numba.njit(cache=True)
def _tree_clear(bits, offs, i):
    """Clears bit i, and the summary bits above it whose word became zero."""
    for level in range(len(offs) - 1):
        k = offs[level] + (i >> 6)
        word = bits[k] & ~(_ONE << np.uint64(i & 63))
        bits[k] = word
        if word != 0:
            return
        i >>= 6


@numba.njit(cache=True)
def _highest_bit(word):
    """Index of the highest set bit of a non-zero uint64 word: six halvings."""
    i = np.int64(0)
    for shift in _HALVINGS:
        if word >> shift:
            word >>= shift
            i += np.int64(shift)
    return i


@numba.njit(cache=True)
def _lowest_bit(word):
    """Index of the lowest set bit of a non-zero uint64 word: the highest of word & -word."""
    return _highest_bit(word & (~word + _ONE))


@numba.njit(cache=True)
def _tree_next(bits, offs, i):
    """The lowest set bit >= i, or -1: up while the rest of a word is empty, then down."""
    n_levels = len(offs) - 1
    level = 0
    while True:
        w = i >> 6
        if w >= offs[level + 1] - offs[level]:
            return -1
        word = bits[offs[level] + w] & (_ALL << np.uint64(i & 63))
        if word != 0:
            i = (w << 6) + _lowest_bit(word)
            break
        level += 1
        if level == n_levels:
            return -1
        i = w + 1
    while level > 0:
        level -= 1
        i = (i << 6) + _lowest_bit(bits[offs[level] + i])
    return i


@numba.njit(cache=True)
def _tree_prev(bits, offs, i):
    """The highest set bit <= i (i < n), or -1: up while a word's lower part is empty, then down."""
    n_levels = len(offs) - 1
    level = 0
    while True:
        if i < 0:
            return -1
        w = i >> 6
        word = bits[offs[level] + w] & (_ALL >> np.uint64(63 - (i & 63)))
        if word != 0:
            i = (w << 6) + _highest_bit(word)
            break
        level += 1
        if level == n_levels:
            return -1
        i = w - 1
    while level > 0:
        level -= 1
        i = (i << 6) + _highest_bit(bits[offs[level] + i])
    return i


# -- table kernels ---------------------------------------------------------------


@numba.njit(cache=True)
def _positions_of(seq_ids, seg_len, scratch):
    """[n] int32 positions; `scratch` ([max_seqs] int64, all zero) counts and is re-zeroed."""
    positions = np.empty(len(seq_ids), dtype=np.int32)
    for t in range(len(seq_ids)):
        s = seq_ids[t]
        positions[t] = seg_len[s] + scratch[s]
        scratch[s] += 1
    for t in range(len(seq_ids)):
        scratch[seq_ids[t]] = 0
    return positions


@numba.njit(cache=True)
def _find_cells(free_bits, free_offs, n):
    """[n] int32: the n lowest set bits of the free tree, whole leaf words at a time."""
    cells = np.empty(n, dtype=np.int32)
    k = 0
    c = _tree_next(free_bits, free_offs, 0) if n > 0 else -1
    while c >= 0:
        w = c >> 6
        word = free_bits[w] & (_ALL << np.uint64(c & 63))  # level 0 starts at offs[0] = 0
        while word != 0 and k < n:
            cells[k] = (w << 6) + _lowest_bit(word)
            word &= word - _ONE
            k += 1
        if k == n:
            break
        c = _tree_next(free_bits, free_offs, (w + 1) << 6)
    return cells


@numba.njit(cache=True)
def _reserve(arena, seg, meta, seq_ids, scratch):
    """Moves each segment too small for its new tokens to the arena's top, doubled.

    Returns 0 when every sequence in seq_ids has room, else the arena words still missing
    (the caller compacts and calls again; moves already made are kept).
    """
    for s in seq_ids:
        scratch[s] += 1
    short = 0
    for s in seq_ids:
        k = scratch[s]  # the new tokens of s; 0 once s is handled
        scratch[s] = 0
        off, n = seg[_OFF, s], seg[_LEN, s]
        if n + k <= seg[_CAP, s]:
            continue
        cap = max(2 * seg[_CAP, s], n + k, _MIN_SEGMENT)
        top = meta[_TOP]
        if short or top + cap > len(arena):
            short += cap
            continue
        arena[top : top + n] = arena[off : off + n]
        meta[_GARBAGE] += seg[_CAP, s]
        seg[_OFF, s], seg[_CAP, s] = top, cap
        meta[_TOP] = top + cap
    return short


@numba.njit(cache=True)
def _claim(cells, positions, seq_ids, pos, owners, n_owners, trees, offs, arena, seg, meta):
    """Writes token t (cell, position, owner) and appends its cell to its sequence's segment."""
    read_len = meta[_READ_LEN]
    for t in range(len(cells)):
        c, s = np.int64(cells[t]), seq_ids[t]
        pos[c] = positions[t]
        owners[c, s >> 6] |= _ONE << np.uint64(s & 63)
        n_owners[c] += 1
        _tree_clear(trees[_FREE], offs, c)
        _tree_set(trees[_OCC], offs, c)
        arena[seg[_OFF, s] + seg[_LEN, s]] = c
        seg[_LEN, s] += 1
        read_len = max(read_len, c + 1)
    meta[_READ_LEN] = read_len
    meta[_USED] += len(cells)


@numba.njit(cache=True)
def _pack_segments(arena, new_arena, seg):
    """Copies every segment (cap > 0) to the start of new_arena, in id order; returns the top."""
    top = 0
    for s in range(seg.shape[1]):
        off, cap, n = seg[_OFF, s], seg[_CAP, s], seg[_LEN, s]
        if cap > 0:
            new_arena[top : top + n] = arena[off : off + n]
            seg[_OFF, s] = top
            top += cap
    return top


@numba.njit(cache=True)
def _share(cells, seq, owners, n_owners):
    """Sets sequence `seq`'s owner bit on `cells` ([n] int32)."""
    bit = _ONE << np.uint64(seq & 63)
    for c in cells:
        owners[c, seq >> 6] |= bit
        n_owners[c] += 1


@numba.njit(cache=True)
def _release(cells, seq, pos, owners, n_owners, trees, offs, meta):
    """Clears `seq`'s bit on `cells`, frees the cells left unowned, trims read_len."""
    keep = ~(_ONE << np.uint64(seq & 63))
    for c32 in cells:
        c = np.int64(c32)
        owners[c, seq >> 6] &= keep
        n_owners[c] -= 1
        if n_owners[c] == 0:
            pos[c] = -1
            _tree_set(trees[_FREE], offs, c)
            _tree_clear(trees[_OCC], offs, c)
            meta[_USED] -= 1
    if meta[_READ_LEN] > 0:
        meta[_READ_LEN] = _tree_prev(trees[_OCC], offs, meta[_READ_LEN] - 1) + 1
