"""numbakv.reference: the NumPy reference cell cache, the oracle every device result is held to.

Imports no numba. Same public API and errors as `numbakv.CellCache`; host arrays everywhere.
Its config, snapshot and errors are the shared types: `numbakv.CacheConfig`, `numbakv.Snapshot`.
"""

from .attention import solo_attention
from .cache import CellCache
from .step import Step

__all__ = ["CellCache", "Step", "solo_attention"]
