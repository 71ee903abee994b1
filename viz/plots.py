"""Matplotlib pictures of the pool. No pyplot: every function builds a `Figure` (or draws
into one passed in, e.g. a subfigure) and returns it; save with `fig.savefig(path)`.

The pictures share keywords where they apply: `cells=(A, B)` and `steps=(A, B)` zoom
(half-open, recorded step numbers), `bin=N` sets the cells per pixel column, `dpi` the
figure's resolution, `by="request" | "seq"` what colours stand for. Without `bin` a picture fits
its pixels: a pool larger than the picture is drawn in blocks, each pixel aggregating the
cells (and steps) it covers (`numbakv.viz.pixels`). Each figure keeps the data it drew as
`fig.numbakv` (a dict), for tests and for anyone who wants the numbers.
"""

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from numbakv.core.snapshot import FREE, Snapshot
from numbakv.trace.frames import Trace

from .holders import CACHED, table_codes
from .layout import (
    axes_pixels,
    bin_size,
    binned_note,
    block_grid,
    need_steps,
    new_figure,
    owner_legend,
    shade,
    span,
)
from .owners import (
    MARK_COLOUR,
    MIXED,
    READ_LEN_COLOUR,
    UNALLOCATED_COLOUR,
    Owners,
    owners_of,
    snapshot_owners,
)
from .panels import annotation_marks, plot_locality, plot_metrics
from .pixels import mask_pixels, owner_pixels, table_pixels


