"""What the pictures share: ranges and bins from the keywords, shading, legends."""

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from numbakv.trace import Trace

from .owners import FREE_COLOUR, MIXED_COLOUR, OTHER_COLOUR, SHARED_COLOUR, Owners
from .pixels import OwnerPixels


def span(value: tuple[int, int] | None, n: int, what: str) -> tuple[int, int]:
    """[lo, hi) of `value` within [0, n) (None: all of it); ValueError naming the range
    when it is empty or outside."""
    lo, hi = (0, n) if value is None else value
    lo, hi = int(lo), int(min(hi, n))
    if not 0 <= lo < hi:
        raise ValueError(f"{what}={value!r} is empty or outside [0, {n}); give A:B with 0 <= A < B")
    return lo, hi


def bin_size(n: int, pixels: float, given: int | None, what: str) -> int:
    """`given`, or the least whole number of items per pixel that fits n items in `pixels`."""
    if given is not None:
        if int(given) < 1:
            raise ValueError(f"{what}={given!r}: give at least 1 per column")
        return int(given)
    return max(1, math.ceil(n / max(pixels, 1.0)))


def axes_pixels(ax) -> tuple[float, float]:
    """(width, height) in screen pixels of `ax` once its figure is laid out: an image drawn
    there with at most that many columns (rows) is never subsampled by matplotlib."""
    root = ax.get_figure(root=True)
    if (engine := root.get_layout_engine()) is not None:
        engine.execute(root)
    box = ax.get_window_extent()
    return max(box.width - 2, 1.0), max(box.height - 2, 1.0)  # less the frame's lines


def new_figure(fig: Figure | None, size: tuple[float, float], dpi: float) -> Figure:
    return fig if fig is not None else Figure(figsize=size, dpi=dpi, layout="constrained")


def shade(owners: Owners, pixels: OwnerPixels) -> np.ndarray:
    """[rows, cols, 3] float64 RGB: the majority owner's colour, as light as the pixel is
    empty (white = free, full colour = every cell-step occupied)."""
    occupied = pixels.occupied[..., None]
    return 1.0 - occupied * (1.0 - owners.rgb(pixels.label))


def owner_legend(ax, owners: Owners, mixed: bool) -> None:
    """free, shared, the coloured owners largest first, "other …" and "mixed" when drawn;
    says how many owners there are when not all are shown."""
    handles = [
        Patch(facecolor=FREE_COLOUR, edgecolor="grey", label="free"),
        Patch(facecolor=SHARED_COLOUR, label="shared"),
    ]
    handles += [Patch(facecolor=owners.colours[g], label=owners.labels[g]) for g in owners.shown]
    if owners.note:
        rest = int(np.count_nonzero(owners.totals)) - len(owners.shown)
        handles.append(Patch(facecolor=OTHER_COLOUR, label=f"other {owners.noun} ({rest})"))
    if mixed:
        handles.append(Patch(facecolor=MIXED_COLOUR, label="mixed (no majority)"))
    title = owners.note or f"by {owners.by}"
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1),
        fontsize="small",
        title=title,
        title_fontsize="small",
    )


def steps_of(trace: Trace) -> int:
    return len(trace.step_frames)


def binned_note(cell_bin: int, step_bin: int = 1) -> str:
    """'' or how many cells (and steps) each pixel aggregates."""
    parts = [f"{cell_bin} cells"] if cell_bin > 1 else []
    parts += [f"{step_bin} steps"] if step_bin > 1 else []
    return f" (each pixel: {' x '.join(parts)})" if parts else ""
