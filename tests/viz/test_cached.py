"""Cells only the prefix cache holds are drawn "cached": a sequence the annotations hand
to the prefix cache (an `insert` with held=True) is a holder until an annotation binds
its id to a request again, a cell every owner of which is a holder is CACHED, and a cell
a running request shares with holders keeps the request's colour; the pixels stay the
cell-steps binned (summed over all columns at once or a range of them at a time), and the
event strip counts the prefix cache's events."""

import numpy as np
import pytest
from matplotlib.colors import to_rgb

from numbakv import Recorder
from numbakv.core.snapshot import FREE, SHARED
from numbakv.reference import CellCache
from numbakv.viz import owner_pixels, owners_of, plot_cells, plot_metrics, plot_timeline
from numbakv.viz import pixels as viz_pixels
from numbakv.viz.holders import CACHED, cell_changes, holder_table, table_codes
from numbakv.viz.owners import CACHED_COLOUR, MIXED
from numbakv.viz.panels import GREYS, KIND_COLOURS
from numbakv.viz.pixels import edges

from helpers import churn, small_config, step_with


@pytest.fixture(scope="module")
def prefix():
    """A prefix cache's life by hand, one step per stage (steps 0 … 8), with the cells each
    stage is about: request 0's prompt shared, its session held, a hit on it, request 1
    preempted and resumed from its own holder, evictions, and a holder's id reused."""
    cache = CellCache(small_config(max_seqs=8, capacity=64, initial_cells=64, max_width=8))
    recorder = Recorder(cache)
    note = recorder.annotate
    a = cache.seq_new()
    note("admit", request=0, seqs=[a])
    step_with(cache, [a] * 5)  # step 0: a's prompt
    note("insert", request=0, seq=a, tokens=5, held=False)  # shared: still request 0's
    b = cache.seq_new()
    note("admit", request=1, seqs=[b])
    step_with(cache, [a, b, b])  # step 1
    note("insert", request=0, seq=a, tokens=6, held=True)  # a ends: the prefix cache's
    note("finish", request=0, sample=0, seq=a, reason="length")
    step_with(cache, [b])  # step 2: a's cells cached
    c = cache.seq_clone(a, upto=5)
    note("hit", request=2, seq=c, tokens=5)
    note("admit", request=2, seqs=[c])
    step_with(cache, [c, b])  # step 3: a's first 5 cells shared with running c
    note("insert", request=1, seq=b, tokens=4, held=True)
    note("preempt", request=1, seqs=[b])
    step_with(cache, [c])  # step 4: b held (a preempt binds nothing back)
    d = cache.seq_clone(b, upto=3)
    note("hit", request=1, seq=d, tokens=3)
    note("resume", request=1, seqs=[d])
    cache.rewind(a, 5)
    note("evict", cells=1, cached_cells=1)
    step_with(cache, [d, c])  # step 5
    note("insert", request=2, seq=c, tokens=7, held=True)
    note("finish", request=2, sample=0, seq=c, reason="stop")
    step_with(cache, [d])  # step 6: a's first 5 cells held by holders a and c only
    cache.seq_rm(a)
    cache.seq_rm(c)
    note("evict", cells=7, cached_cells=1)
    e = cache.seq_new()
    assert e == a  # the holder's id comes back for request 3
    note("admit", request=3, seqs=[e])
    step_with(cache, [e, e, e, d])  # step 7
    note("finish", request=1, sample=0, seq=d, reason="length")
    step_with(cache, [e])  # step 8
    return recorder.trace(), {"a": a, "b": b, "c": c, "d": d, "e": e}


def labels_at(trace, owners, step: int) -> np.ndarray:
    """[n_cells] int64: each cell's pixel label at recorded step `step`, one cell a pixel."""
    n_cells = int(trace.arrays["read_len"].max())
    return owner_pixels(trace, owners, (0, n_cells), (step, step + 1), 1, 1).label[0]


def cells_of(trace, step: int, owners: set[int]) -> np.ndarray:
    """The cells whose owners are exactly `owners` at recorded step `step`."""
    snap = trace.snapshot(trace.step_frames[step])
    return np.array([c for c in range(snap.read_len) if set(snap.owners_of(c)) == owners])


