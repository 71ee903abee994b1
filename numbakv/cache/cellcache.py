"""`CellCache` on the device: docs/contract.md §2-§8 with a fast host table, the KV pool and
step buffers on the device, and numba.cuda kernels for placement, the table mirror, masks
and attention.
"""

from collections.abc import Callable

import numpy as np

from numbakv.cache.bindings import Bindings, check_bindings
from numbakv.cache.buffers import StepBuffers
from numbakv.cache.cuda import cuda
from numbakv.cache.graph import Captures, StepGraph, not_while_capturing
from numbakv.cache.inspection import Inspector
from numbakv.cache.kernels import attention, seq_cells, verbs
from numbakv.cache.lending import Lender
from numbakv.cache.plans import Plans
from numbakv.cache.pool import ALLOCATION_ERRORS, Allocator, DevicePool, device_allocator
from numbakv.cache.saving import Saver
from numbakv.cache.step import Progress, Step
from numbakv.cache.stepping import Stepper
from numbakv.cache.streams import Streams
from numbakv.cache.table import HostTable
from numbakv.core.config import CacheConfig
from numbakv.core.errors import AllocationError, ConfigError
from numbakv.core.observe import Observable, check_cells, locked
from numbakv.core.seq_state import SeqState
from numbakv.core.snapshot import Snapshot


