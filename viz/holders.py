"""Cells only the prefix cache holds: which sequences are its holders at each frame, and
the owner codes the pictures draw with holders set aside.

An engine with a prefix cache says so in its annotations (docs/contract.md §9.2, §10): an
`insert` with `held=True` hands a session's id to the prefix cache (it is a holder from
the next frame on: it belongs to no running request), and a later annotation binding the
id to a request (`admit`, `fork`, `hit`, `resume`, an `insert` with `held=False`) makes
it a request's again (ids are reused once a holder is removed). A cell is drawn as its
running owners say: one running owner's id, SHARED for several, CACHED when every owner
is a holder; holders among running owners are left out, so the cells a hit shares with
its holder keep the request's colour.
"""

import numpy as np

from numbakv.core.snapshot import FREE, Snapshot, owner_codes
from numbakv.trace.frames import Trace
from numbakv.trace.scan import CellIndex, TableReplay, change_frames, id_words

CACHED = -4  # the code (and pixel label) of a cell every owner of which is a holder
REBINDING = ("admit", "fork", "hit", "resume", "insert")  # insert: with held=False only


def holder_table(trace: Trace) -> np.ndarray:
    """[n_frames, max_seqs] bool: the sequence ids the prefix cache holds at each frame,
    by the annotations before it (each holds from the frame after its own, as bindings
    do); ids past max_seqs name no sequence and are ignored."""
    max_seqs = trace.config.max_seqs
    table = np.zeros((trace.n_frames, max_seqs), dtype=bool)
    if "insert" not in trace.annotation_counts():  # no holder, ever
        return table
    for a in trace.annotations:
        held = a.kind == "insert" and a.data.get("held") is True
        if not held and (a.kind not in REBINDING or not _is_id(a.data.get("request"))):
            continue
        seqs = a.data["seqs"] if isinstance(a.data.get("seqs"), list) else [a.data.get("seq")]
        ids = [s for s in seqs if _is_id(s) and s < max_seqs]
        table[a.frame + 1 :, ids] = held
    return table


def visible_codes(owners: np.ndarray, held: np.ndarray) -> np.ndarray:
    """[n] int32 codes of cells with owner bitsets `owners` ([n, words] uint64) when the
    holders are `held` (bitsets [words] or [n, words]): the single running owner's id,
    SHARED for several, CACHED when holders alone own the cell, FREE when no one does."""
    codes = owner_codes(owners & ~held)
    codes[(codes == FREE) & owners.any(axis=1)] = CACHED
    return codes


def table_codes(snapshot: Snapshot, holders: np.ndarray) -> np.ndarray:
    """[read_len] int32 visible codes of one table, `holders` [max_seqs] bool its holders."""
    return visible_codes(snapshot.owners, id_words(holders))


def change_index(trace: Trace, changes: dict[str, np.ndarray]) -> CellIndex:
    """The `CellIndex` of `changes` (`cell_changes`): the trace's own when they are its."""
    own = changes["delta_cells"] is trace.arrays["delta_cells"]
    return trace.cell_index if own else CellIndex(changes)


def cell_changes(trace: Trace, holders: np.ndarray) -> dict[str, np.ndarray]:
    """The trace's changes as visible codes (`visible_codes`) under `holders` ([n_frames,
    max_seqs] bool, `holder_table`): a change wherever a cell's code changes, also when
    only its owners' holding does (an `insert` held, a rebinding). The keys the scans of
    `numbakv.trace.scan` read, with the codes:

        events        : [n_frames] uint8, the trace's
        delta_offsets : [n_frames + 1] int64, frame f's changes are [offsets[f], [f + 1])
        delta_cells   : [n_changes] int32, ascending within a frame
        codes         : [n_changes] int32, each change's new code (an id, FREE, SHARED, CACHED)

    O(changes) without holders; each frame the holders change at costs O(cells) more."""
    a = trace.arrays
    if not holders.any():
        keys = ("events", "delta_offsets", "delta_cells")
        return {**{key: a[key] for key in keys}, "codes": a["delta_codes"]}
    flips = np.zeros(trace.n_frames, dtype=bool)
    flips[1:] = (holders[1:] != holders[:-1]).any(axis=1)
    words, offsets = id_words(holders), a["delta_offsets"]
    replay = TableReplay(a, int(a["read_len"].max(initial=0)), words.shape[1])
    codes = np.empty(len(a["delta_cells"]), dtype=np.int32)
    extra = []  # (frames, cells, codes) of cells only the holding changed
    for f in range(trace.n_frames):
        cells = replay.apply(f)
        codes[offsets[f] : offsets[f + 1]] = visible_codes(replay.owners[cells], words[f])
        if flips[f]:
            owners = replay.owners
            touched = np.flatnonzero((owners & (words[f] ^ words[f - 1])).any(axis=1))
            touched = np.setdiff1d(touched, cells)  # coded already
            now = visible_codes(owners[touched], words[f])
            moved = now != visible_codes(owners[touched], words[f - 1])
            extra.append((np.full(int(moved.sum()), f), touched[moved], now[moved]))
    frames = np.concatenate([change_frames(a), *[e[0] for e in extra]])
    all_cells = np.concatenate([a["delta_cells"], *[e[1] for e in extra]]).astype(np.int32)
    codes = np.concatenate([codes, *[e[2] for e in extra]]).astype(np.int32)
    order = np.lexsort((all_cells, frames))
    counts = np.bincount(frames, minlength=trace.n_frames)
    return {
        "events": a["events"],
        "delta_offsets": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        "delta_cells": all_cells[order],
        "codes": codes[order],
    }


def _is_id(value: object) -> bool:
    """True for an int >= 0 that is not a bool: a sequence or request id."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
