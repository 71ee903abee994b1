"""numbakv.reference: the NumPy reference cell cache, the oracle every device result is held to.

Imports no numba. Same public API and errors as `numbakv`; host arrays everywhere.
"""

from numbakv.config import CacheConfig
from numbakv.snapshot import Snapshot

from .attention import solo_attention
from .cache import CellCache
from .step import Step

__all__ = ["CacheConfig", "CellCache", "Snapshot", "Step", "solo_attention"]