class CellCache(Observable):
    """Several sequences sharing one pool of per-token cells, K/V on the device.

    The same API, placement and errors as `numbakv.reference.CellCache`, which is written
    independently and is the oracle the differential tests hold this to. Every verb is
    atomic (when it raises, nothing changed) and every verb but `seq_new` makes the last
    `Step` stale. Per step only the step's [width] arrays cross the bus: the table's mirror
    on the device is kept by kernels, never copied over. Observers (`add_observer`) hear of
    every verb that succeeded. Every verb that changes the table (all but `seq_new` and
    `declare_step`) drops a pending declaration. Thread-safe: every verb, step call, write,
    attend and state query holds one reentrant lock (`lock`).

    On the device a step is one upload and one launch to prepare, then per layer one
    scatter and one or two attention launches, all on the step's stream (`prepare_step`);
    with device inputs and `out=` nothing in a step allocates, copies or synchronizes.

    It owns the table, pool, buffers, streams, plans and lender, and collaborators given what
    each reads: the `Stepper` (step calls), the `Inspector` (bindings, host copies),
    `Captures` and the `Saver` (seq_save, seq_load); its methods lock, refuse and notify.
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
            self._streams = Streams()
        except ALLOCATION_ERRORS as error:
            sizes = config.device_bytes()
            fixed = sizes["total"] - sizes["pool"]
            raise AllocationError(
                f"could not allocate the table and the fixed buffers ({fixed:,} bytes, see "
                "CacheConfig.device_bytes()); lower capacity or max_seqs, or max_seq_len"
            ) from error
        self._pool = DevicePool(config, allocator)
        self._plans = Plans(config, self._pool.kinds)
        self._lender = Lender(config.max_width)  # attend's default out, host inputs' uploads
        table, pool, buffers, streams = self._table, self._pool, self._buffers, self._streams
        self._inspector = Inspector(config, table, pool, buffers, self._plans, streams)
        progress = Progress()
        self._captures = Captures(progress, self._inspector.bindings, self._lock)
        self._stepper = Stepper(config, table, pool, self._plans, buffers, streams, self._lender,
                                progress, self._captures.active, self._lock)  # fmt: skip
        self._saver = Saver(config, table, pool, buffers, streams)

    # -- table verbs: the host table decides, a kernel updates the mirror ------

    @locked
    @not_while_capturing
    def seq_new(self) -> int:
        """Reserves the lowest free sequence id; the sequence is live and empty."""
        return self._notify("seq_new", result=self._table.seq_new())

    @locked
    @not_while_capturing
    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence sharing `src`'s cells with position < upto (default pos(src))."""
        src = self._table.check_live(src)
        seq, cells = self._table.seq_clone(src, upto)
        b, stream = self._buffers, self._streams.current
        verbs.launch_add_owner(_to_device(cells, stream), len(cells), seq, b.cell_owners, stream)
        seq_cells.launch_copy_prefix(b.seq_cells, b.seq_len, src, seq, len(cells), stream)
        return self._table_changed("seq_clone", seq)

    @locked
    @not_while_capturing
    def seq_rm(self, seq: int) -> None:
        """Releases `seq`: clears its bit everywhere and frees the cells left unowned."""
        seq = self._table.check_live(seq)
        self._drop(seq, self._table.seq_rm(seq), length=0)
        self._table_changed("seq_rm")

    @locked
    @not_while_capturing
    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id stays live."""
        seq = self._table.check_live(seq)
        self._drop(seq, self._table.rewind(seq, position), length=self._table.length(seq))
        self._table_changed("rewind")

    @locked
    @not_while_capturing
    def clear(self) -> None:
        """Frees every cell and id and drops the step; the pool keeps its storage."""
        self._table.clear()
        b, stream = self._buffers, self._streams.current
        verbs.launch_clear_table(b.cell_pos, b.cell_owners, stream)
        seq_cells.launch_clear_lengths(b.seq_len, stream)
        self._table_changed("clear")

    def _drop(self, seq: int, cells: np.ndarray, length: int) -> None:
        """Mirrors a seq_rm or rewind: `seq` leaves `cells`, and holds `length` positions."""
        b, stream = self._buffers, self._streams.current
        if len(cells):
            verbs.launch_drop_owner(
                _to_device(cells, stream), len(cells), seq, b.cell_pos, b.cell_owners, stream
            )
        seq_cells.launch_set_length(b.seq_len, seq, length, stream)

    # -- the step (docs/contract.md §3) ----------------------------------------

    @locked
    @not_while_capturing
    def declare_step(self, seq_ids) -> None:
        """Records the next step's tokens: one live sequence id per token, in order."""
        self._stepper.declare(seq_ids)
        self._notify("declare_step")

    @locked
    @not_while_capturing
    def prepare_step(self, width: int | None = None, *, stream=None) -> Step:
        """Grows the pool, places the declared tokens and uploads the step buffer.

        width  : rows of the step, default the declared count; a larger width pads
                 (cell, position and sequence -1, an all-zero mask row)
        stream : the step's stream: a numba stream, an object with `__cuda_stream__`
                 (torch.cuda.Stream, cupy.cuda.Stream) or a raw handle; default a stream
                 the cache owns. Every device operation of the step runs on it (the upload,
                 the preparation launch, each layer's write and attend) and the cache's
                 later verbs too; a new stream first waits for the work queued on the last.

        In order: check the width; grow the pool to min(capacity, read_len + n), the
        furthest lowest-free placement can reach, so that a refused allocation leaves the
        table untouched; place the tokens into a pinned staging slot; one asynchronous copy
        of the step buffer; one launch that writes the tokens into the table mirror and
        seq_cells. Masks are written later, once, by the first masked `attend` or
        `Step.mask` of the step. A refused call keeps the declaration.
        """
        step = self._stepper.prepare(width, stream)
        return self._notify("prepare_step", step, step)

    @locked
    @not_while_capturing
    def reserve(self, n_heads: int) -> None:
        """Makes now what attention with `n_heads` query heads (a positive multiple of
        n_kv_heads) allocates once: the decode kernels' split workspace, on the stream in
        use. Otherwise the first decode-shaped `attend` with them makes it; reserve first
        when no step may allocate (a step to be captured)."""
        self._stepper.reserve(n_heads)

    # -- K/V -------------------------------------------------------------------

    @locked
    def write(self, layer: int, k, v) -> None:
        """Writes the step's K and V rows into their cells of `layer`, in the layer's storage
        formats, on the step's stream.

        k, v : [width, n_kv_heads, head_dim]: host arrays of any real float dtype (rounded to
               float32 unless both are float32 or both float16), or device tensors (numba
               arrays, DLPack exports, `__cuda_array_interface__`: `inputs`) of float32,
               float16 or bfloat16 (DLPack), one dtype for both, read in place through their
               strides on the step's stream (the caller orders their producer before it; the
               last axis contiguous, e.g. views into a fused QKV output). Stored in the
               layer's formats (docs/contract.md §4.1). Both are checked before either is
               written. Padded rows are skipped.
        """
        self._stepper.write(layer, k, v)

    @locked
    def attend(self, layer: int, q, scale: float | None = None, mode: str = "gathered", *,
               out=None):  # fmt: skip
        """[width, n_heads, head_dim] float32 device array: each token's attention over the
        cells it sees, computed on the device on the step's stream.

        q     : [width, n_heads, head_dim], n_heads a multiple of n_kv_heads (query head h
                reads KV head h // (n_heads // n_kv_heads)): a host array of any real float
                dtype (rounded to float32) or a float32, float16 or bfloat16 (DLPack) device
                tensor, read in place through its strides (the last axis contiguous)
        scale : a finite positive real, default 1 / sqrt(head_dim)
        mode  : "gathered" (default) reads each token's own cells through seq_cells, work in
                proportion to what it sees; "masked" sweeps [0, read_len) under the window's
                mask, written by the step's first masked attend. Both
                equal the reference's attend.
        out   : a float32, float16 or bfloat16 (DLPack; rounded to nearest even) device
                tensor [width, n_heads, head_dim] to write into, strided as q may be (a numba
                view of it is returned, uint16 patterns for bfloat16); default a float32
                one lent by the cache on the step's stream (`lending`: yours until you drop
                it, then reused, allocation-free once warm), whose
                `__cuda_array_interface__` names that stream, so
                `torch.as_tensor(out, device="cuda")` or `cupy.asarray(out)` wraps it.
        Returned in the caller's kind (`numbakv.core.arrays`): a torch `out` as itself; for a
        CUDA torch q and no `out`, a new torch tensor in q's dtype on q's device that the
        kernel writes (no copy); for a CPU torch q, a CPU torch tensor in q's dtype (the
        result copied to the host, the stream synchronized); else the numba device array.
        Rows that see no cell (padding) give 0; NaN and inf in what a token sees give what
        the reference gives. Requires `write(layer, ...)` in this step. The launches are
        planned once per step shape (`Plans`) and read the step from the device.
        """
        return self._stepper.attend(layer, q, scale, mode, out)

    @locked
    def capture(self, fn: Callable[[], object], *, backend: str = "auto") -> StepGraph:
        """Runs `fn()`, the caller's work on the prepared step (its `write`/`attend` calls
        and kernels launched through numbakv's launcher), and returns it as a `StepGraph`
        bound to the step's width and to `bindings()`. The step's outputs are written as
        by an eager run.

        Inside `fn` nothing may allocate or copy: give `write` and `attend` device arrays
        and `attend` an `out=` (StepError otherwise), and `reserve(n_heads)` before the
        first capture of a decode step. Capture a step before any `write` of it, after an
        eager step of the same shape (on a GPU every kernel is then compiled and loaded
        outside the graph). The arrays `fn` passes are bound into the graph: feed a later
        step through the same arrays, then `replay()`.

        backend : "auto" (a CUDA graph on a GPU, recorded launches on the simulator),
                  "record" or "graph"
        """
        return self._captures.capture(fn, backend)

    # -- saved sequences (docs/contract.md §13) --------------------------------

    @locked
    @not_while_capturing
    def seq_save(self, seq: int, start: int = 0) -> SeqState:
        """`seq`'s positions start .. pos(seq)-1 and their K/V in every layer, as stored:
        one gather launch per layer, one copy to the host (the cache's stream, then a
        synchronization: the state is host memory)."""
        return self._saver.save(seq, start)

    @locked
    @not_while_capturing
    def seq_load(self, state: SeqState, onto: int | None = None, convert: bool = False) -> int:
        """A new sequence holding `state`'s positions and K/V: empty, or for a state saved
        from `start` > 0, a clone of `onto`'s first `start` positions. Placed as a step's
        tokens are (the lowest free cells; the pool grows first); entries copied as stored,
        or re-stored in this cache's formats for the layers `convert=True` lets differ
        (float states only). One copy to the device, one mirror launch, one scatter per
        layer. Refused with nothing changed: another geometry (ConfigError), too few cells
        or ids (CapacityError, AllocationError), a bad `onto` (SequenceError)."""
        return self._table_changed("seq_load", self._saver.load(state, onto, convert))

    def _table_changed(self, event: str, result=None):
        """After a verb that changed the table: the step expires, a pending declaration is
        dropped (it was checked against the old table), the observers hear of it."""
        self._stepper.forget()
        return self._notify(event, result=result)

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
    def buffers(self) -> StepBuffers:
        """The fixed device buffers (step buffer, masks, table mirror); they never move."""
        return self._buffers

    @property
    def stream(self):
        """The numba stream in use: the last step's, or the cache's own before any step."""
        return self._streams.current

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
    def snapshot(self) -> Snapshot:
        """A host copy of the cell table, cells [0, read_len)."""
        return self._inspector.snapshot()

    # -- bindings and host copies (`inspection`) ---------------------------------

    @locked
    def bindings(self) -> Bindings:
        """What a recorded launch or captured step depends on: the pool's generation and the
        device addresses of the K/V arrays, the fixed buffers and the decode workspaces
        (docs/contract.md §4)."""
        return self._inspector.bindings()

    @locked
    def check_bindings(self, bindings: Bindings) -> None:
        """Raises BindingError naming what moved since `bindings` were taken (the pool grew:
        re-record the step), or when they are another cache's; else returns None."""
        check_bindings(bindings, self.bindings())

    @locked
    def check_invariants(self) -> None:
        """Raises AssertionError unless the host table keeps docs/contract.md §2's
        invariants and the device mirror (cell_pos, cell_owners, each live sequence's
        seq_cells row) equals it. Copies capacity-sized arrays back: for tests and
        debugging."""
        self._inspector.check_invariants()

    @locked
    def mirror(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the device mirror: cell_pos [capacity] int32, cell_owners
        [capacity, n_owner_words] uint64. Copies capacity-sized arrays: for tests and debugging."""
        return self._inspector.mirror()

    @locked
    def seq_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the position -> cell table: seq_cells [max_seqs, max_seq_len] int32
        (entries past a length are stale) and seq_len [max_seqs] int32. For tests."""
        return self._inspector.seq_table()

    @locked
    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `layer`'s K and V as stored: [rows, n_kv_heads, row_width] in the
        layer's formats (docs/contract.md §4.1: uint16 bfloat16 patterns, uint8 blocks or
        bytes); `pool_values` gives what attention reads."""
        return self._inspector.pool_kv(layer)


def _to_device(array: np.ndarray, stream):
    return cuda.to_device(np.ascontiguousarray(array, dtype=np.int32), stream=stream)