def test_a_holders_cells_are_cached_after_the_held_insert_and_not_before(prefix):
    trace, s = prefix
    owners = owners_of(trace)
    group = {label: g for g, label in enumerate(owners.labels)}
    holders = holder_table(trace)
    frames = trace.step_frames
    assert not holders[frames[:2], s["a"]].any()  # the insert held=False: a stays running
    assert holders[frames[2:7], s["a"]].all()
    only_a = cells_of(trace, 1, {s["a"]})
    assert len(only_a) == 6
    for step in (0, 1):
        assert (labels_at(trace, owners, step)[only_a[: 5 + step]] == group["request 0"]).all()
    assert (labels_at(trace, owners, 2)[only_a] == CACHED).all()
    b_alone = cells_of(trace, 3, {s["b"]})
    assert (labels_at(trace, owners, 3)[b_alone] == group["request 1"]).all()
    assert (labels_at(trace, owners, 4)[b_alone] == CACHED).all()  # preempted: held


def test_a_cell_a_running_request_shares_with_a_holder_keeps_its_colour(prefix):
    trace, s = prefix
    owners = owners_of(trace)
    group = {label: g for g, label in enumerate(owners.labels)}
    shared = cells_of(trace, 3, {s["a"], s["c"]})
    assert len(shared) == 5
    at3 = labels_at(trace, owners, 3)
    assert (at3[shared] == group["request 2"]).all()
    assert (at3[cells_of(trace, 3, {s["a"]})] == CACHED).all()  # the tail only a holds
    resumed = cells_of(trace, 5, {s["b"], s["d"]})
    assert len(resumed) == 3 and (labels_at(trace, owners, 5)[resumed] == group["request 1"]).all()
    both_held = cells_of(trace, 6, {s["a"], s["c"]})
    assert len(both_held) == 5 and (labels_at(trace, owners, 6)[both_held] == CACHED).all()
    fig = plot_cells(trace, 3, bin=1)  # the table's picture agrees with the timeline's
    drawn = fig.numbakv["pixels"].label[0]
    np.testing.assert_array_equal(drawn[: len(at3)], at3)
    assert (drawn[len(at3) :] == FREE).all()
    assert "cached (prefix cache)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    rgb = owners.rgb(np.array([CACHED]))[0]
    np.testing.assert_allclose(rgb, to_rgb(CACHED_COLOUR))
    assert tuple(rgb) not in {tuple(c) for c in owners.rgb(np.array([*owners.shown, MIXED]))}


def test_a_reused_holder_id_is_a_requests_again(prefix):
    trace, s = prefix
    owners = owners_of(trace)
    group = {label: g for g, label in enumerate(owners.labels)}
    assert not holder_table(trace)[trace.step_frames[7:], s["e"]].any()
    e_cells = cells_of(trace, 7, {s["e"]})
    assert len(e_cells) == 3
    assert (labels_at(trace, owners, 7)[e_cells] == group["request 3"]).all()
    assert (labels_at(trace, owners, 8)[cells_of(trace, 8, {s["e"]})] == group["request 3"]).all()
    assert not (labels_at(trace, owners, 7) == SHARED).any()


@pytest.mark.parametrize(
    ("kind", "data", "rebinds"),
    [
        ("admit", {"seqs": [0]}, True),
        ("fork", {"seqs": [0], "source": 1}, True),
        ("hit", {"seq": 0, "tokens": 2}, True),
        ("resume", {"seqs": [0]}, True),
        ("insert", {"seq": 0, "tokens": 4, "held": False}, True),
        ("finish", {"seq": 0, "sample": 0, "reason": "stop"}, False),
        ("preempt", {"seqs": [0]}, False),
        ("insert", {"seq": 0, "tokens": 4, "held": True}, False),
        ("admit", {"seqs": [0, 99]}, True),  # an id past max_seqs is ignored
    ],
)
def test_only_a_binding_annotation_ends_a_holder(kind, data, rebinds):
    cache = CellCache(small_config(max_seqs=4, capacity=16, initial_cells=16))
    recorder = Recorder(cache)
    seq, other = cache.seq_new(), cache.seq_new()
    assert seq == 0
    recorder.annotate("admit", request=0, seqs=[seq])
    step_with(cache, [seq] * 4)
    recorder.annotate("insert", request=0, seq=seq, tokens=4, held=True)
    step_with(cache, [other])
    recorder.annotate(kind, request=5, **data)
    step_with(cache, [other])
    trace = recorder.trace()
    owners = owners_of(trace)
    cells = cells_of(trace, 2, {seq})
    assert len(cells) == 4 and (labels_at(trace, owners, 1)[cells] == CACHED).all()
    want = owners.labels.index("request 5") if rebinds else CACHED
    assert (labels_at(trace, owners, 2)[cells] == want).all()


