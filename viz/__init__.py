"""numbakv.viz: pictures of cell occupancy, from snapshots of either implementation.

Imports no numba.
"""

from .text import render_text

__all__ = ["render_text"]
