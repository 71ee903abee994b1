"""`CellCache` on the device: docs/contract.md §2-§8 with a fast host table, the KV pool and
step buffers on the device, and numba.cuda kernels for placement, the table mirror, masks
and attention.
"""

import numpy as np

from numbakv.cache import inputs
from numbakv.cache.buffers import StepBuffers
from numbakv.cache.cuda import cuda
from numbakv.cache.graph import Capture, not_while_capturing
from numbakv.cache.inspection import Inspection
from numbakv.cache.kernels import attention, masks, placement, seq_cells, storage, verbs
from numbakv.cache.kernels.step_buffer import READ_LEN, SCALARS, WIDTH
from numbakv.cache.lending import Lender
from numbakv.cache.plans import Plans
from numbakv.cache.pool import ALLOCATION_ERRORS, Allocator, DevicePool, device_allocator
from numbakv.cache.saving import Saving
from numbakv.cache.step import Step
from numbakv.cache.streams import Streams
from numbakv.cache.table import HostTable
from numbakv.core import arrays
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
from numbakv.core.observe import Observable, locked
from numbakv.core.snapshot import Snapshot
from numbakv.core.values import as_int, check_shape


class CellCache(Observable, Inspection, Capture, Saving):
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
        self._declared: np.ndarray | None = None
        self._step: Step | None = None
        self._written: set[int] = set()  # layers written in this step
        self._masked = False  # whether this step has written its masks

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
        self._declared = check_declaration(self._table, self.config, seq_ids)
        self._expire_step()
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
        if self._declared is None:
            raise StepError(
                "prepare_step() with nothing declared; call declare_step(seq_ids) first"
            )
        seq_ids = self._declared  # checked by declare_step; any verb since dropped it
        n = len(seq_ids)
        width = check_width(width, n, self.config.max_width)
        previous = self._streams.current
        stream = self._streams.use(stream)
        table = self._table
        read_len = table.read_len
        try:
            self._pool.grow_to(min(self.config.capacity, read_len + n), read_len, stream)
        except AllocationError:
            self._streams.use(previous)
            raise
        b = self._buffers
        staged = b.stage()
        table.place(seq_ids, staged)  # its rows 0, 1, 2 of [0, n): CELLS, POSITIONS, SEQ_IDS
        if width > n:
            staged[:SCALARS, n:width] = -1
        read_len = table.read_len
        staged[SCALARS, WIDTH] = width
        staged[SCALARS, READ_LEN] = read_len
        b.upload(stream)
        placement.launch_prepare_tokens(
            b.step, width, b.cell_pos, b.cell_owners, b.seq_cells, b.seq_len, stream
        )
        self._declared = None
        self._expire_step()
        self._step = Step(staged, width, n, read_len, b, stream, self._read_mask)
        return self._notify("prepare_step", self._step, self._step)

    @locked
    @not_while_capturing
    def reserve(self, n_heads: int) -> None:
        """Makes now what attention with `n_heads` query heads (a positive multiple of
        n_kv_heads) allocates once: the decode kernels' split workspace, on the stream in
        use. Otherwise the first decode-shaped `attend` with them makes it; reserve first
        when no step may allocate (a step to be captured)."""
        n_heads = as_int("n_heads", n_heads, StepError)
        if n_heads < 1 or n_heads % self.config.n_kv_heads:
            raise StepError(
                f"n_heads={n_heads} is not a positive multiple of "
                f"n_kv_heads={self.config.n_kv_heads}"
            )
        self._plans.workspace(n_heads, self._streams.current)

    @locked
    @not_while_capturing
    def _read_mask(self, window: int) -> np.ndarray:
        """The current step's [width, read_len] mask of `window`, a host copy (the masks are
        written first if the step has not yet)."""
        self._write_masks()
        step = self._current_step()
        (mask,) = self._to_host(self._buffers.masks[window][: step.width])
        return mask[:, : step.read_len]

    @locked
    def _write_masks(self) -> None:
        """Writes every window's mask for the current step (one launch) unless it did."""
        if not self._masked:
            b, step = self._buffers, self._current_step()
            masks.launch_write_masks(
                b.mask_stack, b.windows, b.cell_pos, b.cell_owners, b.step, step.width,
                step.stream,
            )  # fmt: skip
            self._masked = True

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
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        k, v = (inputs.floats(name, x, inputs.KV_DTYPES) for name, x in (("k", k), ("v", v)))
        check_shape("k", k.shape, shape)
        check_shape("v", v.shape, shape)
        k, v = inputs.on_device(
            [k, v], inputs.KV_DTYPES, step.stream, self._lender, self._in_capture()
        )
        pool = self._pool
        placement.launch_scatter_kv(
            k, v, pool.k[layer], pool.v[layer], self._buffers.step, step.width, step.stream,
            kinds=pool.kinds[layer], kv_scales=pool.scales[layer],
        )  # fmt: skip
        self._written.add(layer)

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
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        check_mode(mode)
        if layer not in self._written:
            raise StepError(
                f"attend({layer}) before write({layer}) in this step; write the step's K/V first"
            )
        caller, given = q, out
        q = inputs.floats("q", q, inputs.Q_DTYPES)
        n_heads = check_query(q.shape, step.width, self.config)
        scale = check_scale(scale, self.config.head_dim)
        capturing = self._in_capture()
        if out is None and arrays.is_cuda_tensor(caller) and not capturing:
            given = out = caller.new_empty(tuple(caller.shape))  # q's dtype, q's device
        out = inputs.output(out, q.shape, step.stream, self._lender, capturing)
        (q,) = inputs.on_device([q], inputs.Q_DTYPES, step.stream, self._lender, capturing)
        window = self.config.windows[layer]
        io = (storage.io_kind(q.dtype), storage.io_kind(out.dtype))
        pool = self._pool
        k_pool, v_pool = pool.k[layer], pool.v[layer]
        is_wide = attention.pools_are_wide(self._plans.kinds[layer], self.config.head_dim,
                                           k_pool, v_pool)  # fmt: skip
        plan = self._plans.plan(mode, step.width, n_heads, layer, io, is_wide)
        b = self._buffers
        if mode == "masked":
            self._write_masks()
            view = (b.masks[window],)
        else:
            view = (b.seq_cells, np.int32(window))
        workspace = None
        if plan.is_decode:
            workspace = self._plans.workspace(n_heads, step.stream, capturing)
        attention.run_attention(
            plan, q, k_pool, v_pool, pool.scales[layer], b.step, view,
            np.float32(scale), out, workspace, step.stream,
        )  # fmt: skip
        return arrays.returned(caller, given, out, step.stream)

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
        self._masked = False

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

    @locked
    def snapshot(self) -> Snapshot:
        """A host copy of the cell table, cells [0, read_len)."""
        return self._table.snapshot(self._pool.rows)


def _to_device(array: np.ndarray, stream):
    return cuda.to_device(np.ascontiguousarray(array, dtype=np.int32), stream=stream)