def visible_oracle(trace, frame: int, holders: np.ndarray) -> np.ndarray:
    """[read_len] codes of `frame`'s table cell by cell: the running owner, SHARED for
    several, CACHED when only holders own it, FREE for none."""
    snap = trace.snapshot(frame)
    codes = np.full(snap.read_len, FREE, dtype=np.int64)
    for cell in range(snap.read_len):
        owners = snap.owners_of(cell)
        running = [s for s in owners if not holders[frame, s]]
        if len(running) == 1:
            codes[cell] = running[0]
        elif running:
            codes[cell] = SHARED
        elif owners:
            codes[cell] = CACHED
    return codes


@pytest.fixture(scope="module")
def churned():
    """A churned workload whose annotations hold and rebind ids at random, every verb a frame."""
    cache = CellCache(small_config(max_seqs=9, capacity=48, initial_cells=3))
    recorder = Recorder(cache, every_verb=True)
    rng = np.random.default_rng(7)
    ops = list(range(3, 900, 7))
    for first in range(0, len(ops), 6):
        churn(cache, ops[first : first + 6])
        for seq in cache.live_seqs:
            if rng.random() < 0.3:
                held = bool(rng.random() < 0.6)
                recorder.annotate("insert", request=int(rng.integers(4)), seq=seq, held=held)
    return recorder.trace()


def test_the_visible_changes_replay_every_frames_table(churned):
    trace = churned
    holders = holder_table(trace)
    assert holders.any() and (holders[1:] != holders[:-1]).any(axis=1).sum() > 10
    changes = cell_changes(trace, holders)
    n_cells = int(trace.arrays["read_len"].max())
    codes = np.full(n_cells, FREE, dtype=np.int64)
    offsets = changes["delta_offsets"]
    seen_cached = False
    for f in range(trace.n_frames):
        cells = changes["delta_cells"][offsets[f] : offsets[f + 1]]
        assert (np.diff(cells) > 0).all()  # ascending, once a frame
        codes[cells] = changes["codes"][offsets[f] : offsets[f + 1]]
        expect = visible_oracle(trace, f, holders)
        np.testing.assert_array_equal(codes[: len(expect)], expect)
        assert (codes[len(expect) :] == FREE).all()
        snap = trace.snapshot(f)
        np.testing.assert_array_equal(table_codes(snap, holders[f]), expect)
        seen_cached |= bool((expect == CACHED).any())
    assert seen_cached


@pytest.mark.parametrize("by", ["request", "seq"])
@pytest.mark.parametrize(("cell_bin", "step_bin"), [(1, 1), (3, 4), (7, 2)])
@pytest.mark.parametrize("at_once", [viz_pixels.STRETCHES_AT_ONCE, 1, 40])  # columns summed ...
def test_cached_pixels_are_the_cell_steps_binned(churned, by, cell_bin, step_bin, at_once,
                                                 monkeypatch):  # fmt: skip
    monkeypatch.setattr(viz_pixels, "STRETCHES_AT_ONCE", at_once)  # ... all at once, or in ranges
    trace = churned
    owners = owners_of(trace, by)
    holders = owners.holders
    n_cells, n_steps = int(trace.arrays["read_len"].max()), trace.n_steps
    pixels = owner_pixels(trace, owners, (0, n_cells), (0, n_steps), cell_bin, step_bin)
    keyed = np.full((n_steps, n_cells), FREE, dtype=np.int64)
    for k, frame in enumerate(trace.step_frames.tolist()):
        codes = visible_oracle(trace, frame, holders)
        keyed[k, : len(codes)] = np.where(codes >= 0, owners.seq_groups[frame][codes], codes)
    cols, rows = edges(0, n_cells, cell_bin), edges(0, n_steps, step_bin)
    totals = np.zeros(len(owners.labels), dtype=np.int64)
    np.add.at(totals, keyed[keyed >= 0], 1)
    np.testing.assert_array_equal(owners.totals, totals)  # cached cells count for no one
    for i in range(len(rows) - 1):
        for j in range(len(cols) - 1):
            block = keyed[rows[i] : rows[i + 1], cols[j] : cols[j + 1]].ravel()
            held = block[block != FREE]
            assert pixels.occupied[i, j] == pytest.approx(len(held) / block.size)
            assert pixels.shared[i, j] == pytest.approx(np.mean(block == SHARED))
            values, counts = np.unique(held, return_counts=True)
            if not len(held):
                want = FREE
            elif 2 * counts.max() > len(held):
                want = values[counts.argmax()]
            else:
                want = MIXED
            assert pixels.label[i, j] == want, (i, j)
    assert (pixels.label == CACHED).any()
    legend = plot_timeline(trace, by=by).axes[0].get_legend()
    assert "cached (prefix cache)" in [t.get_text() for t in legend.get_texts()]


