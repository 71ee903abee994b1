"""The pool over time as an animation (`numbakv viz --kind movie -o pool.gif`): each frame
is the block grid of `plot_cells`, aggregated over the steps it covers."""

import numpy as np
from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.figure import Figure

from numbakv.trace.frames import Trace

from .holders import CACHED
from .layout import axes_pixels, bin_size, block_grid, need_steps, owner_legend, shade, span
from .owners import MIXED, owners_of
from .pixels import owner_pixels


def save_movie(
    trace: Trace,
    path,
    *,
    frames: int = 40,
    fps: int = 8,
    cells=None,
    steps=None,
    bin=None,
    by=None,
    dpi: float = 80,
    progress=None,
) -> dict:
    """Writes an animated GIF of the pool (Pillow) to `path`: up to `frames` pictures (each
    an equal share of the steps, the last perhaps shorter), each the
    blocks of `bin` cells (default: what fits) aggregated over its share of the steps.
    Returns the data drawn: {"pixels": OwnerPixels (a row per frame), "columns": int}."""
    if int(fps) < 1 or int(frames) < 1:
        raise ValueError(f"frames={frames!r}, fps={fps!r}: give at least 1 of each")
    owners = owners_of(trace, by)
    n_cells = max(int(trace.arrays["read_len"].max(initial=0)), 1)
    (c0, c1), (s0, s1) = span(cells, n_cells, "cells"), span(steps, need_steps(trace), "steps")
    fig = Figure(figsize=(8, 5), dpi=dpi)  # a fixed layout: laid out once, not per frame
    ax = fig.subplots()
    fig.subplots_adjust(left=0.08, right=0.68, top=0.92, bottom=0.1)
    width, height = axes_pixels(ax)
    block = bin_size(c1 - c0, width * height / 16, bin, "bin")  # 4 x 4 pixels a block
    step_bin = bin_size(s1 - s0, max(int(frames), 1), None, "frames")
    pixels = owner_pixels(trace, owners, (c0, c1), (s0, s1), block, step_bin, progress)
    n_blocks = pixels.label.shape[1]
    columns = 2 ** round(np.log2(np.sqrt(2 * n_blocks)))
    columns = max(1, min(columns, n_blocks))
    rgb = block_grid(shade(owners, pixels), columns, np.ones(3))  # a picture per row
    image = ax.imshow(rgb[0], interpolation="nearest")
    mixed, cached = bool((pixels.label == MIXED).any()), bool((pixels.label == CACHED).any())
    owner_legend(ax, owners, mixed=mixed, cached=cached)
    unit = "cell" if block == 1 else f"block of {block} cells"
    ax.set_xlabel(f"{unit} mod {columns}")
    ax.set_ylabel(f"{unit} // {columns}")

    def draw(i: int):
        image.set_data(rgb[i])
        a, b = pixels.step_edges[i], pixels.step_edges[i + 1] - 1
        ax.set_title(f"steps {a}-{b}", fontsize="medium")
        return (image,)

    FuncAnimation(fig, draw, frames=len(rgb), blit=False).save(
        path, writer=PillowWriter(fps=fps), dpi=dpi
    )
    return {"pixels": pixels, "columns": columns}
