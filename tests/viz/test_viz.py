"""The pictures: the data behind each plot, binned and zoomed, equals what the trace says
(computed here cell by cell from `Trace.timeline`), and the images show exactly that data."""

import numpy as np
import pytest
from matplotlib.colors import to_rgb

from numbakv import Recorder
from numbakv.core.snapshot import FREE, SHARED
from numbakv.reference import CellCache
from numbakv.trace import scan
from numbakv.viz import (
    owner_pixels,
    owners_of,
    plot_all,
    plot_cells,
    plot_locality,
    plot_mask,
    plot_metrics,
    plot_timeline,
)
from numbakv.viz.owners import MIXED, OTHER_COLOUR, PALETTE
from numbakv.viz.panels import locality

from helpers import churn, small_config, step_with


@pytest.fixture(scope="module")
def annotated():
    """A churned trace whose annotations bind sequences to requests, an id reused by a
    second request, shared cells and a user's own annotation kind."""
    cache = CellCache(small_config(max_seqs=9, capacity=48, initial_cells=3))
    recorder = Recorder(cache)
    a, b = cache.seq_new(), cache.seq_new()
    recorder.annotate("admit", request=10, seqs=[a, b])
    step_with(cache, [a, a, b, b, a])
    c = cache.seq_clone(a)
    recorder.annotate("fork", request=10, seqs=[c])
    step_with(cache, [a, c, b])
    cache.seq_rm(b)
    recorder.annotate("finish", request=10, seq=b)
    d = cache.seq_new()
    assert d == b  # the id comes back: bound to another request from now on
    recorder.annotate("admit", request=11, seqs=[d])
    step_with(cache, [d, d, d, a])
    recorder.annotate("my_event", note="hello")
    churn(cache, list(range(3, 700, 13)))
    return recorder.trace()


def oracle(trace, owners, cells, steps, cell_bin, step_bin):
    """(occupied, shared, label) per pixel, cell-step by cell-step from the dense timeline."""
    codes = trace.timeline()[steps[0] : steps[1], cells[0] : cells[1]]
    groups = owners.seq_groups[trace.step_frames[steps[0] : steps[1]]]
    keyed = np.where(codes >= 0, np.take_along_axis(groups, np.maximum(codes, 0), 1), codes)
    rows = range(0, codes.shape[0], step_bin)
    cols = range(0, codes.shape[1], cell_bin)
    occupied, shared = np.zeros((len(rows), len(cols))), np.zeros((len(rows), len(cols)))
    label = np.zeros((len(rows), len(cols)), dtype=np.int64)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            block = keyed[r : r + step_bin, c : c + cell_bin].ravel()
            held = block[block != FREE]
            occupied[i, j], shared[i, j] = len(held) / block.size, np.mean(block == SHARED)
            values, counts = np.unique(held, return_counts=True)
            if not len(held):
                label[i, j] = FREE
            elif 2 * counts.max() > len(held):
                label[i, j] = values[counts.argmax()]
            else:
                label[i, j] = MIXED
    return occupied, shared, label


@pytest.mark.parametrize("by", ["request", "seq"])
@pytest.mark.parametrize(
    ("cells", "steps", "cell_bin", "step_bin"),
    [(None, None, 1, 1), (None, None, 3, 4), ((5, 29), (2, 40), 5, 3), ((0, 7), (9, 10), 2, 1)],
)
def test_timeline_pixels_are_the_trace_binned(annotated, by, cells, steps, cell_bin, step_bin):
    trace = annotated
    owners = owners_of(trace, by)
    n_cells, n_steps = int(trace.arrays["read_len"].max()), trace.n_steps
    cells, steps = cells or (0, n_cells), steps or (0, n_steps)
    cells, steps = (cells[0], min(cells[1], n_cells)), (steps[0], min(steps[1], n_steps))
    pixels = owner_pixels(trace, owners, cells, steps, cell_bin, step_bin)
    occupied, shared, label = oracle(trace, owners, cells, steps, cell_bin, step_bin)
    np.testing.assert_allclose(pixels.occupied, occupied)
    np.testing.assert_allclose(pixels.shared, shared)
    np.testing.assert_array_equal(pixels.label, label)
    assert (label == MIXED).any() or cell_bin == step_bin == 1


