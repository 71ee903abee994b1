"""numbakv.viz: pictures of cell occupancy, from snapshots and traces of either implementation.

Imports no numba. The plots use matplotlib without pyplot (no display needed).
"""

from .plots import plot_all, plot_cells, plot_mask, plot_metrics, plot_timeline
from .text import render_text

__all__ = ["plot_all", "plot_cells", "plot_mask", "plot_metrics", "plot_timeline", "render_text"]
