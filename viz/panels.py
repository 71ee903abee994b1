"""Pictures of figures over time, on one clock (recorded steps; what happens between two
steps is drawn at the step it leads into): the metrics with the trace's annotations, and
each sequence's locality."""

import numpy as np
from matplotlib.figure import Figure

from numbakv.trace.frames import Trace
from numbakv.trace.scan import sequence_runs

from .layout import axes_pixels, bin_size, need_steps, new_figure, span
from .owners import MARK_COLOUR, READ_LEN_COLOUR

# colours of the Engine's annotation kinds; a user's own kinds take GREYS in turn
KIND_COLOURS = {
    "admit": "#009E73",
    "fork": "#332288",
    "finish": "#0072B2",
    "preempt": "#D55E00",
    "resume": "#999933",
    "cancel": "#CC79A7",
    "error": "#000000",
    "hit": "#E69F00",
    "insert": "#56B4E9",
    "evict": "#882255",
    "growth": "#7F7F7F",
}
GREYS = ("#555555", "#999999", "#BBBBBB")


def kind_colour(kind: str, kinds: list[str]) -> str:
    if kind in KIND_COLOURS:
        return KIND_COLOURS[kind]
    own = [k for k in kinds if k not in KIND_COLOURS]
    return GREYS[own.index(kind) % len(GREYS)]


def annotation_steps(trace: Trace) -> dict[str, np.ndarray]:
    """{kind: [n] int64 the step of each of its annotations}, kinds in order of appearance."""
    steps: dict[str, list[int]] = {}
    for a in trace.annotations:
        steps.setdefault(a.kind, []).append(a.step)
    return {kind: np.array(s, dtype=np.int64) for kind, s in steps.items()}


def shown_steps(at: np.ndarray, steps: tuple[int, int], n_steps: int) -> np.ndarray:
    """The steps of `at` a picture of `steps` shows: those inside, and when it reaches the
    trace's end, those after the last step (step n_steps: what followed it)."""
    last = steps[1] if steps[1] == n_steps else steps[1] - 1
    return at[(at >= steps[0]) & (at <= last)]


def annotation_marks(ax, trace: Trace, steps: tuple[int, int], x: float) -> None:
    """A tick per annotation at the right edge `x` of a timeline, at its step (those after
    the last step at the picture's lower edge)."""
    kinds = annotation_steps(trace)
    for kind, at in kinds.items():
        at = shown_steps(at, steps, trace.n_steps)
        ax.scatter(
            np.full(len(at), x),
            np.minimum(at, steps[1] - 0.5),
            marker="<",
            s=12,
            color=kind_colour(kind, list(kinds)),
            clip_on=False,
            zorder=3,
        )


def plot_metrics(
    trace: Trace,
    *,
    steps=None,
    mark_step: int | None = None,
    dpi: float = 100,
    fig: Figure | None = None,
) -> Figure:
    """Per frame, at its step: used cells, read_len, rows and cells saved by sharing;
    fragmentation (1 - used / read_len) beside the largest free run; the step width; and
    a strip of the annotations, each kind with how many it shows (of how many, when
    zoomed). Dotted lines mark growths. What follows the last step is drawn at n_steps."""
    fig = new_figure(fig, (10, 6), dpi)
    n_steps = need_steps(trace)
    s0, s1 = span(steps, n_steps, "steps")
    axes = fig.subplots(4, 1, sharex=True, height_ratios=(3, 1.2, 1, 1))
    cells_ax, frag_ax, width_ax, events_ax = axes
    m, x = trace.metrics(), trace.frame_steps
    shown = np.flatnonzero((x >= s0) & (x <= (s1 if s1 == n_steps else s1 - 1)))
    m, x = {name: values[shown] for name, values in m.items()}, x[shown]  # the zoom's frames
    colours = {"read_len": READ_LEN_COLOUR}
    for name in ("used", "read_len", "rows", "saved"):
        cells_ax.plot(x, m[name], label=name, drawstyle="steps-post", color=colours.get(name))
    cells_ax.set_ylabel("cells")
    cells_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    frag_ax.plot(x, m["fragmentation"], drawstyle="steps-post", label="fragmentation")
    frag_ax.set_ylabel("1 - used/read_len")
    frag_ax.set_ylim(-0.02, 1.02)
    free_ax = frag_ax.twinx()
    free_ax.plot(
        x, m["largest_free"], drawstyle="steps-post", color="#009E73", label="largest free run"
    )
    free_ax.set_ylabel("largest free run", color="#009E73", fontsize="small")
    width_ax.plot(x, m["width"], drawstyle="steps-post")
    width_ax.set_ylabel("step width")
    counts = _event_strip(events_ax, trace, (s0, s1))
    events_ax.set_xlabel("step (verbs between steps: at the step they lead into)")
    for ax in axes:
        for step in x[np.flatnonzero(m["growth"])]:
            ax.axvline(step, color="grey", linestyle=":", linewidth=1)
        if mark_step is not None:
            ax.axvline(mark_step, color=MARK_COLOUR, linestyle="--", linewidth=1)
    cells_ax.set_xlim(s0 - 0.5, s1 + (0.5 if s1 == n_steps else -0.5))
    fig.numbakv = {"metrics": m, "steps": x, "counts": counts}
    return fig


