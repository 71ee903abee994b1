"""The device cache's steps (docs/contract.md §3): `Stepper`, which declares, prepares,
writes, attends and writes the masks, keeping the prepared step and what of it has run in
a `Progress` (`numbakv.cache.step`).

Each step call of `CellCache` is one call of its `Stepper`, under the cache's lock; the
cache refuses them inside a capture where it must and tells its observers itself.
"""

from collections.abc import Callable
from threading import RLock

import numpy as np

from numbakv.cache import inputs
from numbakv.cache.buffers import StepBuffers
from numbakv.cache.graph import not_while_capturing
from numbakv.cache.inspection import to_host
from numbakv.cache.kernels import attention, masks, placement, storage
from numbakv.cache.kernels.step_buffer import READ_LEN, SCALARS, WIDTH
from numbakv.cache.lending import Lender
from numbakv.cache.plans import Plans
from numbakv.cache.pool import DevicePool
from numbakv.cache.step import Progress, Step
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
from numbakv.core.errors import AllocationError, StepError
from numbakv.core.observe import locked
from numbakv.core.values import as_int, check_shape


class Stepper:
    """The device cache's step calls (`CellCache.declare_step`, `prepare_step`, `reserve`,
    `write`, `attend`, `Step.mask`).

    Owns the pending declaration; keeps the step's `progress` (shared with `Captures`).
    Reads the config, the host table (placement), the pool (grown for a step, written and
    read per layer), the plans and their workspaces, the fixed buffers, the streams (a step
    switches them), the lender (host inputs' uploads, attend's default out) and
    `captures_active`, which says whether the cache is capturing (`Captures.active`). `lock`
    is the cache's: a `Step` reads its masks through `read_mask`, outside any other call.
    """

    def __init__(self, config: CacheConfig, table: HostTable, pool: DevicePool, plans: Plans,
                 buffers: StepBuffers, streams: Streams, lender: Lender, progress: Progress,
                 captures_active: Callable[[], bool], lock: RLock):  # fmt: skip
        self._config, self._table, self._pool, self._plans = config, table, pool, plans
        self._buffers, self._streams, self._lender = buffers, streams, lender
        self.progress, self._captures_active, self._lock = progress, captures_active, lock
        self._declared: np.ndarray | None = None

    def declare(self, seq_ids) -> None:
        """Checks and records the next step's sequence ids; the prepared step expires."""
        self._declared = check_declaration(self._table, self._config, seq_ids)
        self.progress.restart()

    def forget(self) -> None:
        """After a verb that changed the table: the declaration (checked against the old
        table) is dropped and the step expires."""
        self._declared = None
        self.progress.restart()

    def prepare(self, width: int | None, stream) -> Step:
        """`CellCache.prepare_step(width, stream=stream)`: the new prepared step."""
        if self._declared is None:
            raise StepError(
                "prepare_step() with nothing declared; call declare_step(seq_ids) first"
            )
        seq_ids = self._declared  # checked by declare; any verb since dropped it
        n = len(seq_ids)
        config, table = self._config, self._table
        width = check_width(width, n, config.max_width)
        previous = self._streams.current
        stream = self._streams.use(stream)
        read_len = table.read_len
        try:
            self._pool.grow_to(min(config.capacity, read_len + n), read_len, stream)
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
        step = Step(staged, width, n, read_len, b, stream, self.read_mask)
        self.progress.restart(step)
        return step

    @locked
    @not_while_capturing
    def read_mask(self, window: int) -> np.ndarray:
        """The current step's [width, read_len] mask of `window`, a host copy (the masks are
        written first if the step has not yet)."""
        self._write_masks()
        step = self.progress.current()
        (mask,) = to_host(self._streams.current, self._buffers.masks[window][: step.width])
        return mask[:, : step.read_len]

    def _write_masks(self) -> None:
        """Writes every window's mask for the current step (one launch) unless it did."""
        if not self.progress.masked:
            b, step = self._buffers, self.progress.current()
            masks.launch_write_masks(
                b.mask_stack, b.windows, b.cell_pos, b.cell_owners, b.step, step.width,
                step.stream,
            )  # fmt: skip
            self.progress.masked = True

    def reserve(self, n_heads: int) -> None:
        """`CellCache.reserve(n_heads)`: the decode workspace of `n_heads`, made now."""
        n_heads = as_int("n_heads", n_heads, StepError)
        if n_heads < 1 or n_heads % self._config.n_kv_heads:
            raise StepError(
                f"n_heads={n_heads} is not a positive multiple of "
                f"n_kv_heads={self._config.n_kv_heads}"
            )
        self._plans.workspace(n_heads, self._streams.current)

    def write(self, layer: int, k, v) -> None:
        """`CellCache.write(layer, k, v)`."""
        step = self.progress.current()
        config = self._config
        layer = check_layer(layer, config.n_layers)
        shape = (step.width, config.n_kv_heads, config.head_dim)
        k, v = (inputs.floats(name, x, inputs.KV_DTYPES) for name, x in (("k", k), ("v", v)))
        check_shape("k", k.shape, shape)
        check_shape("v", v.shape, shape)
        k, v = inputs.on_device(
            [k, v], inputs.KV_DTYPES, step.stream, self._lender, self._captures_active()
        )
        pool = self._pool
        placement.launch_scatter_kv(
            k, v, pool.k[layer], pool.v[layer], self._buffers.step, step.width, step.stream,
            kinds=pool.kinds[layer], kv_scales=pool.scales[layer],
        )  # fmt: skip
        self.progress.written.add(layer)

    def attend(self, layer: int, q, scale: float | None, mode: str, out):
        """`CellCache.attend(layer, q, scale, mode, out=out)`."""
        step = self.progress.current()
        config = self._config
        layer = check_layer(layer, config.n_layers)
        check_mode(mode)
        if layer not in self.progress.written:
            raise StepError(
                f"attend({layer}) before write({layer}) in this step; write the step's K/V first"
            )
        caller, given = q, out
        q = inputs.floats("q", q, inputs.Q_DTYPES)
        n_heads = check_query(q.shape, step.width, config)
        scale = check_scale(scale, config.head_dim)
        capturing = self._captures_active()
        if out is None and arrays.is_cuda_tensor(caller) and not capturing:
            given = out = caller.new_empty(tuple(caller.shape))  # q's dtype, q's device
        out = inputs.output(out, q.shape, step.stream, self._lender, capturing)
        (q,) = inputs.on_device([q], inputs.Q_DTYPES, step.stream, self._lender, capturing)
        window = config.windows[layer]
        io = (storage.io_kind(q.dtype), storage.io_kind(out.dtype))
        pool = self._pool
        k_pool, v_pool = pool.k[layer], pool.v[layer]
        is_wide = attention.pools_are_wide(self._plans.kinds[layer], config.head_dim,
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