def plot_cells(
    source: Snapshot | Trace,
    step: int = -1,
    *,
    cells=None,
    bin=None,
    columns=None,
    by=None,
    dpi: float = 100,
    fig: Figure | None = None,
    owners: Owners | None = None,
) -> Figure:
    """The pool at one moment as a grid of blocks (row-major, `columns` blocks per line),
    colour = owner; `source` a Snapshot or a Trace (then recorded step `step`).

    A block is `bin` cells (default: 1 when the grid fits the picture, else the fewest that
    fit); its colour is the majority owner's, as light as the block is empty. Free white,
    shared black, held only by the prefix cache light grey-blue; a red bar stands before
    read_len; grey past the pool's allocated rows.
    """
    fig = new_figure(fig, (10, 6), dpi)
    if isinstance(source, Trace):
        frame = source.step_frames[_step(source, step)]
        snap, owners = source.snapshot(frame), owners or owners_of(source, by)
    else:
        frame, snap, owners = 0, source, owners or snapshot_owners(source)
    groups, codes = owners.seq_groups[frame], table_codes(snap, owners.holders[frame])
    n = max(snap.rows, snap.read_len, 1)
    lo, hi = span(cells, n, "cells")
    ax = fig.subplots()
    width, height = _room(ax, owners)
    cols_max, rows_max = max(int(width // 2), 1), max(int(height // 2), 1)  # >= 2 x 2 px each
    block = bin_size(hi - lo, cols_max * rows_max, bin, "bin")
    pixels = table_pixels(codes, groups, (lo, hi), block)
    n_blocks = len(pixels.label[0])
    columns = grid_columns(n_blocks, cols_max, rows_max) if columns is None else int(columns)
    columns = max(1, min(columns, n_blocks))
    rgb = shade(owners, pixels)
    rgb[:, pixels.cell_edges[:-1] >= snap.rows] = _rgb(UNALLOCATED_COLOUR)  # past the rows
    grid = block_grid(rgb, columns, _rgb(UNALLOCATED_COLOUR))[0]
    grid_rows = len(grid)
    ax.imshow(grid, interpolation="nearest")
    if lo <= snap.read_len <= hi:
        row, col = divmod(int(np.searchsorted(pixels.cell_edges, snap.read_len)), columns)
        if row == grid_rows:  # read_len ends the grid's last line: the bar closes it
            row, col = row - 1, columns
        ax.plot([col - 0.5, col - 0.5], [row - 0.5, row + 0.5], color=READ_LEN_COLOUR, lw=3)
    used = int(np.count_nonzero(codes != FREE))
    ax.set_title(
        f"{snap.read_len} read_len, {used} used, {snap.rows} rows allocated of "
        f"{snap.capacity} capacity{binned_note(block)}",
        fontsize="medium",
    )
    unit = "cell" if block == 1 else f"block of {block} cells"
    ax.set_xlabel(f"{unit} mod {columns}" + (f", from cell {lo}" if lo else ""))
    ax.set_ylabel(f"{unit} // {columns}")
    mixed, cached = bool((pixels.label == MIXED).any()), bool((pixels.label == CACHED).any())
    owner_legend(ax, owners, mixed=mixed, cached=cached)
    fig.numbakv = {"pixels": pixels, "owners": owners, "columns": columns, "snapshot": snap}
    return fig


def grid_columns(n_blocks: int, cols_max: int, rows_max: int) -> int:
    """Blocks per grid line: a power of two near the shape of the room (cols_max x rows_max
    places), so the grid fills it without a line or column past it."""
    ideal = np.sqrt(n_blocks * cols_max / rows_max)
    columns = 2 ** round(np.log2(max(ideal, 1.0)))
    least = -(-n_blocks // rows_max)  # fewer would need more lines than there is room for
    if not least <= columns <= cols_max:
        columns = max(least, min(cols_max, round(ideal)))
    return columns


def _room(ax, owners: Owners) -> tuple[float, float]:
    """The pixels an image in `ax` gets once a one-line title, axis labels and the owners'
    legend are in place: measured with stand-ins, the real ones set after the picture."""
    ax.set_title("read_len", fontsize="medium")
    ax.set_xlabel("cell")
    ax.set_ylabel("cell")
    owner_legend(ax, owners, mixed=True, cached=bool(owners.holders.any()))
    return axes_pixels(ax)


def plot_timeline(
    trace: Trace,
    *,
    cells=None,
    steps=None,
    bin=None,
    step_bin=None,
    mark_step=None,
    by=None,
    dpi: float = 100,
    fig: Figure | None = None,
    owners: Owners | None = None,
    progress=None,
) -> Figure:
    """Steps down, cells across, colour = owner: holes opening and refilling over time.

    Each pixel aggregates `bin` cells by `step_bin` steps (default: what fits the picture);
    the red line is each step's read_len, ticks at the right edge mark the trace's
    annotations (those after the last step at its lower edge), a dashed line `mark_step`.
    `progress(done, total)` hears the steps drawn (`numbakv.viz.progress.Progress`).
    """
    fig = new_figure(fig, (10, 6), dpi)
    owners = owners or owners_of(trace, by)
    n_cells = max(int(trace.arrays["read_len"].max(initial=0)), 1)
    (c0, c1), (s0, s1) = span(cells, n_cells, "cells"), span(steps, need_steps(trace), "steps")
    ax = fig.subplots()
    ax.set_xlim(c0 - 0.5, c1 - 0.5)  # its tick labels take their room before measuring
    ax.set_ylim(s1 - 0.5, s0 - 0.5)
    width, height = _room(ax, owners)
    cell_bin = bin_size(c1 - c0, width, bin, "bin")
    step_bin = bin_size(s1 - s0, height, step_bin, "step_bin")
    pixels = owner_pixels(trace, owners, (c0, c1), (s0, s1), cell_bin, step_bin, progress)
    extent = (*_full(pixels.cell_edges, cell_bin), *_full(pixels.step_edges, step_bin)[::-1])
    ax.imshow(shade(owners, pixels), interpolation="nearest", aspect="auto", extent=extent)
    read_len = trace.arrays["read_len"][trace.step_frames[s0:s1]]
    ax.plot(np.clip(read_len, c0, c1) - 0.5, np.arange(s0, s1), color=READ_LEN_COLOUR, lw=1)
    annotation_marks(ax, trace, (s0, s1), x=c1 - 0.5)
    if mark_step is not None:
        ax.axhline(mark_step, color=MARK_COLOUR, linestyle="--", linewidth=1)
    ax.set_xlim(c0 - 0.5, c1 - 0.5)
    ax.set_ylim(pixels.step_edges[-1] - 0.5, s0 - 0.5)
    ax.set_xlabel("cell")
    ax.set_ylabel("step")
    ax.set_title(
        f"cell owners over time (red: read_len){binned_note(cell_bin, step_bin)}", fontsize="medium"
    )
    mixed, cached = bool((pixels.label == MIXED).any()), bool((pixels.label == CACHED).any())
    owner_legend(ax, owners, mixed=mixed, cached=cached)
    fig.numbakv = {"pixels": pixels, "owners": owners}
    return fig


def plot_mask(
    step, window: int, *, cells=None, bin=None, dpi: float = 100, fig: Figure | None = None
) -> Figure:
    """Tokens x cells: which cells each token of `step` (a live `Step` or a recorded
    `TraceStep`) attends under `window`. A pixel covering `bin` cells is lit when any of
    them is attended, darker the more are: one attended cell among thousands still shows."""
    fig = new_figure(fig, (8, 5), dpi)
    lo, hi = span(cells, max(step.read_len, 1), "cells")
    ax = fig.subplots()
    ax.set_xlabel("cell")
    ax.set_ylabel("token (seq@position)")
    ax.set_title("mask", fontsize="medium")  # the labels' and title's room, then measure
    ax.set_xlim(lo - 0.5, hi - 0.5)
    ax.set_ylim(step.width - 0.5, -0.5)
    if step.width <= 64:
        labels = [
            f"{s}@{p}" if s >= 0 else "pad"
            for s, p in zip(step.seq_ids.tolist(), step.positions.tolist(), strict=True)
        ]
        ax.set_yticks(range(step.width), labels, fontsize="x-small")
    width, height = axes_pixels(ax)
    cell_bin = bin_size(hi - lo, width, bin, "bin")
    token_bin = bin_size(step.width, height, None, "token bin")
    pixels = mask_pixels(step, window, (lo, hi), cell_bin, token_bin)
    fraction = pixels.attended / np.maximum(pixels.pairs, 1)
    grey = np.where(pixels.attended > 0, 0.6 * (1 - fraction), 1.0)  # attended: 0.6 .. black
    extent = (*_full(pixels.cell_edges, cell_bin), *_full(pixels.token_edges, token_bin)[::-1])
    ax.imshow(
        np.repeat(grey[..., None], 3, axis=2), interpolation="nearest", aspect="auto", extent=extent
    )
    ax.set_xlim(lo - 0.5, hi - 0.5)
    ax.set_ylim(step.width - 0.5, -0.5)
    kind = "global" if window == 0 else "sliding"
    ax.set_title(
        f"mask, window {window} ({kind}), {int(pixels.attended.sum())} attended"
        f"{binned_note(cell_bin)}; darker = more of the pixel attended",
        fontsize="medium",
    )
    fig.numbakv = {"pixels": pixels}
    return fig


def plot_all(
    trace: Trace,
    step: int = -1,
    window: int | None = None,
    *,
    cells=None,
    steps=None,
    bin=None,
    by=None,
    dpi: float = 100,
    progress=None,
) -> Figure:
    """The pictures of a trace in one figure, for recorded step number `step`: the pool,
    the mask, the timeline, the metrics and each sequence's locality, in one colouring.
    `fig.numbakv` maps each picture's name to its data."""
    fig = Figure(figsize=(20, 16), dpi=dpi, layout="constrained")
    top, middle, bottom = fig.subfigures(3, 1, height_ratios=(1, 1, 0.8))
    (cells_fig, mask_fig), (timeline_fig, metrics_fig) = (
        top.subfigures(1, 2),
        middle.subfigures(1, 2),
    )
    step = _step(trace, step)
    trace.metrics()  # first, while the least is held: its free runs' memory is the largest
    owners = owners_of(trace, by)
    window = trace.config.distinct_windows[0] if window is None else window
    keep = {"cells": cells, "bin": bin}
    plot_cells(trace, step, fig=cells_fig, owners=owners, dpi=dpi, **keep)
    plot_mask(trace.step(trace.step_frames[step]), window, fig=mask_fig, dpi=dpi, **keep)
    plot_timeline(
        trace,
        steps=steps,
        mark_step=step,
        fig=timeline_fig,
        owners=owners,
        dpi=dpi,
        progress=progress,
        **keep,
    )
    plot_locality(trace, steps=steps, mark_step=step, fig=bottom, dpi=dpi)
    # last: it measures nothing, and its many points would slow each measuring layout
    plot_metrics(trace, steps=steps, mark_step=step, fig=metrics_fig, dpi=dpi)
    parts = {
        "cells": cells_fig,
        "mask": mask_fig,
        "timeline": timeline_fig,
        "metrics": metrics_fig,
        "locality": bottom,
    }
    fig.numbakv = {name: part.numbakv for name, part in parts.items()}
    return fig


def _step(trace: Trace, step: int) -> int:
    """Recorded step number `step` (negative counts from the end); ValueError naming it."""
    n_steps = need_steps(trace)
    if not -n_steps <= step < n_steps:
        raise ValueError(f"step={step} is outside the trace's {n_steps} recorded steps")
    return step % n_steps


def _full(edges: np.ndarray, size: int) -> tuple[float, float]:
    """The data span of an image's pixels of `size` items each from `edges[0]`: the last
    pixel drawn full width (and clipped by the axes' limits), so each pixel sits exactly
    over its items instead of the image stretching them evenly."""
    return edges[0] - 0.5, edges[0] + (len(edges) - 1) * size - 0.5


def _rgb(colour: str) -> np.ndarray:
    return np.array(to_rgb(colour))
