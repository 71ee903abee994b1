"""The pool over time as an animation (`numbakv viz --kind movie -o pool.gif`): each frame
is the block grid of `plot_cells`, aggregated over the steps it covers.

The frames differ only in the picture and the title above it; every frame is drawn as
matplotlib's Pillow writer draws it (`Figure.savefig(format="rgba")`, or the canvas's own
draw where that gives the same pixels), but only the first whole: the others draw only
what meets the rectangle the pictures and titles lie in (the legend and the tick and axis
labels apart from it are hidden, the ticks fixed), and are that rectangle over the first
frame. Each frame is given its palette as Pillow's GIF writer gives it, on
worker threads while the next frames are drawn (Pillow lets go of the GIL there)."""

import io
import os
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import numpy as np
from matplotlib import rc_context, rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedFormatter, FixedLocator
from matplotlib.transforms import Bbox
from PIL import Image

from numbakv.trace.frames import Trace

from .holders import CACHED
from .layout import axes_pixels, bin_size, block_grid, need_steps, owner_legend, shade, span
from .owners import MIXED, owners_of
from .pixels import owner_pixels

# savefig's settings under which it draws what the figure's canvas draws
_AS_DRAWN = {"savefig.facecolor": "auto", "savefig.edgecolor": "auto", "savefig.transparent": False}


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
    titles = [f"steps {a}-{b - 1}" for a, b in pairwise(pixels.step_edges.tolist())]

    def show(i: int) -> None:
        image.set_data(rgb[i])
        ax.set_title(titles[i], fontsize="medium")

    images = _frames(fig, ax, show, titles)
    images[0].save(path, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return {"pixels": pixels, "columns": columns}


def _frames(fig: Figure, ax, show, titles: list[str]) -> list[Image.Image]:
    """The frames of `fig` (one axes, `ax`), `show(i)` setting frame i's picture and title
    (`titles[i]`), as matplotlib's Pillow writer makes them: the first drawn whole; each
    other drawn with the artists whose pixels keep away from the rectangle the frames
    change in hidden and the ticks the first found fixed, and that rectangle pasted over
    the first."""
    show(0)
    draw = _drawer(fig)
    first = draw()
    box, where = _changing(ax, titles, first.shape)
    _hide(ax, box)
    _fix_ticks(ax)
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        frames = [pool.submit(_gif_frame, first)]
        for i in range(1, len(titles)):
            show(i)
            frame = first.copy()
            frame[where] = draw()[where]
            frames.append(pool.submit(_gif_frame, frame))
        return [frame.result() for frame in frames]


def _drawer(fig: Figure):
    """A function returning [H, W, 4] uint8: `fig` drawn as `savefig(format="rgba")` draws
    it at the figure's dpi (savefig.bbox aside, which an animation does not apply). While
    savefig's colours are matplotlib's defaults (the figure's own), Agg's draw of the
    figure, without savefig's setup (a fifth faster); else savefig itself."""
    if all(rcParams[key] == value for key, value in _AS_DRAWN.items()):
        canvas = FigureCanvasAgg(fig)

        def drawn() -> np.ndarray:
            canvas.draw()
            return np.array(canvas.buffer_rgba())

        return drawn
    width, height = (fig.get_size_inches() * fig.dpi).astype(int)

    def saved() -> np.ndarray:
        buffer = io.BytesIO()
        with rc_context({"savefig.bbox": None}):  # as an animation saves: the whole figure
            fig.savefig(buffer, format="rgba", dpi=fig.dpi)
        return np.frombuffer(buffer.getvalue(), np.uint8).reshape(height, width, 4)

    return saved


def _gif_frame(frame: np.ndarray) -> Image.Image:
    """A frame as the Pillow writer keeps it (RGB unless some pixel is transparent), an RGB
    one given its palette as Pillow's GIF writer would (`_normalize_mode`: adaptive)."""
    image = Image.frombuffer("RGBA", frame.shape[1::-1], frame.tobytes(), "raw", "RGBA", 0, 1)
    if image.getextrema()[3][0] < 255:
        return image
    return image.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE)


def _changing(ax, titles: list[str], shape) -> tuple[Bbox, tuple[slice, slice]]:
    """(the rectangle, display pixels; its rows from the top and columns in a frame of
    `shape`) that every frame's picture and title lie in, 2 pixels wider each way than
    their extents (antialiasing)."""
    title = ax.title
    text, boxes = title.get_text(), [ax.bbox]
    for t in titles:
        title.set_text(t)
        boxes.append(title.get_window_extent())
    title.set_text(text)
    box = Bbox.union(boxes).padded(2)
    height, width = shape[:2]
    x0, x1 = max(int(np.floor(box.x0)), 0), min(int(np.ceil(box.x1)), width)
    y0, y1 = max(int(np.floor(box.y0)), 0), min(int(np.ceil(box.y1)), height)
    return box, (slice(height - y1, height - y0), slice(x0, x1))


def _fix_ticks(ax) -> None:
    """Gives each axis the ticks and labels its first draw found, as fixed ones (matplotlib
    finds them again at each draw otherwise: an eighth of a frame's time). Both axes count
    blocks from 0, so their labels have no offset a fixed formatter would lose."""
    for axis in (ax.xaxis, ax.yaxis):
        labels = [label.get_text() for label in axis.get_majorticklabels()]
        axis.set_major_locator(FixedLocator(axis.get_majorticklocs()))
        axis.set_major_formatter(FixedFormatter(labels))


def _hide(ax, box: Bbox) -> None:
    """Hides the legend, and each axis's labels (its own, its ticks', its offset), when none
    of them can draw in `box`: each empty, or its extent 2 pixels wider away from it."""
    groups = [[ax.get_legend()]]
    for axis in (ax.xaxis, ax.yaxis):
        ticks = axis.get_major_ticks() + axis.get_minor_ticks()
        groups.append(
            [axis.label, axis.offsetText, *(t.label1 for t in ticks), *(t.label2 for t in ticks)]
        )
    for group in groups:
        shown = [artist for artist in group if artist is not None and artist.get_visible()]
        drawn = [artist for artist in shown if getattr(artist, "get_text", lambda: "x")() != ""]
        if not any(artist.get_window_extent().padded(2).overlaps(box) for artist in drawn):
            for artist in shown:
                artist.set_visible(False)