def test_requests_colour_the_cells_their_sequences_hold(annotated):
    trace = annotated
    owners = owners_of(trace)
    assert owners.by == "request"  # the annotations bind requests: the default
    request = {label: g for g, label in enumerate(owners.labels)}
    first = trace.step_frames[0]
    assert owners.seq_groups[first, 0] == owners.seq_groups[first, 1] == request["request 10"]
    reused = trace.step_frames[2]  # after seq 1 was closed and reopened for request 11
    assert owners.seq_groups[reused, 1] == request["request 11"]
    assert owners.seq_groups[reused, 2] == request["request 10"]  # the fork
    assert owners_of(trace, "seq").seq_groups[reused, 1] == 1


def test_the_timeline_image_shows_its_pixels(annotated):
    assert annotated.n_steps > 15
    fig = plot_timeline(annotated, bin=2, step_bin=3, steps=(1, 15))
    pixels, owners = fig.numbakv["pixels"], fig.numbakv["owners"]
    image = fig.axes[0].images[0].get_array()
    colour = owners.rgb(pixels.label)
    np.testing.assert_allclose(image, 1 - pixels.occupied[..., None] * (1 - colour))
    free, full = pixels.occupied == 0, pixels.occupied == 1
    assert (image[free] == 1).all() and free.any() and full.any()
    np.testing.assert_allclose(image[full & (pixels.label == SHARED)], 0)
    red = [line for line in fig.axes[0].get_lines() if line.get_color() == "#D00000"]
    read_len = annotated.arrays["read_len"][annotated.step_frames[1:15]]
    np.testing.assert_array_equal(red[0].get_ydata(), np.arange(1, 15))
    np.testing.assert_array_equal(red[0].get_xdata(), np.clip(read_len, 0, None) - 0.5)


