"""What both cell caches share around their own table and pool: the state properties, the
declaration, the current step and its expiry, and the observer hook.

A cache gives `_table` (`check_live`, `length`, `read_len`, `used_cells`, `free_cells`,
`live`, `snapshot`) and `_pool` (`rows`, `growth_count`, `generation`, `allocated_bytes`).
"""

import numpy as np

from numbakv.checks import (
    check_declaration,
    check_layer,
    check_mode,
    check_query,
    check_width,
)
from numbakv.config import CacheConfig
from numbakv.errors import StepError
from numbakv.observe import Observable
from numbakv.snapshot import Snapshot


class CacheBase(Observable):
    def __init__(self, config: CacheConfig, table, pool):
        super().__init__()
        self.config = config
        self._table = table
        self._pool = pool
        self._declared: np.ndarray | None = None
        self._step = None
        self._written: set[int] = set()

    def declare_step(self, seq_ids) -> None:
        """Records the next step's tokens: one live sequence id per token, in order."""
        self._declared = check_declaration(self._table, self.config, seq_ids)
        self._after("declare_step")

    def pos(self, seq: int) -> int:
        """Positions `seq` holds: the position its next token gets."""
        return self._table.length(self._table.check_live(seq))

    @property
    def read_len(self) -> int:
        """Every occupied cell lies in [0, read_len)."""
        return self._table.read_len

    @property
    def used_cells(self) -> int:
        return self._table.used_cells

    @property
    def free_cells(self) -> int:
        return self._table.free_cells

    @property
    def capacity(self) -> int:
        return self.config.capacity

    @property
    def live_seqs(self) -> list[int]:
        """The live sequence ids, ascending."""
        return np.flatnonzero(self._table.live).tolist()

    @property
    def rows(self) -> int:
        """Cells the pool has allocated (0 before the first step)."""
        return self._pool.rows

    @property
    def growth_count(self) -> int:
        """Times the pool grew after its first allocation."""
        return self._pool.growth_count

    @property
    def generation(self) -> int:
        """Changes exactly when storage moves: the first allocation and every growth."""
        return self._pool.generation

    @property
    def allocated_bytes(self) -> int:
        """Bytes of K and V storage over all layers."""
        return self._pool.allocated_bytes

    def snapshot(self) -> Snapshot:
        """A host copy of the cell table, cells [0, read_len)."""
        return self._table.snapshot(self._pool.rows)

    def _prepared(self, step):
        """Makes `step` the current step (the last one expires) and tells the observers."""
        self._declared = None
        self._expire_step()
        self._step = step
        self._notify("prepare_step", step)
        return step

    def _after(self, event: str, result=None):
        """After a verb succeeded: the step expires and the observers hear of it."""
        self._expire_step()
        self._notify(event)
        return result

    def _expire_step(self) -> None:
        if self._step is not None:
            self._step.expire()
        self._step = None
        self._written = set()

    def _attend_step(self, layer, q_shape: tuple[int, ...], mode: str):
        """(step, layer) for attend, after its checks: a live step, the layer written in
        it, a known mode and a query [width, n_heads, head_dim]."""
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        check_mode(mode)
        if layer not in self._written:
            raise StepError(
                f"attend({layer}) before write({layer}) in this step; write the step's K/V first"
            )
        check_query(q_shape, step.width, self.config)
        return step, layer

    def _current_step(self):
        if self._step is None:
            raise StepError("no prepared step; call declare_step() and prepare_step() first")
        return self._step

    def _place(self, width: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SPEC §3 steps 1-3: checks the declaration (again: a verb may have run since it)
        and the width, grows the pool to what placement can reach, then places the tokens
        and claims their cells. Returns [width] int32 cells, positions and seq_ids, padded
        with -1. The declaration stays pending until `_prepared`."""
        if self._declared is None:
            raise StepError(
                "prepare_step() with nothing declared; call declare_step(seq_ids) first"
            )
        seq_ids = check_declaration(self._table, self.config, self._declared)
        n = len(seq_ids)
        width = check_width(width, n, self.config.max_width)
        table = self._table
        self._pool.grow_to(min(self.config.capacity, table.read_len + n), table.read_len)
        positions = table.positions_of(seq_ids)
        cells = table.find_cells(n)
        table.claim(cells, positions, seq_ids)
        pad = np.full(width - n, -1, dtype=np.int32)
        cells, positions, seq_ids = (np.concatenate([a, pad]) for a in (cells, positions, seq_ids))
        return cells, positions, seq_ids
