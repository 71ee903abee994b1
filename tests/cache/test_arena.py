"""The segment arena: each sequence's cells in position order survive moves and compactions."""

from functools import partial

import numpy as np

from numbakv.cache.arena import Segments, append
from numbakv.cache.table import HostTable
from numbakv.reference.table import CellTable

from table_pair import assert_same, clone_id, config, new_id, remove, step_cells


def test_appends_move_and_compact_yet_keep_every_segment(monkeypatch):
    compactions = []
    original = Segments._compact
    monkeypatch.setattr(
        Segments, "_compact", lambda self, short: (compactions.append(short), original(self, short))
    )
    segments = Segments(4)
    expect = {seq: [] for seq in range(4)}
    rng = np.random.default_rng(0)
    for _ in range(300):
        seq_ids = rng.integers(0, 4, int(rng.integers(1, 9))).astype(np.int32)
        segments.reserve(seq_ids)
        for seq in seq_ids.tolist():
            cell = int(rng.integers(1000))
            append(segments.arena, segments.seg, seq, cell)
            expect[seq].append(cell)
        if rng.random() < 0.1:  # a sequence leaves and comes back empty
            seq = int(rng.integers(4))
            segments.close(seq)
            expect[seq] = []
        assert segments.is_consistent(np.ones(4, dtype=bool))
    for seq, cells in expect.items():
        assert segments.cells(seq).tolist() == cells
    assert compactions


def test_is_consistent_catches_overlapping_segments():
    segments = Segments(2)
    for seq in (0, 1):
        segments.open(seq, 16)
    assert segments.is_consistent(np.ones(2, dtype=bool))
    segments.seg[0, 1] = 8  # sequence 1's segment now starts inside sequence 0's
    assert not segments.is_consistent(np.ones(2, dtype=bool))


def test_arena_compaction_keeps_every_sequence(monkeypatch):
    """Many clones and removals on a small table: segments move and the arena compacts."""
    compactions = []
    original = Segments._compact
    monkeypatch.setattr(
        Segments,
        "_compact",
        lambda self, short: (compactions.append(short), original(self, short)),
    )
    cfg = config(40, 3, max_width=8)
    rng = np.random.default_rng(0)
    host, ref = HostTable(cfg), CellTable(cfg)
    for _ in range(600):
        live = np.flatnonzero(ref.live).tolist()
        kind = rng.integers(4)
        if not live or (kind == 0 and len(live) < 3):
            op = new_id
        elif kind == 1 and len(live) < 3:
            src = live[rng.integers(len(live))]
            upto = int(rng.integers(ref.length(src) + 1))
            op = partial(clone_id, src=src, upto=upto)
        elif kind == 2 and ref.free_cells:
            n = int(rng.integers(1, min(8, ref.free_cells) + 1))
            op = partial(step_cells, seq_ids=rng.choice(live, n).tolist())
        else:
            op = partial(remove, seq=live[rng.integers(len(live))])
        assert op(host) == op(ref)
        assert_same(host, ref)
    assert compactions
