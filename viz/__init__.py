"""numbakv.viz: pictures of cell occupancy, from snapshots and traces of either implementation.

Imports no numba. The plots use matplotlib without pyplot (no display needed). Every
picture aggregates what a pixel covers (`numbakv.viz.pixels`), colours owners without
silent collisions (`numbakv.viz.owners`) and draws cells only the prefix cache holds as
cached (`numbakv.viz.holders`).
"""

from .movie import save_movie
from .owners import Owners, owners_of
from .panels import locality, plot_locality, plot_metrics
from .pixels import MaskPixels, OwnerPixels, mask_pixels, owner_pixels
from .plots import plot_all, plot_cells, plot_mask, plot_timeline
from .text import render_text

__all__ = [
    "MaskPixels", "OwnerPixels", "Owners", "locality", "mask_pixels", "owner_pixels",
    "owners_of", "plot_all", "plot_cells", "plot_locality", "plot_mask", "plot_metrics",
    "plot_timeline", "render_text", "save_movie",
]  # fmt: skip
