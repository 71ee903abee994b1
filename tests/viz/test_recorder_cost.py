"""A recorder's work per frame is the cells the verbs touched, never the table: counted, not
timed. On a table of over 4 000 cells where a decode step touches 3 or 4, each frame reads
from the cache (`cells_state`, `snapshot`) exactly the distinct cells `touched_cells`
reported since the frame before, for both caches, a frame per step or per verb; a recorder
that read the whole table per frame would read a thousand times as many."""

import tracemalloc

import numpy as np
import pytest

import numbakv
import numbakv.trace.recorder as recorder_module
from numbakv import Recorder, load_trace
from numbakv.reference import CellCache as RefCache
from numbakv.trace import zip_stream

from helpers import small_config, step_with

CACHES = {"reference": RefCache, "device": numbakv.CellCache}


def count_reads(cache) -> list[tuple[int, int]]:
    """[(cells read, distinct cells touched since the frame before)], one a frame the
    recorder reads, filled in as it records: `cache`'s touched_cells, cells_state and
    snapshot are wrapped on the instance, where the recorder finds them."""
    frames: list[tuple[int, int]] = []
    touched: set[int] = set()
    touched_cells, cells_state, snapshot = cache.touched_cells, cache.cells_state, cache.snapshot

    def counted_touched() -> np.ndarray:
        cells = touched_cells()
        touched.update(cells.tolist())
        return cells

    def read(n_cells: int) -> None:
        frames.append((n_cells, len(touched)))
        touched.clear()

    def counted_state(cells):
        read(len(cells))
        return cells_state(cells)

    def counted_snapshot():
        snap = snapshot()
        read(snap.read_len)
        return snap

    cache.touched_cells, cache.cells_state = counted_touched, counted_state
    cache.snapshot = counted_snapshot
    return frames


def workload(cache) -> None:
    """A 4 096-token prompt cloned into 3 more sequences that decode 30 steps together; one
    removed, one rewound by 2 tokens, 10 steps more."""
    prompt = cache.seq_new()
    for _ in range(16):
        step_with(cache, [prompt] * 256)
    seqs = [prompt, *(cache.seq_clone(prompt) for _ in range(3))]
    for _ in range(30):
        step_with(cache, seqs)
    cache.seq_rm(seqs.pop())
    cache.rewind(seqs[0], cache.pos(seqs[0]) - 2)
    for _ in range(10):
        step_with(cache, seqs)


@pytest.mark.parametrize("every_verb", [False, True])
@pytest.mark.parametrize("kind", sorted(CACHES))
def test_each_frame_reads_the_cells_the_verbs_touched(kind, every_verb):
    config = small_config(capacity=1 << 13, max_width=256, max_seqs=8, max_seq_len=8192)
    cache = CACHES[kind](config)
    frames = count_reads(cache)
    recorder = Recorder(cache, every_verb=every_verb)
    workload(cache)
    (start_read, _), *reads = frames
    assert start_read == 0 and len(reads) == recorder.trace().n_frames - 1
    assert [read for read, _ in reads] == [touched for _, touched in reads]
    decodes = [read for read, touched in reads if 0 < touched <= 4]
    assert len(decodes) >= 35 and cache.read_len >= 1000 * max(decodes)


def recorder_bytes() -> int:
    """Bytes traced (tracemalloc) in blocks allocated by the recorder's and its streams'
    code, and not freed."""
    where = [tracemalloc.Filter(True, module.__file__) for module in (recorder_module, zip_stream)]
    return sum(
        s.size for s in tracemalloc.take_snapshot().filter_traces(where).statistics("filename")
    )


def test_a_recorder_holds_its_frames_deflated(monkeypatch, tmp_path):
    """What a recording adds to a recorder is its deflated columns, not their arrays: over
    2 000 steps of 4 sequences, one replaced every 10 steps, the memory the recorder's code
    holds grows by under a quarter of what the trace's arrays grow by (each chunk handed
    to the deflating thread at once; `save` waits for it). Holding the arrays, it grew by
    more than they did."""
    monkeypatch.setattr(zip_stream, "HANDOFF_BYTES", 1)
    config = small_config(capacity=1 << 12, max_width=8, max_seqs=8, max_seq_len=1024)
    cache = RefCache(config)
    recorder = Recorder(cache)
    seqs = [cache.seq_new() for _ in range(4)]

    def run(steps: int, path) -> int:
        for step in range(steps):
            if step % 10 == 9:
                cache.seq_rm(seqs.pop(0))
                seqs.append(cache.seq_new())
            step_with(cache, seqs)
        recorder.save(path)
        return sum(array.nbytes for array in load_trace(path).arrays.values())

    tracemalloc.start()
    try:
        raw, held = run(20, tmp_path / "a.npz"), recorder_bytes()
        grown, held_more = run(2000, tmp_path / "b.npz") - raw, recorder_bytes() - held
    finally:
        tracemalloc.stop()
    assert grown > 300_000 and 4 * held_more < grown, (grown, held_more)
