"""Saved sequences in NumPy (docs/contract.md §13): a sequence's pool entries out to a
`SeqState`, a state's entries into placed cells."""

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.seq_state import Geometry, SeqState

from .pool import KVPool
from .storage import to_float32


def save(config: CacheConfig, pool: KVPool, cells: np.ndarray, start: int) -> SeqState:
    """The state of the positions start, start + 1, ... held in `cells` ([n] int, in
    position order): each layer's K and V rows of those cells, copied as stored."""
    positions = np.arange(start, start + len(cells), dtype=np.int32)
    k = tuple(pool.k[layer][cells] for layer in range(config.n_layers))
    v = tuple(pool.v[layer][cells] for layer in range(config.n_layers))
    return SeqState(Geometry.of(config), positions, k, v, start)


def load(pool: KVPool, cells: np.ndarray, state: SeqState, convert: tuple[bool, ...]) -> None:
    """Writes `state`'s entries into rows `cells` ([n] int, in position order) of every
    layer: copied as stored, or, for a layer whose `convert` is True, read as float32 in
    the state's formats and stored in the pool's."""
    for layer, is_converted in enumerate(convert):
        if is_converted:
            k_format, v_format = state.geometry.formats[layer]
            k = to_float32(state.k[layer], k_format)
            v = to_float32(state.v[layer], v_format)
            pool.write(layer, cells, k, v)
        else:
            pool.k[layer][cells] = state.k[layer]
            pool.v[layer][cells] = state.v[layer]