def test_a_trace_without_holders_draws_no_cached_cell():
    cache = CellCache(small_config(max_seqs=6, capacity=32, initial_cells=4))
    recorder = Recorder(cache)
    churn(cache, list(range(3, 300, 11)))
    trace = recorder.trace()
    owners = owners_of(trace)
    assert not owners.holders.any()
    changes = cell_changes(trace, owners.holders)
    np.testing.assert_array_equal(changes["delta_cells"], trace.arrays["delta_cells"])
    pixels = plot_timeline(trace).numbakv["pixels"]
    assert not (pixels.label == CACHED).any()
    texts = [t.get_text() for t in plot_cells(trace).axes[0].get_legend().get_texts()]
    assert "cached (prefix cache)" not in texts


def test_the_event_strip_counts_the_prefix_caches_events(prefix):
    trace, _ = prefix
    fig = plot_metrics(trace)
    counts = fig.numbakv["counts"]
    expect = {"hit": 2, "insert": 4, "evict": 2, "preempt": 1, "resume": 1}
    assert {kind: counts[kind] for kind in expect} == expect
    assert counts == trace.annotation_counts()
    events_ax = fig.axes[3]
    ticks = [t.get_text() for t in events_ax.get_yticklabels()]
    assert ticks == [f"{kind} ({n})" for kind, n in trace.annotation_counts().items()]
    for kind, dots in zip(trace.annotation_counts(), events_ax.collections, strict=True):
        steps = [a.step for a in trace.annotations if a.kind == kind]
        assert dots.get_offsets()[:, 0].tolist() == steps
        assert to_rgb(dots.get_facecolor()[0]) == to_rgb(KIND_COLOURS[kind])
    assert not {to_rgb(KIND_COLOURS[k]) for k in expect} & {to_rgb(g) for g in GREYS}
    zoomed = plot_metrics(trace, steps=(3, 6)).numbakv["counts"]
    inside = [a.kind for a in trace.annotations if 3 <= a.step < 6]
    assert zoomed == {kind: inside.count(kind) for kind in trace.annotation_counts()}
    assert all(zoomed[kind] for kind in ("hit", "insert", "evict", "preempt", "resume"))


@pytest.mark.parametrize("at_once", [1, 7, 60])
def test_pixels_summed_in_column_ranges_are_those_summed_at_once(churned, at_once, monkeypatch):
    trace, owners = churned, owners_of(churned)
    n_cells, n_steps = int(trace.arrays["read_len"].max()), trace.n_steps
    args = (trace, owners, (3, n_cells - 2), (1, n_steps), 2, 3)
    whole = owner_pixels(*args)
    monkeypatch.setattr(viz_pixels, "STRETCHES_AT_ONCE", at_once)
    assert len(viz_pixels._Held(trace, owners, args[2], args[3], 2).ranges) > 1
    ranged = owner_pixels(*args)
    for name in ("cell_edges", "step_edges", "occupied", "shared", "label"):
        np.testing.assert_array_equal(getattr(ranged, name), getattr(whole, name))
