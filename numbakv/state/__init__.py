"""A sequence's K/V state, saved from a cache and loaded into one (docs/contract.md §13):
`SeqState` and its file. numba-free."""

from numbakv.state.seq_state import VERSION, Geometry, SeqState

__all__ = ["VERSION", "Geometry", "SeqState"]
