"""`CellCache`: the NumPy reference of the whole contract (docs/contract.md §2 to §7)."""

import numpy as np

from numbakv.core import arrays
from numbakv.core.arrays import host_floats
from numbakv.core.calls import (
    check_declaration,
    check_layer,
    check_mode,
    check_query,
    check_scale,
    check_width,
)
from numbakv.core.config import CacheConfig
from numbakv.core.errors import AllocationError, ConfigError, StepError
from numbakv.core.observe import Observable, check_cells, locked
from numbakv.core.seq_state import SeqState, check_onto, check_room, check_start, load_plan
from numbakv.core.snapshot import Snapshot
from numbakv.core.values import check_shape

from . import saved
from .attention import attend_cells, attend_gathered
from .pool import Allocator, KVPool, numpy_allocator
from .step import Step
from .table import CellTable


class CellCache(Observable):
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

    Every verb is atomic: when it raises (an error of `numbakv.core.errors`), nothing changed.
    Every verb except `seq_new` makes the last prepared `Step` stale, and every verb that
    changes the table (all but `seq_new` and `declare_step`) drops a pending declaration.
    Observers (`add_observer`) hear of every verb that succeeded. Thread-safe: every verb, step
    call, write, attend and state query holds one reentrant lock (`lock`).
    """

    def __init__(self, config: CacheConfig, allocator: Allocator = numpy_allocator):
        super().__init__()
        if not isinstance(config, CacheConfig):
            raise ConfigError(f"expected a CacheConfig, got {config!r}")
        self.config = config
        try:
            self._table = CellTable(config)
        except MemoryError:
            raise AllocationError(
                f"could not allocate the cell table of {config.capacity} cells and "
                f"{config.max_seqs} ids; lower capacity or max_seqs"
            ) from None
        self._pool = KVPool(config, allocator)
        self._declared: np.ndarray | None = None  # the pending declaration
        self._step: Step | None = None  # the last prepared step, until it goes stale
        self._written: set[int] = set()  # layers written in that step
        self._seq_cells: tuple = (None, {})  # (step, its sequences' cells in position order)

    # -- table verbs (docs/contract.md §2) -------------------------------------

    @locked
    def seq_new(self) -> int:
        """Reserves the lowest free sequence id; the sequence is live and empty."""
        return self._notify("seq_new", result=self._table.seq_new())

    @locked
    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence sharing `src`'s cells with position < upto (default pos(src))."""
        return self._table_changed("seq_clone", self._table.seq_clone(src, upto))

    @locked
    def seq_rm(self, seq: int) -> None:
        """Releases `seq`: clears its bit everywhere and frees the cells left unowned."""
        self._table.seq_rm(seq)
        self._table_changed("seq_rm")

    @locked
    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id stays live."""
        self._table.rewind(seq, position)
        self._table_changed("rewind")

    @locked
    def clear(self) -> None:
        """Frees every cell and id and drops the step; the pool keeps its storage."""
        self._table.clear()
        self._table_changed("clear")

    # -- saved sequences (docs/contract.md §13) --------------------------------

    @locked
    def seq_save(self, seq: int, start: int = 0) -> SeqState:
        """`seq`'s positions start .. pos(seq)-1 and their K/V in every layer, as stored."""
        seq = self._table.check_live(seq)
        start = check_start(start, self._table.length(seq), seq)
        return saved.save(self.config, self._pool, self._table.cells_of(seq)[start:], start)

    @locked
    def seq_load(self, state: SeqState, onto: int | None = None, convert: bool = False) -> int:
        """A new sequence holding `state`'s positions and K/V: empty, or for a state saved
        from `start` > 0, a clone of `onto`'s first `start` positions. The state's tokens
        are placed as one step's tokens would be (the lowest free cells; the pool grows
        first), then its entries copied in, or re-stored in this cache's formats for the
        layers `convert=True` lets differ (float states only). Refused with nothing changed:
        another geometry (ConfigError), too few cells or ids (CapacityError), a bad `onto`
        (SequenceError)."""
        convert = load_plan(state, self.config, convert)
        table = self._table
        onto = None if onto is None else table.check_live(onto)
        check_onto(onto, 0 if onto is None else table.length(onto), state.start)
        check_room(state, self.config, table.free_cells, table.live)
        n = state.n_tokens
        cells = table.find_cells(n)
        self._pool.grow_to(min(self.config.capacity, table.read_len + n), table.read_len)
        seq = table.seq_new() if onto is None else table.seq_clone(onto, state.start)
        if n:
            seq_ids = np.full(n, seq, dtype=np.int32)
            table.claim(cells, table.positions_of(seq_ids), seq_ids)
            saved.load(self._pool, cells, state, convert)
        return self._table_changed("seq_load", seq)

    # -- the step (docs/contract.md §3) ----------------------------------------

    @locked
    def declare_step(self, seq_ids) -> None:
        """Records the next step's tokens: one live sequence id per token, in order."""
        self._declared = check_declaration(self._table, self.config, seq_ids)
        self._expire_step()
        self._notify("declare_step")

    @locked
    def prepare_step(self, width: int | None = None) -> Step:
        """Grows the pool and places the declared tokens; the step's masks are computed when
        first read (`Step.mask`, masked or gathered attention).

        width : rows of the step, default the declared count; a larger width pads
                (padded rows get cell, position and sequence -1 and an all-zero mask row)

        Declaring [a, a, b] on an empty cache gives cells [0, 1, 2], positions [0, 1, 0]
        and, for every window W != 1, the mask (rows tokens, columns cells)

            a@0  1 0 0
            a@1  1 1 0
            b@0  0 0 1

        docs/contract.md §3 in order: check the declaration (again: a verb may have run
        since) and the width; find the cells (pure); grow the pool as far as placement can
        reach; claim the cells. A refused call changes nothing and keeps the declaration.
        """
        if self._declared is None:
            raise StepError(
                "prepare_step() with nothing declared; call declare_step(seq_ids) first"
            )
        seq_ids = check_declaration(self._table, self.config, self._declared)
        n = len(seq_ids)
        width = check_width(width, n, self.config.max_width)
        table = self._table
        positions = table.positions_of(seq_ids)
        cells = table.find_cells(n)
        self._pool.grow_to(min(self.config.capacity, table.read_len + n), table.read_len)
        table.claim(cells, positions, seq_ids)
        padding = np.full(width - n, -1, dtype=np.int32)
        cells, positions, seq_ids = (
            np.concatenate([x, padding]) for x in (cells, positions, seq_ids)
        )
        pos, owners = table.pos[: table.read_len], table.owners[: table.read_len]
        self._declared = None
        self._expire_step()
        windows = self.config.distinct_windows
        self._step = Step(cells, positions, seq_ids, table.read_len, pos, owners, windows)
        return self._notify("prepare_step", self._step, self._step)

    # -- K/V (docs/contract.md §5) ---------------------------------------------

    @locked
    def write(self, layer: int, k, v) -> None:
        """Writes the step's K and V rows into their cells of `layer`: rounded to float32,
        then stored in the layer's formats (docs/contract.md §4.1).

        k, v : [width, n_kv_heads, head_dim], any real float dtype (`arrays.host_floats`);
               padded rows are skipped. Both are checked before either is written.
        """
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        k, v = host_floats("k", k), host_floats("v", v)
        check_shape("k", k.shape, shape)
        check_shape("v", v.shape, shape)
        cells = step.cells
        real = cells >= 0
        k, v = (np.asarray(x[real], dtype=np.float32) for x in (k, v))
        self._pool.write(layer, cells[real], k, v)
        self._written.add(layer)

    @locked
    def attend(
        self, layer: int, q, scale: float | None = None, mode: str = "gathered", *, out=None
    ) -> np.ndarray:
        """[width, n_heads, head_dim] float32: each token's attention over the cells it sees;
        a CPU torch tensor in q's dtype when q is one (`numbakv.core.arrays`), `out` when given.

        q     : [width, n_heads, head_dim], n_heads a multiple of n_kv_heads; query head h
                reads KV head h // (n_heads // n_kv_heads)
        scale : a finite positive real, default 1 / sqrt(head_dim)
        mode  : "gathered" or "masked", the device's two kernels. "gathered" reads each
                token's own cells of its window in position order (`CellTable.cells_of`
                once per distinct sequence, `attention.attend_gathered`) and computes no
                mask; "masked" reads the cells of the window's mask row (`Step.mask`,
                `attention.attend_cells`). The same cells, so the same result up to float32
                summation order.
        out   : None, or a writable host float array (NumPy, a CPU torch tensor) of q's
                shape that receives the float32 result cast to its dtype

        softmax(q·K[c]ᵀ·scale) · V[c] over the cells the layer's window lets a token see
        (the mask rule of docs/contract.md §3), in float32;
        rows that see no cell (padding) give 0; NaN and inf in what a token sees follow
        float32 arithmetic (`attention.softmax_attend`). Requires `write(layer, ...)` in
        this step.
        """
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        check_mode(mode)
        if layer not in self._written:
            raise StepError(
                f"attend({layer}) before write({layer}) in this step; write the step's K/V first"
            )
        caller, q = q, host_floats("q", q)
        check_query(q.shape, step.width, self.config)
        scale = check_scale(scale, self.config.head_dim)
        if out is not None:
            out = arrays.check_host_out(out, q.shape)
        result = self._attend(layer, q.astype(np.float32), scale, mode)
        return arrays.host_result(caller, result) if out is None else arrays.write_into(out, result)

    def _attend(self, layer: int, q: np.ndarray, scale: float, mode: str) -> np.ndarray:
        """The checked call's result, [width, n_heads, head_dim] float32."""
        step = self._step
        window = self.config.windows[layer]
        k, v = self._pool.k[layer], self._pool.v[layer]
        (k_dtype, v_dtype), scales = self.config.formats[layer], self._pool.scales(layer)
        read = (k_dtype, v_dtype, scales)
        if mode == "masked":
            return attend_cells(q, k, v, step.mask(window), scale, *read)
        seq_ids, positions = step.seq_ids, step.positions
        if self._seq_cells[0] is not step:  # once per step, as the masks: every layer reads it
            cells = {seq: self._table.cells_of(seq) for seq in set(seq_ids.tolist()) - {-1}}
            self._seq_cells = step, cells
        seq_cells = self._seq_cells[1]
        return attend_gathered(q, k, v, seq_cells, seq_ids, positions, window, scale, *read)

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

    @locked
    def snapshot(self) -> Snapshot:
        """A host copy of the cell table, cells [0, read_len)."""
        return self._table.snapshot(self._pool.rows)

    @locked
    def cells_state(self, cells) -> tuple[np.ndarray, np.ndarray]:
        """([n] int32 pos, [n, n_owner_words] uint64 owners) of `cells` ([n] ints in [0,
        capacity); ConfigError otherwise), copies: what a `Recorder` reads of the cells a
        verb touched (`touched_cells`)."""
        cells = check_cells(cells, self.config.capacity)
        # np.take gathers rows several times faster than owners[cells] does
        return self._table.pos[cells], np.take(self._table.owners, cells, axis=0)

    @locked
    def check_invariants(self) -> None:
        """Raises AssertionError unless the table keeps the invariants of docs/contract.md §2."""
        self._table.check_invariants()

    @locked
    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `layer`'s K and V: [rows, n_kv_heads, head_dim] of the storage
        dtype (uint16 bit patterns for bfloat16)."""
        layer = check_layer(layer, self.config.n_layers)
        return self._pool.k[layer].copy(), self._pool.v[layer].copy()

    # -- helpers ---------------------------------------------------------------

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
        self._seq_cells = (None, {})
