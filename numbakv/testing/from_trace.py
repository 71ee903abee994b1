"""The op script of a recorded trace: a `Recorder(cache, every_verb=True)` keeps a frame after
every verb (its event, the table) and every step (its declaration), so the verbs and their
arguments can be read back from consecutive frames, and the workload replayed into any cache
(`numbakv.testing.replay`). NumPy only.

What each frame gives: `seq_new`, `clear` need nothing; `seq_rm` removed the id that left;
`rewind` shortened the sequence whose length dropped (none dropped: a rewind to the end);
`seq_clone` made the new id, `upto` its length, from the lowest live id whose cells at
positions below `upto` are exactly the clone's (any such source gives the same table); a
`prepare_step` frame holds the step's sequence ids and width (its declaration). K/V are not
recorded: a replayed step writes synthetic K/V drawn from its frame index.
"""

import numpy as np

from numbakv.testing.op import Op

VERB_EVENTS = ("seq_new", "seq_clone", "seq_rm", "rewind", "clear")


def trace_ops(trace) -> list[Op]:
    """The ops of `trace` (a `numbakv.Trace` recorded with every_verb=True), in order.
    ValueError when the live ids change between two frames with no verb frame between
    them: a trace of steps only cannot say what happened in between."""
    events, snapshots, ops = trace.events, list(trace.snapshots()), []
    for frame in range(1, trace.n_frames):
        before, after, event = snapshots[frame - 1], snapshots[frame], events[frame]
        if event in VERB_EVENTS:
            ops.append(_verb(event, before, after))
            continue
        if event == "seq_load":
            ops += _load(before, after, trace.config.max_width, frame)
            continue
        if not _grows_only(before, after):
            raise ValueError(
                f"sequences leave or shrink before frame {frame} ({event}) with no verb frame: "
                "record the trace with Recorder(cache, every_verb=True)"
            )
        if event == "prepare_step":
            step = trace.step(frame)
            ids = tuple(int(s) for s in step.seq_ids if s >= 0)
            ops.append(Op("step", (ids, step.width, 1, frame)))
    return ops


def _grows_only(before, after) -> bool:
    """Whether `after` has the live ids of `before`, none shorter (what a step does)."""
    live = np.flatnonzero(before.live).tolist()
    return np.array_equal(before.live, after.live) and all(
        _length(after, s) >= _length(before, s) for s in live
    )


def _verb(event: str, before, after) -> Op:
    if event in ("seq_new", "clear"):
        return Op(event)
    if event == "seq_rm":
        (gone,) = np.flatnonzero(before.live & ~after.live)
        return Op("seq_rm", (int(gone),))
    if event == "rewind":
        live = np.flatnonzero(after.live).tolist()
        shorter = [s for s in live if _length(after, s) < _length(before, s)]
        seq = shorter[0] if shorter else live[0]
        return Op("rewind", (seq, _length(after, seq)))
    (clone,) = np.flatnonzero(after.live & ~before.live)
    return _clone(before, set(_cells(after, int(clone))), int(clone))


def _clone(before, cells: set[int], clone: int) -> Op:
    """The seq_clone of a sequence of `before` that made `clone`, holding `cells`."""
    upto = len(cells)
    for src in np.flatnonzero(before.live).tolist():
        if {c for c in _cells(before, src) if before.pos[c] < upto} == cells:
            return Op("seq_clone", (src, upto))
    raise ValueError(f"no live sequence holds the cells of clone {clone}")


def _load(before, after, max_width: int, frame: int) -> list[Op]:
    """A seq_load as the ops that place what it placed (docs/contract.md §13): the new
    sequence (a clone of the cells it shares), then steps of its own tokens, max_width at a
    time: a load takes the lowest free cells, as those steps do one after the other."""
    (seq,) = np.flatnonzero(after.live & ~before.live).tolist()
    held = _cells(after, seq)
    shared = {c for c in held if c < before.read_len and before.pos[c] >= 0}
    ops = [_clone(before, shared, seq) if shared else Op("seq_new")]
    for first in range(len(shared), len(held), max_width):
        n = min(max_width, len(held) - first)
        ops.append(Op("step", ((seq,) * n, n, 1, frame)))
    return ops


def _cells(snapshot, seq: int) -> list[int]:
    """The cells `seq` owns in `snapshot`."""
    word, bit = seq >> 6, np.uint64(seq & 63)
    held = (snapshot.owners[:, word] >> bit) & np.uint64(1)
    return np.flatnonzero(held).tolist()


def _length(snapshot, seq: int) -> int:
    return len(_cells(snapshot, seq))
