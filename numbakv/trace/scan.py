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

from numbakv.snapshot import FREE, owner_codes


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


def change_codes(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """[n_changes] int32: each change's new owner code (an id, FREE or SHARED)."""
    return owner_codes(arrays["delta_owners"])


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
    previous = previous_changes(arrays)
    held = np.bitwise_count(arrays["delta_owners"]).sum(axis=1, dtype=np.int64)
    held_before = np.where(previous >= 0, held[np.maximum(previous, 0)], 0)
    frames, n_frames = change_frames(arrays), len(arrays["events"])
    d_used = np.bincount(frames, (held > 0).astype(np.int64) - (held_before > 0), n_frames)
    d_held = np.bincount(frames, held - held_before, n_frames)
    return np.cumsum(d_used).astype(np.int64), np.cumsum(d_held).astype(np.int64)


def last_changes(arrays: dict[str, np.ndarray], frame: int) -> np.ndarray:
    """int64 indices of each changed cell's last change up to and including `frame`."""
    return last_of(arrays["delta_cells"][: arrays["delta_offsets"][frame + 1]])


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
    `change_codes(arrays)`, when the caller has it already."""
    codes = np.full(n_cells, FREE, dtype=np.int32)
    new_codes = change_codes(arrays) if new_codes is None else new_codes
    offsets, cells = arrays["delta_offsets"], arrays["delta_cells"]
    for f in range(len(arrays["events"])):
        changed = slice(offsets[f], offsets[f + 1])
        codes[cells[changed]] = new_codes[changed]
        yield f, codes, cells[changed]


def largest_free_run(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """[n_frames] int64: the longest stretch of consecutive free cells among the pool's
    allocated rows [0, rows) after each frame (what one contiguous placement could get)."""
    rows = arrays["rows"]
    n_cells = int(rows.max(initial=0))
    out = np.zeros(len(rows), dtype=np.int64)
    free = np.ones(n_cells + 2, dtype=np.int8)  # free[c + 1]: cell c; a used sentinel first
    free[0] = 0
    best = (0, 0)  # [start, end) of a longest run, as free[] indices
    for f, codes, changed in replay_codes(arrays, n_cells):
        was = free[changed + 1].copy()
        free[changed + 1] = codes[changed] == FREE
        taken = changed[(was == 1) & (free[changed + 1] == 0)] + 1
        grew = f > 0 and rows[f] > rows[f - 1]
        # the longest run only shrinks when a cell of it is taken, only grows when a cell
        # is freed or the pool grows: otherwise it stands, and the scan is skipped
        if (
            grew
            or (free[changed + 1] > was).any()
            or ((taken >= best[0]) & (taken < best[1])).any()
        ):
            edges = np.flatnonzero(np.diff(free[: rows[f] + 1], append=0))
            lengths = edges[1::2] - edges[::2]
            i = int(lengths.argmax()) if len(lengths) else 0
            best = (int(edges[2 * i]), int(edges[2 * i + 1])) if len(lengths) else (0, 0)
        out[f] = best[1] - best[0]
    return out


def sequence_runs(arrays: dict[str, np.ndarray], max_seqs: int) -> np.ndarray:
    """[n_frames, max_seqs] int32: how many maximal runs of consecutive cells each sequence
    owns after each frame (shared cells count for every owner; 0 = it owns none). One run
    is a contiguous sequence; k runs are k separate stretches gathered attention reads."""
    n_cells, n_frames = int(arrays["read_len"].max(initial=0)), len(arrays["events"])
    owners = np.zeros((n_cells + 1, arrays["delta_owners"].shape[1]), dtype=np.uint64)
    offsets, cells, new = arrays["delta_offsets"], arrays["delta_cells"], arrays["delta_owners"]
    befores, afters, at_frames, n_at = [], [], [], []
    for f in np.flatnonzero(np.diff(offsets)).tolist():  # the frames that change cells
        changed = slice(offsets[f], offsets[f + 1])
        # a run starts at cell x for each owner of x that does not own x - 1 (owners row
        # x + 1 holds cell x): only starts at a changed cell or just past one can change
        c = cells[changed]  # ascending (trace_checks): c + 1 is in c where neighbours changed
        at = np.concatenate([c, (c + 1)[np.append(c[1:] != c[:-1] + 1, True)]])
        at = at[at < n_cells]
        befores.append(owners[at + 1] & ~owners[at])
        owners[cells[changed] + 1] = new[changed]
        afters.append(owners[at + 1] & ~owners[at])
        at_frames.append(f)
        n_at.append(len(at))
    delta = np.zeros((n_frames, max_seqs), dtype=np.int64)
    frames = np.repeat(np.array(at_frames, dtype=np.int64), n_at)
    for starts, sign in ((befores, -1), (afters, 1)):
        starts = np.concatenate(starts) if starts else np.zeros((0, owners.shape[1]), np.uint64)
        for word in range(starts.shape[1]):
            row, bit = bit_pairs(starts[:, word])
            np.add.at(delta, (frames[row], 64 * word + bit), sign)
    return np.cumsum(delta, axis=0).astype(np.int32)


def bit_pairs(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index, bit) int64 of every bit set in `words` ([n] uint64), grouped: first the words
    with one bit set, then the others, each in index order."""
    one = np.uint64(1)
    single = np.flatnonzero((words != 0) & (words & (words - one) == 0))
    # a power of two is exact in float64, so its log2 is its bit
    pairs = [(single, np.log2(words[single].astype(np.float64)).astype(np.int64))]
    several = np.flatnonzero(words & (words - one) != 0)
    for first in range(0, len(several), 1 << 16):  # unpacked 64 bytes per word: in chunks
        chunk = several[first : first + (1 << 16)]
        bits = np.unpackbits(words[chunk].view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
        row, bit = np.nonzero(bits)
        pairs.append((chunk[row], bit.astype(np.int64)))
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])
