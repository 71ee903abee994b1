"""Figures of a trace computed from its recorded changes, never from a table per frame
(numba-free): `Trace.metrics`, `Trace.timeline` and the pictures of `numbakv.viz` read the
trace through these.

A trace stores, per frame, only the cells that changed. The per-frame figures follow from
each change and the change before it of the same cell (vectorized over the changes); what
needs the whole table (the largest free run, contiguous runs per sequence) replays it once,
in place, touching only the changed cells' neighbourhood per frame.
"""

from collections.abc import Iterator

import numpy as np

from numbakv.core.snapshot import FREE, SHARED
from numbakv.trace.free_runs import FreeRuns


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


def request_table(bindings: np.ndarray, n_frames: int, max_seqs: int) -> np.ndarray:
    """[n_frames, max_seqs] int64: the request each sequence id is bound to at each frame,
    -1 for none. `bindings` are `Trace.seq_bindings()` rows (frame, seq, request): each
    holds from the frame after its own until the id's next binding."""
    table = np.full((n_frames, max_seqs), -1, dtype=np.int64)
    for frame, seq, request in bindings.tolist():
        table[frame + 1 :, seq] = request
    return table


def used_and_held(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """([n_frames] int64 occupied cells, [n_frames] int64 tokens held) after each frame;
    held - occupied is what sharing saves."""
    codes, n_owners = arrays["delta_codes"], owner_counts(arrays)
    previous = previous_changes(arrays)
    had = previous >= 0
    frames, n_frames = change_frames(arrays), len(arrays["events"])
    was_used = np.zeros(len(codes), dtype=np.int64)
    was_used[had] = codes[previous[had]] != FREE
    d_used = np.bincount(frames, (codes != FREE) - was_used, n_frames)
    was_held = np.zeros(len(codes), dtype=np.int64)
    was_held[had] = n_owners[previous[had]]
    d_held = np.bincount(frames, n_owners - was_held, n_frames)
    return np.cumsum(d_used).astype(np.int64), np.cumsum(d_held).astype(np.int64)


def owner_counts(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """[n_changes] int64: how many owners each change leaves its cell. A change to an id
    or FREE says it (1, 0); one to SHARED adds its toggles' gains less losses to the count
    the cell's change before left (a running sum over each cell's changes, restarted at
    every plain change)."""
    codes, cells = arrays["delta_codes"], arrays["delta_cells"]
    toggled = np.repeat(np.arange(len(codes)), arrays["toggle_counts"])
    gains = np.bincount(toggled, np.where(arrays["toggle_seqs"] >= 0, 1, -1), len(codes))
    value = np.where(codes == SHARED, gains, codes >= 0).astype(np.int64)
    order = np.argsort(cells, kind="stable")  # each cell's changes, in frame order
    value = value[order]
    restart = codes[order] != SHARED
    restart[:1] = True
    restart[1:] |= cells[order][1:] != cells[order][:-1]
    total = np.cumsum(value)
    starts = np.flatnonzero(restart)
    before = np.repeat((total - value)[starts], np.diff(np.append(starts, len(codes))))
    counts = np.empty(len(codes), dtype=np.int64)
    counts[order] = total - before
    return counts


def last_of(cells: np.ndarray) -> np.ndarray:
    """int64 indices of each distinct value's last occurrence in `cells`, by value."""
    _, first = np.unique(cells[::-1], return_index=True)  # first in reverse: the last
    return len(cells) - 1 - first


def id_words(flags: np.ndarray) -> np.ndarray:
    """[..., ceil(max_seqs / 64)] uint64 bitsets of the ids `flags` ([..., max_seqs] bool)
    marks, id i at bit i % 64 of word i // 64: the owner bitsets' layout."""
    padded = np.zeros((*flags.shape[:-1], -(-flags.shape[-1] // 64) * 64), dtype=bool)
    padded[..., : flags.shape[-1]] = flags
    return np.packbits(padded, axis=-1, bitorder="little").view(np.uint64)


def replay_codes(
    arrays: dict[str, np.ndarray], n_cells: int, new_codes: np.ndarray | None = None
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(frame, codes, changed cells) per frame, in order: `codes` is one `[n_cells] int32`
    array of owner codes (ids, FREE, SHARED), updated in place to the table after that
    frame. Consumers read it before the next iteration and never keep it. `new_codes`:
    each change's code when not the trace's own (`delta_codes`)."""
    codes = np.full(n_cells, FREE, dtype=np.int32)
    new_codes = arrays["delta_codes"] if new_codes is None else new_codes
    offsets, cells = arrays["delta_offsets"], arrays["delta_cells"]
    for f in range(len(arrays["events"])):
        changed = slice(offsets[f], offsets[f + 1])
        codes[cells[changed]] = new_codes[changed]
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
    return ids // 64, np.left_shift(np.uint64(1), (ids % 64).astype(np.uint64))


def replay_table(
    arrays: dict[str, np.ndarray], n_cells: int, n_words: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(frame, pos, owners, changed cells) per frame, in order, `pos` and `owners` one
    `TableReplay`'s arrays (read them before the next iteration, never keep them)."""
    replay = TableReplay(arrays, n_cells, n_words)
    for f in range(len(arrays["events"])):
        changed = replay.apply(f)
        yield f, replay.pos, replay.owners, changed


def largest_free_run(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """[n_frames] int64: the longest stretch of consecutive free cells among the pool's
    allocated rows [0, rows) after each frame (what one contiguous placement could get);
    O(changes log cells) (`FreeRuns`)."""
    rows = arrays["rows"]
    n_cells = int(rows.max(initial=0))
    out = np.zeros(len(rows), dtype=np.int64)
    runs, allocated = FreeRuns(n_cells), 0  # a cell past the rows is not free for placement
    for f, codes, changed in replay_codes(arrays, n_cells):
        grown = np.arange(allocated, rows[f])  # rows never shrink (`checks`)
        cells = np.concatenate([changed[changed < allocated], grown])  # ascending
        runs.set(cells, codes[cells] == FREE)
        allocated = max(allocated, int(rows[f]))
        out[f] = runs.largest
    return out


def sequence_runs(arrays: dict[str, np.ndarray], max_seqs: int, n_words: int) -> np.ndarray:
    """[n_frames, max_seqs] int32: how many maximal runs of consecutive cells each sequence
    owns after each frame (shared cells count for every owner; 0 = it owns none). One run
    is a contiguous sequence; k runs are k separate stretches gathered attention reads."""
    n_cells, n_frames = int(arrays["read_len"].max(initial=0)), len(arrays["events"])
    replay = TableReplay(arrays, n_cells + 1, n_words)  # row n_cells: a free sentinel
    owners = replay.owners
    delta = np.zeros((n_frames, max_seqs), dtype=np.int64)
    for f in np.flatnonzero(np.diff(arrays["delta_offsets"])).tolist():  # frames that change
        # a run starts at cell x for each owner of x that does not own x - 1: only starts
        # at a changed cell or just past one can change (cell -1 is row n_cells: free)
        c = replay.changes(f)[0]  # ascending (trace checks)
        at = np.concatenate([c, (c + 1)[np.append(c[1:] != c[:-1] + 1, True)]])
        at = at[at < n_cells]
        before = owners[at] & ~owners[at - 1]  # the run starts there before the frame
        replay.apply(f)
        rows, seqs = owner_bits(np.concatenate([before, owners[at] & ~owners[at - 1]]))
        after = rows >= len(at)
        delta[f] = np.bincount(seqs[after], minlength=max_seqs) - np.bincount(
            seqs[~after], minlength=max_seqs
        )
    return np.cumsum(delta, axis=0).astype(np.int32)


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