def test_plot_cells_blocks_are_the_snapshot(annotated):
    trace, labels = annotated, set()
    for block, columns in ((1, 8), (3, 4), (5, 16)):
        fig = plot_cells(trace, 20, bin=block, columns=columns)
        pixels, snap = fig.numbakv["pixels"], fig.numbakv["snapshot"]
        assert snap == trace.snapshot(trace.step_frames[20])
        owners = fig.numbakv["owners"]
        n = max(snap.rows, snap.read_len)
        np.testing.assert_array_equal(pixels.cell_edges, np.append(np.arange(0, n, block), n))
        groups = owners.seq_groups[trace.step_frames[20]]
        for j, lo in enumerate(pixels.cell_edges[:-1].tolist()):
            codes = [
                snap.codes[c] if c < snap.read_len else FREE for c in range(lo, lo + block) if c < n
            ]
            held = [groups[c] if c >= 0 else c for c in codes if c != FREE]
            assert pixels.occupied[0, j] == len(held) / len(codes)
            assert pixels.shared[0, j] == held.count(SHARED) / len(codes)
            top = max(held, key=held.count) if held else FREE
            want = top if not held or 2 * held.count(top) > len(held) else MIXED
            assert pixels.label[0, j] == want, (block, j)
            labels.add(want)
        grid = fig.axes[0].images[0].get_array()
        assert grid.shape[1] == min(columns, len(pixels.label[0]))
        columns = grid.shape[1]
        cell = int(np.flatnonzero(pixels.occupied[0] == 1)[0])
        want = owners.rgb(pixels.label[0, cell])
        np.testing.assert_allclose(grid[cell // columns, cell % columns], want)
    assert {FREE, SHARED, MIXED} <= labels  # every kind of label was checked


def test_plot_cells_zooms(annotated):
    fig = plot_cells(annotated, -1, cells=(4, 20), bin=1)
    pixels = fig.numbakv["pixels"]
    snap = annotated.snapshot(-1)
    np.testing.assert_array_equal(pixels.cell_edges, np.arange(4, 21))
    np.testing.assert_array_equal(pixels.occupied[0], snap.codes[4:20] != FREE)
    with pytest.raises(ValueError, match=r"cells 99:120 is empty or outside the picture's 48"):
        plot_cells(annotated, cells=(99, 120))


def test_a_lone_owner_among_many_is_other_and_the_figure_says_so():
    cache = CellCache(small_config(max_seqs=20, capacity=64, initial_cells=64, max_width=64))
    recorder = Recorder(cache)
    seqs = [cache.seq_new() for _ in range(14)]
    step_with(cache, [s for s in seqs for _ in range(1 + s % 4)])
    trace = recorder.trace()
    owners = owners_of(trace)
    assert owners.by == "seq" and len(owners.shown) == len(PALETTE) == 9
    assert owners.note == "14 sequences; the 9 largest shown"
    sizes = owners.totals[list(owners.shown)]
    rest = np.delete(owners.totals, owners.shown)
    assert (np.diff(sizes) <= 0).all() and sizes.min() >= rest.max()
    others = [g for g in range(14) if g not in owners.shown]
    np.testing.assert_allclose(owners.colours[others], [to_rgb(OTHER_COLOUR)] * len(others))
    assert len({tuple(c) for c in owners.colours[list(owners.shown)]}) == 9  # no collision
    for fig in (plot_cells(trace), plot_timeline(trace)):
        legend = fig.axes[0].get_legend()
        assert legend.get_title().get_text() == "14 sequences; the 9 largest shown"
        texts = [t.get_text() for t in legend.get_texts()]
        assert "other sequences (5)" in texts
        assert [t for t in texts if t.startswith("seq")] == [owners.labels[g] for g in owners.shown]


def test_metrics_on_one_clock_with_annotations(annotated):
    trace = annotated
    fig = plot_metrics(trace)
    cells_ax, frag_ax, events_ax, free_ax = fig.axes[0], fig.axes[1], fig.axes[3], fig.axes[4]
    np.testing.assert_array_equal(
        frag_ax.get_lines()[0].get_ydata(), trace.metrics()["fragmentation"]
    )
    m = trace.metrics()
    lines = {line.get_label(): line for line in cells_ax.get_lines()}
    np.testing.assert_array_equal(lines["used"].get_xdata(), trace.frame_steps)
    np.testing.assert_array_equal(lines["used"].get_ydata(), m["used"])
    assert lines["read_len"].get_color() == "#D00000"
    np.testing.assert_array_equal(free_ax.get_lines()[0].get_ydata(), m["largest_free"])
    assert fig.numbakv["counts"] == {"admit": 2, "fork": 1, "finish": 1, "my_event": 1}
    ticks = [t.get_text() for t in events_ax.get_yticklabels()]
    assert ticks == ["admit (2)", "fork (1)", "finish (1)", "my_event (1)"]
    marks = [c.get_offsets()[:, 0].tolist() for c in events_ax.collections]
    assert marks == [
        [a.step for a in trace.annotations if a.kind == k]
        for k in ("admit", "fork", "finish", "my_event")
    ]
    assert marks[:3] == [[0, 2], [1], [2]]


@pytest.mark.parametrize("spans_at_once", [scan.SPANS_AT_ONCE, 1, 120])  # all ids, 1, 2 or 3
def test_largest_free_run_and_locality_are_the_tables(annotated, spans_at_once, monkeypatch):
    monkeypatch.setattr(scan, "SPANS_AT_ONCE", spans_at_once)
    trace = annotated
    free = trace.metrics()["largest_free"]
    runs = locality(trace)
    for f, snap in enumerate(trace.snapshots()):
        n_owners = np.zeros(snap.rows, dtype=np.int64)
        n_owners[: snap.read_len] = snap.n_owners
        best = run = 0
        for count in n_owners.tolist():
            run = run + 1 if count == 0 else 0
            best = max(best, run)
        assert free[f] == best, f
        if f in trace.step_frames:
            step = int(np.searchsorted(trace.step_frames, f))
            for seq in range(trace.config.max_seqs):
                held = [seq in snap.owners_of(c) for c in range(snap.read_len)]
                starts = sum(h and (c == 0 or not held[c - 1]) for c, h in enumerate(held))
                assert runs[step, seq] == starts, (f, seq)
    fig = plot_locality(trace, steps=(3, 30))
    np.testing.assert_array_equal(fig.numbakv["runs"], runs[3:30])


def test_plot_mask_is_the_mask_binned():
    cache = CellCache(small_config(windows=(0, 2), capacity=32))
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, b, a, b, b, a, a])
    step = step_with(cache, [b, a, a], width=5)
    for window in (0, 2):
        for bin in (1, 3):
            fig = plot_mask(step, window, bin=bin)
            pixels = fig.numbakv["pixels"]
            mask = step.mask(window).astype(np.int64)
            binned = np.add.reduceat(mask, np.arange(0, mask.shape[1], bin), axis=1)
            np.testing.assert_array_equal(pixels.attended, binned)
            grey = fig.axes[0].images[0].get_array()[..., 0]
            assert ((grey < 1) == (binned > 0)).all()
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert labels == ["1@3", "0@4", "0@5", "pad", "pad"]