def _event_strip(ax, trace: Trace, steps: tuple[int, int]) -> dict[str, int]:
    """One row per annotation kind, a tick at each annotation's step; y labels count them."""
    kinds = annotation_steps(trace)
    counts = {}
    for row, (kind, every) in enumerate(kinds.items()):
        at = shown_steps(every, steps, trace.n_steps)
        ax.scatter(
            at, np.full(len(at), row), marker="|", s=40, color=kind_colour(kind, list(kinds))
        )
        counts[kind] = len(at)
    labels = [
        f"{k} ({counts[k]}{'' if counts[k] == len(a) else f' of {len(a)}'})"
        for k, a in kinds.items()
    ]
    ax.set_yticks(range(len(kinds)), labels, fontsize="x-small")
    ax.set_ylim(-0.7, max(len(kinds), 1) - 0.3)
    if not kinds:
        ax.text(
            0.5,
            0.5,
            "no annotations (Recorder.annotate, Engine(annotate=recorder.annotate))",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize="small",
        )
        ax.set_yticks([])
    return counts


def locality(trace: Trace) -> np.ndarray:
    """[n_steps, max_seqs] int32: at each recorded step, how many separate runs of
    consecutive cells each sequence owns (0: none) — 1 is a contiguous sequence."""
    runs = sequence_runs(trace.arrays, trace.config.max_seqs, trace.cell_index)
    return runs[trace.step_frames]


