"""`CellCache`: the NumPy reference of the whole contract (SPEC §2 to §4, §8)."""

import numpy as np

from numbakv.base import CacheBase
from numbakv.checks import as_host, check_layer, check_shape
from numbakv.config import CacheConfig

from .attention import attend_cells, default_scale
from .pool import Allocator, KVPool, numpy_allocator
from .step import Step, window_mask
from .table import CellTable


class CellCache(CacheBase):
    """Several sequences sharing one pool of per-token cells; host arrays everywhere.

    >>> cache = CellCache(CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4,
    ...                               capacity=16, max_width=4, max_seqs=2))
    >>> a, b = cache.seq_new(), cache.seq_new()
    >>> cache.declare_step([a, a, b])
    >>> step = cache.prepare_step()
    >>> step.cells.tolist(), step.positions.tolist()
    ([0, 1, 2], [0, 1, 0])
    >>> step.mask(0)          # rows: tokens a@0, a@1, b@0; columns: cells 0, 1, 2
    array([[1, 0, 0],
           [1, 1, 0],
           [0, 0, 1]], dtype=uint8)

    Every verb is atomic: when it raises (an error of `numbakv.errors`), nothing changed.
    Every verb except `seq_new` makes the last prepared `Step` stale. Observers
    (`add_observer`) hear of every verb that succeeded.
    """

    def __init__(self, config: CacheConfig, allocator: Allocator = numpy_allocator):
        super().__init__(config, CellTable(config), KVPool(config, allocator))

    # -- table verbs (SPEC §2) -------------------------------------------------

    def seq_new(self) -> int:
        """Reserves the lowest free sequence id; the sequence is live and empty."""
        seq = self._table.seq_new()
        self._notify("seq_new")
        return seq

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence sharing `src`'s cells with position < upto (default pos(src))."""
        return self._after("seq_clone", self._table.seq_clone(src, upto))

    def seq_rm(self, seq: int) -> None:
        """Releases `seq`: clears its bit everywhere and frees the cells left unowned."""
        self._table.seq_rm(seq)
        self._after("seq_rm")

    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id stays live."""
        self._table.rewind(seq, position)
        self._after("rewind")

    def clear(self) -> None:
        """Frees every cell and id and drops the step; the pool keeps its storage."""
        self._table.clear()
        self._declared = None
        self._after("clear")

    # -- the step (SPEC §3) ----------------------------------------------------

    def prepare_step(self, width: int | None = None) -> Step:
        """Grows the pool, places the declared tokens and writes the step's masks.

        width : rows of the step, default the declared count; a larger width pads
                (padded rows get cell, position and sequence -1 and an all-zero mask row)

        Declaring [a, a, b] on an empty cache gives cells [0, 1, 2], positions [0, 1, 0]
        and, for every window W != 1, the mask (rows tokens, columns cells)

            a@0  1 0 0
            a@1  1 1 0
            b@0  0 0 1
        """
        cells, positions, seq_ids = self._place(width)
        table = self._table
        read_len = table.read_len
        masks = {
            w: window_mask(table.pos[:read_len], table.owners[:read_len], seq_ids, positions, w)
            for w in self.config.distinct_windows
        }
        return self._prepared(Step(cells, positions, seq_ids, read_len, masks))

    # -- K/V (SPEC §5) ---------------------------------------------------------

    def write(self, layer: int, k, v) -> None:
        """Writes the step's K and V rows into their cells of `layer`, cast to the storage dtype.

        k, v : [width, n_kv_heads, head_dim], any float dtype; padded rows are skipped
        """
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        k, v = as_host(k), as_host(v)
        check_shape("k", k.shape, shape)
        check_shape("v", v.shape, shape)
        cells = step.cells
        real = cells >= 0
        cells = cells[real]
        self._pool.k[layer][cells] = k[real]
        self._pool.v[layer][cells] = v[real]
        self._written.add(layer)

    def attend(
        self, layer: int, q, scale: float | None = None, mode: str = "gathered"
    ) -> np.ndarray:
        """[width, n_heads, head_dim] float32: each token's attention over the cells it sees.

        q     : [width, n_heads, head_dim], n_heads a multiple of n_kv_heads; query head h
                reads KV head h // (n_heads // n_kv_heads)
        scale : default 1 / sqrt(head_dim)
        mode  : "gathered" or "masked", the device's two kernels; the reference computes
                both the same way, from the mask

        softmax(q·K[c]ᵀ·scale) · V[c] over the cells of the layer's window mask, in float32;
        rows that see no cell (padding) give 0. Requires `write(layer, ...)` in this step.
        """
        q = as_host(q)
        step, layer = self._attend_step(layer, q.shape, mode)
        scale = default_scale(self.config.head_dim) if scale is None else np.float32(scale)
        mask = step.mask(self.config.windows[layer])
        q = q.astype(np.float32)
        return attend_cells(q, self._pool.k[layer], self._pool.v[layer], mask, scale)

    # -- state -----------------------------------------------------------------

    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `layer`'s K and V: [rows, n_kv_heads, head_dim], storage dtype."""
        layer = check_layer(layer, self.config.n_layers)
        return self._pool.k[layer].copy(), self._pool.v[layer].copy()
