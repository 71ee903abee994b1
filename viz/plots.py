"""Matplotlib pictures of the pool. No pyplot: every function builds a `Figure` (or draws
into one passed in, e.g. a subfigure) and returns it; save with `fig.savefig(path)`.
"""

import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from numbakv.snapshot import FREE, SHARED, Snapshot
from numbakv.trace import Trace

# Okabe & Ito's colour-blind-safe palette, without its black (black marks shared cells)
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")
FREE_COLOUR, SHARED_COLOUR, MARK_COLOUR = "#FFFFFF", "#000000", "#D00000"
UNALLOCATED_COLOUR = "#DDDDDD"


def seq_colour(seq: int) -> str:
    """The colour of sequence id `seq`: stable for an id, cycling through PALETTE."""
    return PALETTE[seq % len(PALETTE)]


def owner_colours(max_seqs: int) -> tuple[ListedColormap, BoundaryNorm]:
    """A colormap and norm taking owner codes (SHARED, FREE, 0 … max_seqs-1) to colours."""
    colours = [SHARED_COLOUR, FREE_COLOUR] + [seq_colour(s) for s in range(max_seqs)]
    bounds = np.arange(SHARED, max_seqs + 1) - 0.5
    return ListedColormap(colours), BoundaryNorm(bounds, len(colours))