def plot_locality(
    trace: Trace,
    *,
    steps=None,
    mark_step: int | None = None,
    dpi: float = 100,
    fig: Figure | None = None,
) -> Figure:
    """How scattered each sequence's cells are over time: runs of consecutive cells per
    sequence (what gathered attention reads as separate stretches). Left: the mean, 90th
    percentile and largest over the sequences holding cells; right: per sequence id, its
    mean runs over each pixel's steps (white: holds no cell)."""
    fig = new_figure(fig, (14, 4), dpi)
    s0, s1 = span(steps, need_steps(trace), "steps")
    runs = locality(trace)[s0:s1]
    line_ax, map_ax = fig.subplots(1, 2, width_ratios=(1, 1.3))
    at = np.arange(s0, s1)
    figures = _held_lines(runs)
    for name, values in figures.items():
        line_ax.plot(at, values, label=name, drawstyle="steps-post")
    line_ax.set_xlabel("step")
    line_ax.set_ylabel("runs per sequence")
    line_ax.legend(fontsize="small")
    if mark_step is not None:
        line_ax.axvline(mark_step, color=MARK_COLOUR, linestyle="--", linewidth=1)
    image = map_ax.imshow(np.zeros((1, 1)), aspect="auto", cmap="viridis")
    bar = fig.colorbar(image, ax=map_ax, label="mean runs")
    map_ax.set_xlabel("step")
    map_ax.set_ylabel("sequence id")
    map_ax.set_title("runs", fontsize="medium")
    map_ax.set_xlim(s0 - 0.5, s1 - 0.5)
    map_ax.set_ylim(runs.shape[1] - 0.5, -0.5)
    width, height = axes_pixels(map_ax)  # with labels and title in place
    width -= 1.5 * bar.ax.get_tightbbox().width  # the colour bar takes its room beside it
    step_bin = bin_size(s1 - s0, width, None, "step bin")
    seq_bin = bin_size(runs.shape[1], height, None, "sequence bin")
    binned = _mean_blocks(runs, step_bin, seq_bin).T  # [sequence pixels, step pixels]
    image.set_data(binned)
    image.set_extent(
        (s0 - 0.5, s0 + binned.shape[1] * step_bin - 0.5, binned.shape[0] * seq_bin - 0.5, -0.5)
    )
    image.set_clim(1, max(np.nanmax(binned, initial=1), 1))  # a sequence holding cells: >= 1 run
    map_ax.set_xlim(s0 - 0.5, s1 - 0.5)
    map_ax.set_ylim(runs.shape[1] - 0.5, -0.5)
    map_ax.set_facecolor("#FFFFFF")
    each = f"{step_bin} steps" + (f" x {seq_bin} sequences" if seq_bin > 1 else "")
    map_ax.set_title(
        f"runs of consecutive cells per sequence (each pixel: {each})", fontsize="medium"
    )
    fig.numbakv = {"runs": runs, "lines": figures, "map": binned}
    return fig


def _held_lines(runs: np.ndarray) -> dict[str, np.ndarray]:
    """{"mean", "p90", "max"}: [steps] float64 each, over the ids holding cells at each step
    of `runs` ([steps, ids] ints, 0: holds none), NaN where none does: numpy's nanmean,
    nanpercentile and nanmax of the runs with 0 as NaN, figure for figure (sums of ints
    are exact), without their [steps, ids] float copies."""
    n = np.count_nonzero(runs, axis=1)
    with np.errstate(invalid="ignore"):
        mean = runs.sum(axis=1, dtype=np.int64) / n
    ordered = np.sort(runs, axis=1)  # the 0s first: the values are the last n of a row
    p90 = _percentile_sorted(ordered, runs.shape[1] - n, n, 90)
    return {"mean": mean, "p90": p90, "max": np.where(n > 0, ordered[:, -1], np.nan)}


def _percentile_sorted(ordered: np.ndarray, first: np.ndarray, n: np.ndarray, q: float):
    """[rows] float64: the q-th percentile of the [rows] `n` values of each row of
    `ordered` from its `first` on (ascending), as numpy's "linear" method finds it; NaN
    for a row of none."""
    virtual = (n - 1) * np.true_divide(q, 100)
    below, top = np.floor(virtual), virtual >= n - 1  # top: numpy takes the last, twice
    rows, last = np.arange(len(ordered)), np.maximum(first + n - 1, 0)
    at = (first + np.where(top, n - 1, below), first + np.where(top, n - 1, below + 1))
    a, b = (ordered[rows, np.clip(i.astype(np.intp), 0, last)].astype(np.float64) for i in at)
    gamma = virtual - np.where(top, -1, below)  # numpy's index -1 for the last
    diff = b - a
    out = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    return np.where(n > 0, out, np.nan)


def _mean_blocks(runs: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """The mean of each `rows` x `cols` block of `runs` ([steps, ids] ints) over its entries
    above 0, NaN where it has none: np.nanmean with 0 as NaN, figure for figure."""
    n, m = runs.shape
    padded = np.zeros((-(-n // rows) * rows, -(-m // cols) * cols), dtype=runs.dtype)
    padded[:n, :m] = runs
    blocks = padded.reshape(len(padded) // rows, rows, -1, cols)
    total = blocks.sum(axis=(1, 3), dtype=np.int64)
    with np.errstate(invalid="ignore"):
        return total / np.count_nonzero(blocks, axis=(1, 3))
