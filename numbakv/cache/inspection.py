"""What the device cache tells of its device state: the bindings a recorded step depends
on, and host copies for tests and debugging (each copies capacity-sized arrays back and
waits for the stream in use)."""

import numpy as np

from numbakv.cache.bindings import Bindings, check_bindings
from numbakv.cache.cuda import device_address
from numbakv.cache.graph import not_while_capturing
from numbakv.core.calls import check_layer
from numbakv.core.observe import check_cells, locked


class Inspection:
    """The device cache's state queries, bindings and debugging copies (a part of
    `CellCache`)."""

    @property
    @locked
    def used_cells(self) -> int:
        return self._table.used_cells

    @property
    @locked
    def free_cells(self) -> int:
        return self._table.free_cells

    @property
    def capacity(self) -> int:
        return self.config.capacity

    @locked
    def cells_state(self, cells) -> tuple[np.ndarray, np.ndarray]:
        """([n] int32 pos, [n, n_owner_words] uint64 owners) of `cells` ([n] ints in [0,
        capacity); ConfigError otherwise) in the host table, copies (the device is not read):
        what a `Recorder` reads of the cells a verb touched (`touched_cells`)."""
        return self._table.cells_state(check_cells(cells, self.config.capacity))

    @property
    @locked
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

    @locked
    def bindings(self) -> Bindings:
        """What a recorded launch or captured step depends on: the pool's generation and the
        device addresses of the K/V arrays, the fixed buffers and the decode workspaces
        (docs/contract.md §4)."""
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

    @locked
    def check_bindings(self, bindings: Bindings) -> None:
        """Raises BindingError naming what moved since `bindings` were taken (the pool grew:
        re-record the step), or when they are another cache's; else returns None."""
        check_bindings(bindings, self.bindings())

    @not_while_capturing
    def _to_host(self, *arrays) -> tuple[np.ndarray, ...]:
        """Host copies of device `arrays`, copied on the stream in use, then waited for."""
        stream = self._streams.current
        copies = tuple(array.copy_to_host(stream=stream) for array in arrays)
        stream.synchronize()
        return copies

    @locked
    def check_invariants(self) -> None:
        """Raises AssertionError unless the host table keeps docs/contract.md §2's
        invariants and the device mirror (cell_pos, cell_owners, each live sequence's
        seq_cells row) equals it. Copies capacity-sized arrays back: for tests and
        debugging."""
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
        for seq in range(self.config.max_seqs):
            cells = self._table.cells_of(seq)
            if lengths[seq] != len(cells) or not np.array_equal(rows[seq, : len(cells)], cells):
                raise AssertionError(f"device mirror invariant broken: seq_cells of {seq}")

    @locked
    def mirror(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the device mirror: cell_pos [capacity] int32, cell_owners
        [capacity, n_owner_words] uint64. Copies capacity-sized arrays: for tests and debugging."""
        return self._to_host(self._buffers.cell_pos, self._buffers.cell_owners)

    @locked
    def seq_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the position -> cell table: seq_cells [max_seqs, max_seq_len] int32
        (entries past a length are stale) and seq_len [max_seqs] int32. For tests."""
        return self._to_host(self._buffers.seq_cells, self._buffers.seq_len)

    @locked
    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `layer`'s K and V as stored: [rows, n_kv_heads, row_width] in the
        layer's formats (docs/contract.md §4.1: uint16 bfloat16 patterns, uint8 blocks or
        bytes); `pool_values` gives what attention reads."""
        layer = check_layer(layer, self.config.n_layers)
        if self._pool.rows == 0:
            cfg = self.config
            return tuple(
                np.zeros(cfg.pool_shape(layer, which, 0), cfg.pool_dtype(layer, which))
                for which in (0, 1)
            )
        return self._to_host(self._pool.k[layer], self._pool.v[layer])
