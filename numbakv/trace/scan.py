"""Figures of a trace computed from its recorded changes, never from a table per frame
(numba-free): `Trace.metrics`, `Trace.timeline`, the checks of a loading trace and the
pictures of `numbakv.viz` read the trace through these.

A trace stores, per frame, only the cells that changed. The per-frame figures follow from
each change and the same cell's changes before and after it (`CellIndex`), vectorized
over the changes: occupancy and sharing, each sequence's runs of cells from the stretches
of frames each cell has each owner (`owner_spans`); snapshots replay the table
(`TableReplay`, `table_at`).
"""

from collections.abc import Iterator
from functools import cached_property

import numpy as np

from numbakv.core.snapshot import FREE, SHARED
from numbakv.trace.free_runs import largest_per_frame, radix_keys

SPANS_AT_ONCE = 1 << 20  # owner events and counts `sequence_runs` makes at a time (ids)


def change_frames(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """[n_changes] int64: the frame each recorded change belongs to."""
    return np.repeat(np.arange(len(arrays["events"])), np.diff(arrays["delta_offsets"]))


def previous_changes(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """[n_changes] int64: the index of the same cell's change before each change, -1 if none
    (the cell was free before)."""
    cells = arrays["delta_cells"]
    order = np.argsort(cells, kind="stable")  # changes are in frame order: stable keeps it
    previous = np.full(len(cells), -1, dtype=np.int64)
    same = cells[order[1:]] == cells[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    return previous


class CellIndex:
    """The changes of a trace by cell (`arrays`: a trace's, or those of
    `numbakv.viz.holders.cell_changes`), for scans that follow each cell's changes.

    frames    : [n] int64, the frame of each change
    previous  : [n] int64, the same cell's change before each change, -1 for none (as the
                trace's checks found it, `numbakv.trace.sweep`; else from a sort by cell)
    following : [n] int64, the same cell's change after each change, -1 for none
    n_owners  : [n] int32, how many owners each change leaves its cell, as the trace's
                checks counted them (None otherwise)
    owners    : ([k] int64 the changes to SHARED that a plain change follows, [k, words]
                uint64 the owners each leaves its cell), as the trace's checks found them
                (None otherwise)

    `frames` and `previous` are computed here unless given (the trace's checks give theirs).
    """

    def __init__(
        self, arrays: dict[str, np.ndarray], previous=None, n_owners=None, owners=None, frames=None
    ):
        self.cells, self.n_owners, self.owners = arrays["delta_cells"], n_owners, owners
        self.frames = change_frames(arrays) if frames is None else frames
        self.n_frames = len(arrays["events"])
        self.previous = previous_changes(arrays) if previous is None else previous

    def frame_of(self, changes: np.ndarray) -> np.ndarray:
        """[k] int64 frames of `changes` ([k] indices, -1 for none: n_frames)."""
        return np.where(changes >= 0, self.frames[np.maximum(changes, 0)], self.n_frames)

    @cached_property
    def following(self) -> np.ndarray:
        following = np.full(len(self.cells), -1, dtype=np.int64)
        had = np.flatnonzero(self.previous >= 0)
        following[self.previous[had]] = had
        return following


def request_table(bindings: np.ndarray, n_frames: int, max_seqs: int) -> np.ndarray:
    """[n_frames, max_seqs] int64: the request each sequence id is bound to at each frame,
    -1 for none. `bindings` are `Trace.seq_bindings()` rows (frame, seq, request): each
    holds from the frame after its own until the id's next binding (the later row of two
    at one frame)."""
    starts, seqs, requests = (bindings[:, i] for i in range(3))
    starts = starts + 1
    key = (starts * max_seqs + seqs)[::-1]
    last = len(key) - 1 - np.unique(key, return_index=True)[1]  # each (frame, id)'s last
    last = last[starts[last] < n_frames]
    last = last[np.argsort(seqs[last], kind="stable")]  # by id, then frame
    seq, start = seqs[last], starts[last]
    again = np.append(seq[1:] == seq[:-1], False)  # the id's next binding ends it
    end = np.where(again, np.append(start[1:], 0), n_frames)
    lead = np.full(max_seqs, n_frames)  # each id unbound until its first binding
    lead[seq[::-1]] = start[::-1]
    # each id's column in turn: -1 while unbound, then each binding's request
    order = np.argsort(np.append(2 * np.arange(max_seqs), 2 * seq + 1), kind="stable")
    values = np.append(np.full(max_seqs, -1), requests[last])[order]
    column = np.repeat(values, np.append(lead, end - start)[order])
    return column.reshape(max_seqs, n_frames).T


def used_and_held(arrays: dict[str, np.ndarray], index: CellIndex) -> tuple[np.ndarray, np.ndarray]:
    """([n_frames] int64 occupied cells, [n_frames] int64 tokens held) after each frame;
    held - occupied is what sharing saves. `index`: the changes' `CellIndex`."""
    codes, n_owners, previous = arrays["delta_codes"], index.n_owners, index.previous
    n_frames, used = len(arrays["events"]), codes != FREE
    was = np.append(used, False)[previous]  # [-1]: before any change, nothing
    d_used = (np.bincount(index.frames[used & ~was], minlength=n_frames)
              - np.bincount(index.frames[was & ~used], minlength=n_frames))  # fmt: skip
    d_held = np.bincount(index.frames, n_owners - np.append(n_owners, 0)[previous], n_frames)
    return np.cumsum(d_used).astype(np.int64), np.cumsum(d_held).astype(np.int64)


def id_words(flags: np.ndarray) -> np.ndarray:
    """[..., ceil(max_seqs / 64)] uint64 bitsets of the ids `flags` ([..., max_seqs] bool)
    marks, id i at bit i % 64 of word i // 64: the owner bitsets' layout."""
    padded = np.zeros((*flags.shape[:-1], -(-flags.shape[-1] // 64) * 64), dtype=bool)
    padded[..., : flags.shape[-1]] = flags
    return np.packbits(padded, axis=-1, bitorder="little").view(np.uint64)


def replay_codes(
    arrays: dict[str, np.ndarray], n_cells: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(frame, codes, changed cells) per frame, in order: `codes` is one `[n_cells] int32`
    array of owner codes (ids, FREE, SHARED), updated in place to the table after that
    frame. Consumers read it before the next iteration and never keep it."""
    codes = np.full(n_cells, FREE, dtype=np.int32)
    offsets, cells = arrays["delta_offsets"], arrays["delta_cells"]
    for f in range(len(arrays["events"])):
        changed = slice(offsets[f], offsets[f + 1])
        codes[cells[changed]] = arrays["delta_codes"][changed]
        yield f, codes, cells[changed]


class TableReplay:
    """The table of a checked trace, frame by frame, in place: `pos` [n_cells] int32 and
    `owners` [n_cells, words] uint64 after the frames applied so far (`apply(f)`, in order).
    A change to a shared cell flips the bits its toggles name; any other sets its cell's
    owners to its code's (one id, or none) (`numbakv.trace.file`)."""

    def __init__(self, arrays: dict[str, np.ndarray], n_cells: int, n_words: int):
        self.arrays = arrays
        self.pos = np.full(n_cells, -1, dtype=np.int32)
        self.owners = np.zeros((n_cells, n_words), dtype=np.uint64)
        # frame f's toggles: [toggle_offsets[f], toggle_offsets[f + 1])
        ends = np.concatenate([[0], np.cumsum(arrays["toggle_counts"], dtype=np.int64)])
        self.toggle_offsets = ends[arrays["delta_offsets"]]

    def changes(self, f: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cells, new positions, new codes) of frame `f`, views."""
        a, offsets = self.arrays, self.arrays["delta_offsets"]
        changed = slice(offsets[f], offsets[f + 1])
        return a["delta_cells"][changed], a["delta_pos"][changed], a["delta_codes"][changed]

    def toggles(self, f: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row of the frame's change int64, id int64, gained bool) of each of frame `f`'s
        toggles."""
        a, t, offsets = self.arrays, self.toggle_offsets, self.arrays["delta_offsets"]
        ids, gained = toggle_ids(a["toggle_seqs"][t[f] : t[f + 1]])
        counts = a["toggle_counts"][offsets[f] : offsets[f + 1]]
        return np.repeat(np.arange(len(counts)), counts), ids, gained

    def apply(self, f: int) -> np.ndarray:
        """Applies frame `f`'s changes; returns its changed cells."""
        cells, pos, codes = self.changes(f)
        rows, ids, _ = self.toggles(f)
        self.pos[cells] = pos
        plain = codes != SHARED
        plain_cells, plain_codes = cells[plain], codes[plain]
        self.owners[plain_cells] = 0
        alone = plain_codes >= 0
        words, bits = id_bits(plain_codes[alone])
        self.owners[plain_cells[alone], words] = bits
        words, bits = id_bits(ids)
        np.bitwise_xor.at(self.owners, (cells[rows], words), bits)
        return cells


def table_at(
    arrays: dict[str, np.ndarray], frame: int, n_cells: int, n_words: int
) -> tuple[np.ndarray, np.ndarray]:
    """([n_cells] int32 pos, [n_cells, words] uint64 owners) of a checked trace's table after
    `frame`, from all the changes up to it at once: a cell's last change gives its
    position; its owners are its last plain change's (one id or none) with the toggles of
    its changes since then flipped, what `TableReplay` reaches frame by frame."""
    a, n = arrays, int(arrays["delta_offsets"][frame + 1])
    cells, codes, every = a["delta_cells"][:n], a["delta_codes"][:n], np.arange(n)
    pos, owners = np.full(n_cells, -1, dtype=np.int32), np.zeros((n_cells, n_words), np.uint64)
    last, plain = np.full(n_cells, -1, dtype=np.int64), np.full(n_cells, -1, dtype=np.int64)
    np.maximum.at(last, cells, every)
    changed = np.flatnonzero(last >= 0)
    pos[changed] = a["delta_pos"][last[changed]]
    np.maximum.at(plain, cells[codes != SHARED], every[codes != SHARED])
    held = np.flatnonzero(plain >= 0)
    code = codes[plain[held]]
    held, code = held[code >= 0], code[code >= 0]  # FREE leaves no owner
    words, bits = id_bits(code)
    owners[held, words] = bits
    toggled = np.repeat(every, a["toggle_counts"][:n])
    ids = toggle_ids(a["toggle_seqs"][: len(toggled)])[0]
    since = toggled > plain[cells[toggled]]  # toggles after the cell's last plain change
    words, bits = id_bits(ids[since])
    np.bitwise_xor.at(owners, (cells[toggled[since]], words), bits)
    return pos, owners


def toggle_ids(toggle_seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([n] int64 id, [n] bool gained) of toggles as stored (s: gains s, ~s: loses s)."""
    seqs = np.asarray(toggle_seqs, dtype=np.int64)
    gained = seqs >= 0
    return np.where(gained, seqs, ~seqs), gained


def id_bits(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([n] int64 word, [n] uint64 mask) of each id in an owner bitset: id i is bit i % 64
    of word i // 64."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids >> 6, np.left_shift(np.uint64(1), (ids & 63).astype(np.uint64))


def replay_table(
    arrays: dict[str, np.ndarray], n_cells: int, n_words: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(frame, pos, owners, changed cells) per frame, in order, `pos` and `owners` one
    `TableReplay`'s arrays (read them before the next iteration, never keep them)."""
    replay = TableReplay(arrays, n_cells, n_words)
    for f in range(len(arrays["events"])):
        changed = replay.apply(f)
        yield f, replay.pos, replay.owners, changed


def largest_free_run(arrays: dict[str, np.ndarray], index: CellIndex | None = None) -> np.ndarray:
    """[n_frames] int64: the longest stretch of consecutive free cells among the pool's
    allocated rows [0, rows) after each frame (what one contiguous placement could get);
    O(changes log cells) (`numbakv.trace.free_runs.largest_per_frame`). `index`: the
    changes' `CellIndex` (made here when not given)."""
    index = CellIndex(arrays) if index is None else index
    cells, codes = arrays["delta_cells"], arrays["delta_codes"]
    return largest_per_frame(arrays["rows"], cells, codes, index.frames, index.previous)


def sequence_runs(arrays: dict[str, np.ndarray], max_seqs: int, index: CellIndex) -> np.ndarray:
    """[n_frames, max_seqs] int32: how many maximal runs of consecutive cells each sequence
    owns after each frame (shared cells count for every owner; 0 = it owns none): the
    cells an id owns, less those whose cell before it owns too. Each a stretch of frames
    (`owner_spans`), the second where stretches of neighbouring cells meet. Counted a
    range of ids at a time, each with at most SPANS_AT_ONCE owner events and per-frame
    counts (or one id), so the memory it takes is bounded at any length."""
    events = _owner_events_of(arrays, index)
    # an id costs its events, and its column of counts per frame
    per_id = sum(np.bincount(i, minlength=max_seqs) for i, _, _ in events) + len(arrays["events"])
    ranges = list(blocks(per_id, SPANS_AT_ONCE))
    if len(ranges) == 1:
        spans = owner_spans(arrays, index, events)
        del events  # not held while the spans are paired up
        return _runs(arrays, spans, 0, max_seqs)
    runs = np.empty((len(arrays["events"]), max_seqs), dtype=np.int32)
    for k, event in enumerate(events):  # each kind's copy by id replaces it at once
        events[k] = _by_id(*event, max_seqs)
    for ids in ranges:
        some = [(i[at[ids.start] : at[ids.stop]], c[at[ids.start] : at[ids.stop]], g)
                for i, c, g, at in events]  # fmt: skip
        runs[:, ids] = _runs(arrays, owner_spans(arrays, index, some), ids.start, ids.stop)
    return runs


def _by_id(ids: np.ndarray, changes: np.ndarray, gains: int, max_seqs: int) -> tuple:
    """(ids, changes, gains, [max_seqs + 1] where each id's start) of owner events, by id
    (stably: each id's in their order)."""
    order = np.argsort(radix_keys(ids, max_seqs), kind="stable")
    ids, changes = ids[order], changes[order]
    return ids, changes, gains, np.searchsorted(ids, np.arange(max_seqs + 1))


def _runs(arrays: dict[str, np.ndarray], spans: tuple, lo: int, hi: int) -> np.ndarray:
    """[n_frames, hi - lo] int32: `sequence_runs` of ids [lo, hi) from their `spans`."""
    ids, cells, starts, ends = spans
    ids, width = ids - lo, hi - lo
    shift = (len(arrays["events"]) + 1).bit_length()  # (id, cell, frame) keys, ascending
    group = (ids << _cell_bits(arrays)) | cells
    left = (group - 1) << shift  # the stretches of the cell before, same id
    first = np.searchsorted((group << shift) | ends, left | starts, side="right")
    n = np.searchsorted((group << shift) | starts, left | ends) - first
    n = np.where(cells > 0, np.maximum(n, 0), 0)
    right = np.repeat(np.arange(len(n)), n)
    before = np.arange(len(right)) - np.repeat(np.cumsum(n) - n - first, n)
    met = np.maximum(starts[right], starts[before]), np.minimum(ends[right], ends[before])
    size = (len(arrays["events"]) + 1) * width  # (frame, id) entries, one frame past
    ups = np.concatenate([starts * width + ids, met[1] * width + ids[right]])
    downs = np.concatenate([ends * width + ids, met[0] * width + ids[right]])
    delta = np.bincount(ups, minlength=size)
    delta -= np.bincount(downs, minlength=size)
    return np.cumsum(delta.reshape(-1, width)[:-1], axis=0, dtype=np.int32)


def owner_spans(
    arrays: dict[str, np.ndarray], index: CellIndex, events: list | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(id, cell, start, end) [k] int64 each, ascending by id, cell, then start: every
    stretch of frames [start, end) during which a cell has that owner (end n_frames: still
    at the last frame). Of a checked trace (`index` with its owners): each (cell, id)
    gains and loses in turn; a plain change or a toggle gives, a toggle or a plain change
    over the cell's owners (the one before, or the set a change to SHARED left) takes.
    `events`: the `owner_events` of some ids (every id's when None): their spans."""
    cells = arrays["delta_cells"]
    events = _owner_events_of(arrays, index) if events is None else events
    shift, cell_bits = max(len(cells), 1).bit_length(), _cell_bits(arrays)
    # keys of (id, cell, change, gains) in bits
    keys = [(((i.astype(np.int64) << cell_bits | cells[c]) << shift | c) << 1) | g
            for i, c, g in events]  # fmt: skip
    keys = np.concatenate([np.zeros(0, np.int64), *keys])
    keys.sort()  # each (id, cell)'s gains and losses in turn, a loss before a gain at once
    gain = np.flatnonzero(keys & 1)
    pair, after = keys[gain] >> (shift + 1), keys[np.minimum(gain + 1, len(keys) - 1)]
    change, ends = (keys[gain] >> 1) & ((1 << shift) - 1), (after >> 1) & ((1 << shift) - 1)
    lost = (gain + 1 < len(keys)) & (after >> (shift + 1) == pair)  # its loss follows
    ends = np.where(lost, ends, -1)
    starts, ends = index.frames[change], index.frame_of(ends)
    return pair >> cell_bits, pair & ((1 << cell_bits) - 1), starts, ends


def _owner_events_of(arrays: dict[str, np.ndarray], index: CellIndex) -> list:
    """`owner_events` of a checked trace's changes (`index` with its owners)."""
    codes = arrays["delta_codes"]
    toggled = np.repeat(np.arange(len(codes)), arrays["toggle_counts"])
    ids, gained = toggle_ids(arrays["toggle_seqs"])
    return owner_events(codes, index.previous, toggled, ids, gained, *index.owners)


def owner_events(
    codes: np.ndarray, previous: np.ndarray, toggled: np.ndarray, ids: np.ndarray,
    gained: np.ndarray, ended: np.ndarray, owners: np.ndarray,
) -> list[tuple[np.ndarray, np.ndarray, int]]:  # fmt: skip
    """(ids, changes, gains) [k] each, of five kinds: every owner a change gives its cell
    (gains 1) or takes from it (0). A plain change gives its one id and takes the owners
    before it: the one a plain change left, or the set a change to SHARED left (`owners`
    [e, words] uint64, of the changes `ended` [e], ascending); a toggle gives or takes its
    id. [n] `codes` and `previous` (the same cell's change before, -1 for none); [m]
    `toggled`, `ids`, `gained`: each toggle's change, id and gain."""
    over = np.flatnonzero((codes != SHARED) & (previous >= 0))  # over the owners before
    was = codes[previous[over]]
    rows, set_ids = owner_bits(owners[np.searchsorted(ended, previous[over[was == SHARED]])])
    gets = np.flatnonzero(codes >= 0)
    return [
        (codes[gets], gets, 1),
        (ids[gained], toggled[gained], 1),
        (ids[~gained], toggled[~gained], 0),
        (was[was >= 0], over[was >= 0], 0),
        (set_ids, over[was == SHARED][rows], 0),
    ]


def _cell_bits(arrays: dict[str, np.ndarray]) -> int:
    """The bits a cell of the trace takes in int64 keys of (id, cell, change or frame): room
    for max_seqs * (n_cells + 1) * 2 * n_changes below 2**63 (1 024 ids of 1 Mi cells:
    2**32 changes)."""
    return int(arrays["delta_cells"].max(initial=0)).bit_length()


def owner_bits(owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, id) int64 of every bit set in `owners` ([k, words] uint64 bitsets): the ids each
    row holds, reading only the words that are not 0."""
    rows, words = np.nonzero(owners)
    index, bit = bit_pairs(owners[rows, words])
    return rows[index], 64 * words[index] + bit


def bit_pairs(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index, bit) int64 of every bit set in `words` ([n] uint64), grouped: first the words
    with one bit set, then the others, each in index order."""
    one = np.uint64(1)
    single = np.flatnonzero((words != 0) & (words & (words - one) == 0))
    # a power of two is exact in float64, so its log2 is its bit
    pairs = [(single, np.log2(words[single].astype(np.float64)).astype(np.int64))]
    several = np.flatnonzero(words & (words - one) != 0)
    if several.size == 0:
        return pairs[0]
    for first in range(0, len(several), 1 << 16):  # unpacked 64 bytes per word: in chunks
        chunk = several[first : first + (1 << 16)]
        bits = np.unpackbits(words[chunk].view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
        row, bit = np.nonzero(bits)
        pairs.append((chunk[row], bit.astype(np.int64)))
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def blocks(counts: np.ndarray, limit: int) -> Iterator[slice]:
    """Consecutive slices of `counts` ([n] ints) summing to at most `limit` each (or one
    element): how a scan takes its items a bounded share at a time."""
    ends, start = np.cumsum(counts), 0
    while start < len(counts):
        base = ends[start - 1] if start else 0
        stop = max(int(np.searchsorted(ends, base + limit, side="right")), start + 1)
        yield slice(start, stop)
        start = stop