def _legend(ax, seq_ids, n_shown: int = 8) -> None:
    handles = [Patch(facecolor=FREE_COLOUR, edgecolor="grey", label="free")]
    handles.append(Patch(facecolor=SHARED_COLOUR, label="shared"))
    handles += [Patch(facecolor=seq_colour(s), label=f"seq {s}") for s in seq_ids[:n_shown]]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def cell_grid(snapshot: Snapshot, columns: int) -> np.ma.MaskedArray:
    """[ceil(n / columns), columns] owner codes of cells [0, n), n = max(rows, read_len);
    grid places past n are masked. Cells past read_len are FREE."""
    n = max(snapshot.rows, snapshot.read_len, 1)
    codes = np.full(-(-n // columns) * columns, FREE, dtype=np.int32)
    codes[: snapshot.read_len] = snapshot.codes
    mask = np.arange(len(codes)) >= n
    return np.ma.masked_array(codes, mask).reshape(-1, columns)


def plot_cells(snapshot: Snapshot, columns: int | None = None, fig: Figure | None = None) -> Figure:
    """The pool as a grid of cells (row-major, `columns` per line), colour = owner.

    Free cells are white, shared cells black, each sequence id has its own colour; a red
    bar stands before cell `read_len`; the grid ends at the pool's allocated rows.
    Default columns: the power of two nearest sqrt(2 n), for a grid about twice as wide
    as tall.
    """
    fig = fig or Figure(figsize=(10, 6), layout="constrained")
    ax = fig.subplots()
    n = max(snapshot.rows, snapshot.read_len, 1)
    if columns is None:
        columns = 2 ** round(np.log2(np.sqrt(2 * n)))
    columns = max(1, min(columns, n))
    cmap, norm = owner_colours(len(snapshot.live))
    ax.set_facecolor(UNALLOCATED_COLOUR)  # grid places past the pool's rows are masked
    ax.imshow(cell_grid(snapshot, columns), cmap=cmap, norm=norm, interpolation="nearest")
    row, col = divmod(snapshot.read_len, columns)
    ax.plot([col - 0.5, col - 0.5], [row - 0.5, row + 0.5], color=MARK_COLOUR, linewidth=3)
    ax.set_title(
        f"{snapshot.read_len} read_len, {int(np.count_nonzero(snapshot.codes != FREE))} used, "
        f"{snapshot.rows} rows allocated of {snapshot.capacity} capacity",
        fontsize="medium",
    )
    ax.set_xlabel(f"cell mod {columns}")
    ax.set_ylabel(f"cell // {columns}")
    _legend(ax, snapshot.live_ids.tolist())
    return fig


def plot_timeline(
    trace: Trace, max_frames: int = 1000, mark_step: int | None = None, fig: Figure | None = None
) -> Figure:
    """Steps down, cells across, colour = owner: holes opening and refilling over time.

    Shows at most `max_frames` steps, evenly picked; `mark_step` draws a red line there.
    """
    fig = fig or Figure(figsize=(10, 6), layout="constrained")
    ax = fig.subplots()
    steps = timeline_steps(trace, max_frames)
    data = trace.timeline(trace.step_frames[steps])
    cmap, norm = owner_colours(trace.config.max_seqs)
    extent = (-0.5, data.shape[1] - 0.5, steps[-1] + 0.5 if len(steps) else 0.5, -0.5)
    ax.imshow(data, cmap=cmap, norm=norm, interpolation="nearest", aspect="auto", extent=extent)
    read_len = trace.arrays["read_len"][trace.step_frames[steps]]
    ax.plot(read_len - 0.5, steps, color=MARK_COLOUR, linewidth=1)
    if mark_step is not None:
        ax.axhline(mark_step, color=MARK_COLOUR, linestyle="--")
    ax.set_xlabel("cell")
    ax.set_ylabel("step")
    ax.set_title("cell owners over time (red: read_len)", fontsize="medium")
    _legend(ax, np.flatnonzero(trace.arrays["live"].any(axis=0)).tolist())
    return fig


def timeline_steps(trace: Trace, max_frames: int) -> np.ndarray:
    """The step numbers `plot_timeline` shows: all, or `max_frames` evenly picked."""
    n_steps = len(trace.step_frames)
    if n_steps <= max_frames:
        return np.arange(n_steps)
    return np.unique(np.linspace(0, n_steps - 1, max_frames).round().astype(np.int64))


def plot_metrics(trace: Trace, mark_step: int | None = None, fig: Figure | None = None) -> Figure:
    """Per frame: used cells, read_len, rows and cells saved by sharing; fragmentation
    (1 - used / read_len); step width. Dotted lines mark the pool's growths."""
    fig = fig or Figure(figsize=(10, 6), layout="constrained")
    cells_ax, frag_ax, width_ax = fig.subplots(3, 1, sharex=True, height_ratios=(3, 1, 1))
    m = trace.metrics()
    frames = np.arange(trace.n_frames)
    for name in ("used", "read_len", "rows", "saved"):
        cells_ax.plot(frames, m[name], label=name, drawstyle="steps-post")
    cells_ax.set_ylabel("cells")
    cells_ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    frag_ax.plot(frames, m["fragmentation"], label="fragmentation", drawstyle="steps-post")
    frag_ax.set_ylabel("1 - used/read_len")
    frag_ax.set_ylim(-0.02, 1.02)
    width_ax.plot(frames, m["width"], label="width", drawstyle="steps-post")
    width_ax.set_ylabel("step width")
    width_ax.set_xlabel("frame (0 = start, then one per recorded step or verb)")
    for ax in (cells_ax, frag_ax, width_ax):
        for frame in np.flatnonzero(m["growth"]):
            ax.axvline(frame, color="grey", linestyle=":", linewidth=1)
        if mark_step is not None:
            ax.axvline(trace.step_frames[mark_step], color=MARK_COLOUR, linestyle="--")
    return fig


def plot_mask(step, window: int, fig: Figure | None = None) -> Figure:
    """Tokens x cells: which cell each token of `step` attends under `window` (black = 1).

    `step` is a live `Step` or a recorded `TraceStep`.
    """
    fig = fig or Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    mask = step.mask(window)
    ax.imshow(
        mask,
        cmap=ListedColormap(["#FFFFFF", "#000000"]),
        vmin=0,
        vmax=1,
        interpolation="nearest",
        aspect="auto",
    )
    if step.width <= 64:
        labels = [
            f"{s}@{p}" if s >= 0 else "pad"
            for s, p in zip(step.seq_ids.tolist(), step.positions.tolist(), strict=True)
        ]
        ax.set_yticks(range(step.width), labels, fontsize="x-small")
    ax.set_xlabel("cell")
    ax.set_ylabel("token (seq@position)")
    ax.set_title(
        f"mask, window {window} ({'global' if window == 0 else 'sliding'})", fontsize="medium"
    )
    return fig


def plot_all(trace: Trace, step: int = -1, window: int | None = None) -> Figure:
    """The four pictures of a trace in one figure, for recorded step number `step`."""
    fig = Figure(figsize=(20, 11), layout="constrained")
    top, bottom = fig.subfigures(2, 1)
    (cells, mask), (timeline, metrics) = top.subfigures(1, 2), bottom.subfigures(1, 2)
    step = range(len(trace.step_frames))[step]
    frame = trace.step_frames[step]
    plot_cells(trace.snapshot(frame), fig=cells)
    window = trace.config.distinct_windows[0] if window is None else window
    plot_mask(trace.step(frame), window, fig=mask)
    plot_timeline(trace, mark_step=step, fig=timeline)
    plot_metrics(trace, mark_step=step, fig=metrics)
    return fig
