"""`CellCache` on the device: SPEC §2-§8 with a fast host table, the KV pool and step buffers
on the device, and numba.cuda kernels for placement, the table mirror, masks and attention.
"""

import numpy as np

from numbakv.cache import inputs
from numbakv.cache._cuda import cuda
from numbakv.cache.buffers import StepBuffers
from numbakv.cache.kernels import attention, masks, placement, seq_cells, verbs
from numbakv.cache.pool import ALLOCATION_ERRORS, Allocator, DevicePool, device_allocator
from numbakv.cache.step import Step
from numbakv.cache.table import HostTable
from numbakv.checks import (
    check_declaration,
    check_layer,
    check_mode,
    check_query,
    check_scale,
    check_shape,
    check_width,
    default_scale,  # noqa: F401  (numbakv.cache.default_scale, public since 0.1)
)
from numbakv.config import CacheConfig
from numbakv.errors import AllocationError, ConfigError, StepError
from numbakv.observe import Observable, locked
from numbakv.snapshot import Snapshot


class CellCache(Observable):
    """Several sequences sharing one pool of per-token cells, K/V on the device.

    The same API, placement and errors as `numbakv.reference.CellCache`, which is written
    independently and is the oracle the differential tests hold this to. Every verb is
    atomic (when it raises, nothing changed) and every verb but `seq_new` makes the last
    `Step` stale. Per step only the step's [width] arrays cross the bus: the table's mirror
    on the device is kept by kernels, never copied over. Observers (`add_observer`) hear of
    every verb that succeeded. Every verb that changes the table (all but `seq_new` and
    `declare_step`) drops a pending declaration. Thread-safe: every verb, step call, write,
    attend and state query holds one reentrant lock (`lock`, the seed's recursive mutex).
    """

    def __init__(self, config: CacheConfig, allocator: Allocator = device_allocator):
        super().__init__()
        if not isinstance(config, CacheConfig):
            raise ConfigError(f"expected a CacheConfig, got {config!r}")
        if config.head_dim > attention.HEAD_DIM_MAX:
            raise ConfigError(
                f"head_dim={config.head_dim}: the device kernels hold head_dim <= "
                f"{attention.HEAD_DIM_MAX} (the reference takes any)"
            )
        self.config = config
        try:
            self._table = HostTable(config)
            self._buffers = StepBuffers(config)
        except ALLOCATION_ERRORS as error:
            sizes = config.device_bytes()
            fixed = sizes["total"] - sizes["pool"]
            raise AllocationError(
                f"could not allocate the table and the fixed buffers ({fixed:,} bytes, see "
                "CacheConfig.device_bytes()); lower capacity or max_seqs, or max_seq_len"
            ) from error
        self._pool = DevicePool(config, allocator)
        self._workspaces: dict[int, tuple] = {}  # n_heads -> decode split scratch, reused
        self._declared: np.ndarray | None = None
        self._step: Step | None = None
        self._written: set[int] = set()

    # -- table verbs: the host table decides, a kernel updates the mirror ------

    @locked
    def seq_new(self) -> int:
        """Reserves the lowest free sequence id; the sequence is live and empty."""
        return self._notify("seq_new", result=self._table.seq_new())

    @locked
    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence sharing `src`'s cells with position < upto (default pos(src))."""
        src = self._table.check_live(src)
        seq, cells = self._table.seq_clone(src, upto)
        b = self._buffers
        verbs.launch_add_owner(_to_device(cells), len(cells), seq, b.cell_owners)
        seq_cells.launch_copy_prefix(b.seq_cells, b.seq_len, src, seq, len(cells))
        return self._table_changed("seq_clone", seq)

    @locked
    def seq_rm(self, seq: int) -> None:
        """Releases `seq`: clears its bit everywhere and frees the cells left unowned."""
        seq = self._table.check_live(seq)
        self._drop(seq, self._table.seq_rm(seq), length=0)
        self._table_changed("seq_rm")

    @locked
    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id stays live."""
        seq = self._table.check_live(seq)
        self._drop(seq, self._table.rewind(seq, position), length=self._table.length(seq))
        self._table_changed("rewind")

    @locked
    def clear(self) -> None:
        """Frees every cell and id and drops the step; the pool keeps its storage."""
        self._table.clear()
        verbs.launch_clear_table(self._buffers.cell_pos, self._buffers.cell_owners)
        seq_cells.launch_clear_lengths(self._buffers.seq_len)
        self._table_changed("clear")

    def _drop(self, seq: int, cells: np.ndarray, length: int) -> None:
        """Mirrors a seq_rm or rewind: `seq` leaves `cells`, and holds `length` positions."""
        b = self._buffers
        if len(cells):
            verbs.launch_drop_owner(_to_device(cells), len(cells), seq, b.cell_pos, b.cell_owners)
        seq_cells.launch_set_length(b.seq_len, seq, length)

    # -- the step (SPEC §3) ----------------------------------------------------

    @locked
    def declare_step(self, seq_ids) -> None:
        """Records the next step's tokens: one live sequence id per token, in order."""
        self._declared = check_declaration(self._table, self.config, seq_ids)
        self._expire_step()
        self._notify("declare_step")

    @locked
    def prepare_step(self, width: int | None = None) -> Step:
        """Grows the pool, places the declared tokens and writes the step buffers and masks.

        width : rows of the step, default the declared count; a larger width pads
                (cell, position and sequence -1, an all-zero mask row)

        In order: check the declaration again (a verb may have run since) and the width;
        find the cells (pure); grow the pool to min(capacity, read_len + n), the furthest
        lowest-free placement can reach, so that a refused allocation leaves the table
        untouched; claim the cells; upload the step's [width] arrays and read_len; kernels
        update the mirror and write the masks. A refused call keeps the declaration.
        """
        if self._declared is None:
            raise StepError(
                "prepare_step() with nothing declared; call declare_step(seq_ids) first"
            )
        seq_ids = check_declaration(self._table, self.config, self._declared)
        n = len(seq_ids)
        width = check_width(width, n, self.config.max_width)
        table = self._table
        cells = table.find_cells(n)
        self._pool.grow_to(min(self.config.capacity, table.read_len + n), table.read_len)
        positions = table.claim(cells, seq_ids)
        cells, positions, seq_ids = (_pad(a, width) for a in (cells, positions, seq_ids))
        read_len = table.read_len
        self._write_step(cells, positions, seq_ids, read_len)
        self._declared = None
        self._expire_step()
        self._step = Step(cells, positions, seq_ids, read_len, self._buffers)
        return self._notify("prepare_step", self._step, self._step)

    def _write_step(self, cells, positions, seq_ids, read_len: int) -> None:
        b = self._buffers
        width = len(cells)
        b.upload(cells, positions, seq_ids, read_len)
        placement.launch_place_tokens(
            b.cells, b.positions, b.seq_ids, width, b.cell_pos, b.cell_owners
        )
        seq_cells.launch_record_tokens(
            b.cells, b.positions, b.seq_ids, width, b.seq_cells, b.seq_len
        )
        for window, mask in b.masks.items():
            masks.launch_write_mask(
                mask, b.cell_pos, b.cell_owners, b.seq_ids, b.positions, width, read_len, window
            )

    # -- K/V -------------------------------------------------------------------

    @locked
    def write(self, layer: int, k, v) -> None:
        """Writes the step's K and V rows into their cells of `layer`, rounded to the storage
        dtype (to nearest even).

        k, v : [width, n_kv_heads, head_dim]: host arrays of any real float dtype (rounded to
               float32 unless both are float32 or both float16), or C-contiguous device
               arrays of float32 or float16, one dtype for both. Both are checked before
               either is written. Padded rows are skipped.
        """
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        k, v = (inputs.floats(name, x, inputs.KV_DTYPES) for name, x in (("k", k), ("v", v)))
        check_shape("k", k.shape, shape)
        check_shape("v", v.shape, shape)
        k, v = inputs.on_device([k, v], inputs.KV_DTYPES)
        b = self._buffers
        placement.launch_scatter_kv(
            k, v, self._pool.k[layer], self._pool.v[layer], b.cells, step.width
        )
        self._written.add(layer)

    @locked
    def attend(self, layer: int, q, scale: float | None = None, mode: str = "gathered"):
        """[width, n_heads, head_dim] float32 device array: each token's attention over the
        cells it sees, computed on the device.

        q     : [width, n_heads, head_dim], n_heads a multiple of n_kv_heads (query head h
                reads KV head h // (n_heads // n_kv_heads)): a host array of any real float
                dtype (rounded to float32) or a C-contiguous float32 device array
        scale : a finite positive real, default 1 / sqrt(head_dim)
        mode  : "gathered" (default) reads each token's own cells through seq_cells, work in
                proportion to what it sees; "masked" sweeps [0, read_len) under the window's
                mask (the seed design). Both equal the reference's attend.
        Rows that see no cell (padding) give 0; NaN and inf in what a token sees give what
        the reference gives. Requires `write(layer, ...)` in this step.
        """
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        check_mode(mode)
        if layer not in self._written:
            raise StepError(
                f"attend({layer}) before write({layer}) in this step; write the step's K/V first"
            )
        q = inputs.floats("q", q, inputs.Q_DTYPES)
        check_query(q.shape, step.width, self.config)
        scale = check_scale(scale, self.config.head_dim)
        (q,) = inputs.on_device([q], inputs.Q_DTYPES)
        out = cuda.device_array(q.shape, np.float32)
        k, v, b = self._pool.k[layer], self._pool.v[layer], self._buffers
        window = self.config.windows[layer]
        workspace = self._workspace(q.shape[1])
        if mode == "masked":
            attention.launch_attend_masked(
                q, k, v, b.masks[window], step.width, step.read_len, scale, out,
                workspace=workspace,
            )  # fmt: skip
        else:
            longest = int(step.positions.max()) + 1  # the longest range a token reads
            attention.launch_attend_gathered(
                q, k, v, b.seq_cells, b.seq_ids, b.positions, step.width, window, scale, out,
                workspace=workspace, max_len=min(longest, window) if window else longest,
            )  # fmt: skip
        return out

    def _workspace(self, n_heads: int) -> tuple:
        """The decode kernels' split scratch for `n_heads` query heads, made once."""
        if n_heads not in self._workspaces:
            self._workspaces[n_heads] = attention.split_workspace(
                self.config.max_width, n_heads, self.config.head_dim
            )
        return self._workspaces[n_heads]

    def _current_step(self) -> Step:
        if self._step is None:
            raise StepError("no prepared step; call declare_step() and prepare_step() first")
        return self._step

    def _table_changed(self, event: str, result=None):
        """After a verb that changed the table: the step expires, a pending declaration is
        dropped (it was checked against the old table), the observers hear of it."""
        self._declared = None
        self._expire_step()
        return self._notify(event, result=result)

    def _expire_step(self) -> None:
        if self._step is not None:
            self._step.expire()
        self._step = None
        self._written = set()

    # -- state -----------------------------------------------------------------

    @locked
    def pos(self, seq: int) -> int:
        """Positions `seq` holds: the position its next token gets."""
        return self._table.length(self._table.check_live(seq))

    @property
    def read_len(self) -> int:
        """Every occupied cell lies in [0, read_len)."""
        return self._table.read_len

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

    @property
    def buffers(self) -> StepBuffers:
        """The fixed device buffers (step arrays, masks, table mirror); they never move."""
        return self._buffers

    @locked
    def snapshot(self) -> Snapshot:
        """A host copy of the cell table, cells [0, read_len)."""
        return self._table.snapshot(self._pool.rows)

    @locked
    def check_invariants(self) -> None:
        """Raises AssertionError unless the host table keeps SPEC §2's invariants and the
        device mirror (cell_pos, cell_owners, each live sequence's seq_cells row) equals it.
        Copies capacity-sized arrays back: for tests and debugging."""
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
        return self._buffers.cell_pos.copy_to_host(), self._buffers.cell_owners.copy_to_host()

    @locked
    def seq_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the position -> cell table: seq_cells [max_seqs, max_seq_len] int32
        (entries past a length are stale) and seq_len [max_seqs] int32. For tests."""
        return self._buffers.seq_cells.copy_to_host(), self._buffers.seq_len.copy_to_host()

    @locked
    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `layer`'s K and V: [rows, n_kv_heads, head_dim] of the storage
        dtype (uint16 bit patterns for bfloat16)."""
        layer = check_layer(layer, self.config.n_layers)
        if self._pool.rows == 0:
            shape = (0, self.config.n_kv_heads, self.config.head_dim)
            empty = np.zeros(shape, self.config.storage_dtype)
            return empty, empty.copy()
        return self._pool.k[layer].copy_to_host(), self._pool.v[layer].copy_to_host()


def _pad(array: np.ndarray, width: int) -> np.ndarray:
    """[width] int32: `array` followed by -1."""
    padded = np.full(width, -1, dtype=np.int32)
    padded[: len(array)] = array
    return padded


def _to_device(array: np.ndarray):
    return cuda.to_device(np.ascontiguousarray(array, dtype=np.int32))
