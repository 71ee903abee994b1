"""What the device cache tells of its device state: the bindings a recorded step depends
on, and host copies for tests and debugging (each copies capacity-sized arrays back and
waits for the stream in use)."""

import numpy as np

from numbakv.cache.bindings import Bindings
from numbakv.cache.buffers import StepBuffers
from numbakv.cache.cuda import device_address
from numbakv.cache.graph import not_while_capturing
from numbakv.cache.plans import Plans
from numbakv.cache.pool import DevicePool
from numbakv.cache.streams import Streams
from numbakv.cache.table import HostTable
from numbakv.core.calls import check_layer
from numbakv.core.config import CacheConfig
from numbakv.core.snapshot import Snapshot


@not_while_capturing
def to_host(stream, *arrays) -> tuple[np.ndarray, ...]:
    """Host copies of device `arrays`, copied on `stream`, then waited for."""
    copies = tuple(array.copy_to_host(stream=stream) for array in arrays)
    stream.synchronize()
    return copies


class Inspector:
    """The device cache's bindings and its host copies of the table, the mirror and the
    pool (`CellCache.bindings`, `snapshot`, `mirror`, `seq_table`, `pool_kv`,
    `check_invariants`). Owns nothing; reads the config, the host table, the pool, the
    fixed buffers, the plans' decode workspaces, and the stream in use (which it copies on).
    The cache holds its lock around every call."""

    def __init__(self, config: CacheConfig, table: HostTable, pool: DevicePool,
                 buffers: StepBuffers, plans: Plans, streams: Streams):  # fmt: skip
        self._config, self._table, self._pool = config, table, pool
        self._buffers, self._plans, self._streams = buffers, plans, streams

    def bindings(self) -> Bindings:
        """The pool's generation and rows and the device addresses of the K/V arrays, the
        fixed buffers and the decode workspaces."""
        pool = self._pool
        arrays = [a for pair in zip(pool.k, pool.v, strict=True) for a in pair]
        return Bindings(
            generation=pool.generation,
            rows=pool.rows,
            pool=tuple(0 if a is None else device_address(a) for a in arrays),
            fixed=tuple((name, device_address(a)) for name, a in self._buffers.all().items()),
            workspaces=tuple(
                (n_heads, device_address(ws[0])) for n_heads, ws in self._plans.workspaces()
            ),
        )

    def to_host(self, *arrays) -> tuple[np.ndarray, ...]:
        """Host copies of device `arrays`, on the stream in use (`to_host`)."""
        return to_host(self._streams.current, *arrays)

    def snapshot(self) -> Snapshot:
        """A host copy of the cell table, cells [0, read_len)."""
        return self._table.snapshot(self._pool.rows)

    def check_invariants(self) -> None:
        """AssertionError unless the host table keeps its invariants and the device mirror
        equals it."""
        self._table.check_invariants()
        snap = self.snapshot()
        cell_pos, cell_owners = self.mirror()
        rows, lengths = self.seq_table()
        mirrored = (
            np.array_equal(cell_pos[: snap.read_len], snap.pos)
            and not (cell_pos[snap.read_len :] >= 0).any()
            and np.array_equal(cell_owners[: snap.read_len], snap.owners)
            and not cell_owners[snap.read_len :].any()
        )
        if not mirrored:
            raise AssertionError("device mirror invariant broken: cell_pos/cell_owners differ")
        for seq in range(self._config.max_seqs):
            cells = self._table.cells_of(seq)
            if lengths[seq] != len(cells) or not np.array_equal(rows[seq, : len(cells)], cells):
                raise AssertionError(f"device mirror invariant broken: seq_cells of {seq}")

    def mirror(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of cell_pos and cell_owners."""
        return self.to_host(self._buffers.cell_pos, self._buffers.cell_owners)

    def seq_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of seq_cells and seq_len."""
        return self.to_host(self._buffers.seq_cells, self._buffers.seq_len)

    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `layer`'s K and V as stored (empty before the first step)."""
        layer = check_layer(layer, self._config.n_layers)
        if self._pool.rows == 0:
            cfg = self._config
            return tuple(
                np.zeros(cfg.pool_shape(layer, which, 0), cfg.pool_dtype(layer, which))
                for which in (0, 1)
            )
        return self.to_host(self._pool.k[layer], self._pool.v[layer])