def test_the_timeline_marks_each_annotation_at_its_step(annotated):
    trace = annotated
    fig = plot_timeline(trace, steps=(0, 12))
    marks = [c.get_offsets()[:, 1].tolist() for c in fig.axes[0].collections]
    want = [
        [a.step for a in trace.annotations if a.kind == kind and a.step < 12]
        for kind in ("admit", "fork", "finish", "my_event")
    ]
    assert marks == want and marks[0] == [0, 2]


def test_plot_all_has_every_picture_in_one_colouring(annotated):
    seen = []
    fig = plot_all(annotated, step=3, progress=lambda done, total: seen.append((done, total)))
    assert sum(len(ax.images) for ax in fig.get_axes()) == 4  # cells, mask, timeline, runs
    assert len(fig.get_axes()) == 11  # + 5 metrics axes, the runs' lines and colour bar
    data = fig.numbakv
    assert list(data) == ["cells", "mask", "timeline", "metrics", "locality"]
    assert data["cells"]["owners"] is data["timeline"]["owners"]
    step = annotated.step(annotated.step_frames[3])
    np.testing.assert_array_equal(data["mask"]["pixels"].attended.sum(), step.mask(0).sum())
    n_steps = annotated.n_steps
    assert seen[-1] == (n_steps, n_steps) and all(total == n_steps for _, total in seen)


@pytest.mark.parametrize("every_verb", [False, True])
def test_owner_totals_are_the_cell_steps_each_group_holds(every_verb):
    cache = CellCache(small_config(max_seqs=70, capacity=60, initial_cells=4))
    recorder = Recorder(cache, every_verb=every_verb)
    rng = np.random.default_rng(3)
    for request, op in enumerate(rng.integers(0, 60, 150).tolist()):
        before = set(cache.live_seqs)
        churn(cache, [op])
        for seq in set(cache.live_seqs) - before:  # ids come back for other requests
            recorder.annotate("admit", request=request % 12, seqs=[seq])
    trace = recorder.trace()
    timeline = trace.timeline()
    for by in ("request", "seq"):
        owners = owners_of(trace, by)
        expect = np.zeros(len(owners.labels), dtype=np.int64)
        for k, frame in enumerate(trace.step_frames):
            alone = timeline[k][timeline[k] >= 0]
            np.add.at(expect, owners.seq_groups[frame, alone], 1)
        np.testing.assert_array_equal(owners.totals, expect)
        ranked = sorted(np.flatnonzero(expect).tolist(), key=lambda g: (-expect[g], g))
        assert list(owners.shown) == ranked[: len(PALETTE)]


