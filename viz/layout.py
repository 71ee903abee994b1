"""What the pictures share: ranges and bins from the keywords, shading, legends."""

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from numbakv.trace.frames import Trace

from .owners import (
    CACHED_COLOUR,
    FREE_COLOUR,
    MIXED_COLOUR,
    OTHER_COLOUR,
    SHARED_COLOUR,
    Owners,
)
from .pixels import OwnerPixels


class ZoomError(ValueError):
    """A zoom keyword (`what`: "cells", "steps", "bin") the picture cannot draw."""

    def __init__(self, what: str, message: str):
        super().__init__(message)
        self.what = what


def span(value: tuple[int, int | None] | None, n: int, what: str) -> tuple[int, int]:
    """[lo, hi) of `value` (hi None: to the end) clipped to [0, n) (None: all of it);
    ZoomError naming the range when it is empty there."""
    lo, hi = (0, n) if value is None else value
    lo, hi = int(lo), n if hi is None else int(min(hi, n))
    if not 0 <= lo < hi:
        shown = "" if value is None else f"{value[0]}:{'' if value[1] is None else value[1]} "
        raise ZoomError(
            what,
            f"{what} {shown}is empty or outside the picture's {n} {what}; "
            f"give A:B with 0 <= A < B and A < {n}",
        )
    return lo, hi


def bin_size(n: int, pixels: float, given: int | None, what: str) -> int:
    """`given`, or the least whole number of items per pixel that fits n items in `pixels`."""
    if given is not None:
        if int(given) < 1:
            raise ZoomError(what, f"{what}={given!r}: give at least 1 per column")
        return int(given)
    return max(1, math.ceil(n / max(pixels, 1.0)))


def axes_pixels(ax) -> tuple[float, float]:
    """(width, height) in screen pixels `ax` will have once its figure is laid out, or
    fewer: an image drawn there with at most that many columns (rows) is never subsampled
    by matplotlib. With a constrained layout, the (sub)figure's room less what the axes'
    decorations (title, labels, ticks, a legend beside it) take and the layout's pads: one
    measure of the decorations, not a layout of the whole figure."""
    root, room = ax.get_figure(root=True), ax.get_figure(root=False).bbox
    box = ax.get_window_extent()
    if root.get_layout_engine() is None:
        return max(box.width - 2, 1.0), max(box.height - 2, 1.0)  # less the frame's lines
    tight = ax.get_tightbbox()
    pad = 4 * 3 / 72 * root.dpi  # the layout's pads (3/72 inch) on both sides, twice over
    width = room.width * _share(ax, 1) - (tight.width - box.width) - pad
    height = room.height * _share(ax, 0) - (tight.height - box.height) - pad
    return max(0.97 * width, 1.0), max(0.97 * height, 1.0)  # 3 %: ticks move as it grows


def _share(ax, axis: int) -> float:
    """The fraction of its (sub)figure's width (axis 1) or height (0) `ax`'s grid cell has."""
    spec = ax.get_subplotspec()
    grid = spec.get_gridspec()
    ratios = (grid.get_width_ratios() if axis else grid.get_height_ratios()) or [1] * (
        grid.ncols if axis else grid.nrows
    )
    span = spec.colspan if axis else spec.rowspan
    return sum(ratios[i] for i in span) / sum(ratios)


def new_figure(fig: Figure | None, size: tuple[float, float], dpi: float) -> Figure:
    return fig if fig is not None else Figure(figsize=size, dpi=dpi, layout="constrained")


def shade(owners: Owners, pixels: OwnerPixels) -> np.ndarray:
    """[rows, cols, 3] float64 RGB: the majority owner's colour, as light as the pixel is
    empty (white = free, full colour = every cell-step occupied)."""
    occupied = pixels.occupied[..., None]
    return 1.0 - occupied * (1.0 - owners.rgb(pixels.label))


def block_grid(rgb: np.ndarray, columns: int, fill: np.ndarray) -> np.ndarray:
    """[n, grid_rows, columns, 3]: each of the n rows of block colours `rgb` ([n, n_blocks,
    3]) laid out row-major, `columns` blocks a line, places past the last block `fill`."""
    n, n_blocks, _ = rgb.shape
    grid = np.empty((n, -(-n_blocks // columns) * columns, 3))
    grid[:, :n_blocks], grid[:, n_blocks:] = rgb, fill
    return grid.reshape(n, -1, columns, 3)


def owner_legend(ax, owners: Owners, mixed: bool, cached: bool) -> None:
    """free, shared, the coloured owners largest first, "other …", "mixed" and "cached
    (prefix cache)" when drawn; says how many owners there are when not all are shown."""
    handles = [
        Patch(facecolor=FREE_COLOUR, edgecolor="grey", label="free"),
        Patch(facecolor=SHARED_COLOUR, label="shared"),
    ]
    handles += [Patch(facecolor=owners.colours[g], label=owners.labels[g]) for g in owners.shown]
    if owners.note:
        rest = sum(owners.counts) - len(owners.shown)
        handles.append(Patch(facecolor=OTHER_COLOUR, label=f"other {owners.noun} ({rest})"))
    if mixed:
        handles.append(Patch(facecolor=MIXED_COLOUR, label="mixed (no majority)"))
    if cached:
        handles.append(Patch(facecolor=CACHED_COLOUR, label="cached (prefix cache)"))
    title = owners.title
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize="small",
        title=title,
        title_fontsize="small",
    )


def need_steps(trace: Trace) -> int:
    """The trace's recorded steps; ValueError when it has none (nothing to draw)."""
    if (n := trace.n_steps) == 0:
        raise ValueError("the trace records no step, so there is nothing to draw")
    return n


def binned_note(cell_bin: int, step_bin: int = 1) -> str:
    """'' or how many cells (and steps) each pixel aggregates."""
    parts = [f"{cell_bin} cells"] if cell_bin > 1 else []
    parts += [f"{step_bin} steps"] if step_bin > 1 else []
    return f" (each pixel: {' x '.join(parts)})" if parts else ""