def test_what_colours_stand_for_is_said_truly(annotated):
    plain = CellCache(small_config(max_seqs=20, capacity=64, initial_cells=64, max_width=64))
    recorder = Recorder(plain)
    seqs = [plain.seq_new() for _ in range(12)]
    step_with(plain, seqs)
    asked = owners_of(recorder.trace(), "request")  # no bindings: every owner a sequence
    assert asked.title == "12 sequences; the 9 largest shown" and asked.noun == "sequences"
    owners = owners_of(annotated)
    requests, seqs = owners.counts
    assert requests == 2 and seqs > 0  # churn's sequences were never bound
    assert owners.noun == "owners" and owners.title.startswith("by request")


def test_bindings_of_ids_past_max_seqs_bind_nothing():
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    seq = cache.seq_new()
    recorder.annotate("admit", request=0, seq=99)
    recorder.annotate("admit", request=1, seqs=[2**40, seq])
    step_with(cache, [seq, seq])
    trace = recorder.trace()
    np.testing.assert_array_equal(trace.seq_bindings(), [[0, seq, 1]])
    labels = plot_all(trace).numbakv["cells"]["owners"].labels
    assert [label for label in labels if label.startswith("request")] == ["request 1"]


def test_a_trace_without_steps_says_so():
    trace = Recorder(CellCache(small_config())).trace()
    for draw in (plot_cells, plot_timeline, plot_metrics, plot_locality, plot_all):
        with pytest.raises(ValueError, match="the trace records no step, so there is nothing"):
            draw(trace)


def test_read_len_closing_the_grid_is_drawn_on_its_last_line():
    cache = CellCache(small_config(capacity=16, initial_cells=16, max_width=16))
    recorder = Recorder(cache)
    step_with(cache, [cache.seq_new()] * 16)  # read_len 16 = rows: the grid's end
    fig = plot_cells(recorder.trace(), columns=4)
    [bar] = [line for line in fig.axes[0].get_lines() if line.get_color() == "#D00000"]
    np.testing.assert_array_equal(bar.get_xdata(), [3.5, 3.5])
    np.testing.assert_array_equal(bar.get_ydata(), [2.5, 3.5])


def test_annotations_after_the_last_step_are_drawn_and_counted(annotated):
    cache = CellCache(small_config())
    recorder = Recorder(cache)
    seq = cache.seq_new()
    step_with(cache, [seq])
    recorder.annotate("finish", request=0, seq=seq)  # after the last step: step 1 of 1
    trace = recorder.trace()
    fig = plot_metrics(trace)
    assert fig.numbakv["counts"] == {"finish": 1}
    assert fig.axes[0].get_xlim()[1] > 1  # the axis reaches what followed the last step
    timeline = plot_timeline(trace)
    assert timeline.axes[0].collections[0].get_offsets()[:, 1].tolist() == [0.5]
    zoomed = plot_metrics(annotated, steps=(0, 2))
    ticks = [t.get_text() for t in zoomed.axes[3].get_yticklabels()]
    assert ticks[:2] == ["admit (1 of 2)", "fork (1)"]


def test_ranges_no_sequence_holds_alone_are_drawn():
    empty = CellCache(small_config())
    fig = plot_cells(empty.snapshot())
    assert (fig.numbakv["pixels"].label == FREE).all()
    cache = CellCache(small_config(capacity=16, initial_cells=16, max_width=16))
    recorder = Recorder(cache)
    a = cache.seq_new()
    step_with(cache, [a] * 4)
    cache.seq_clone(a)  # cells 0-3 shared, 4-15 free
    step_with(cache, [cache.seq_new()])
    trace = recorder.trace()
    shared = plot_cells(trace, -1, cells=(0, 4)).numbakv["pixels"]
    np.testing.assert_array_equal(shared.label[0], [SHARED] * 4)
    free = plot_cells(trace, -1, cells=(6, 16)).numbakv["pixels"]
    assert (free.label == FREE).all() and (free.occupied == 0).all()
    only_shared = owner_pixels(trace, owners_of(trace), (0, 4), (1, 2), 2, 1)
    np.testing.assert_array_equal(only_shared.label, [[SHARED, SHARED]])
