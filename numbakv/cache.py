"""`CellCache` on the device: the contract of `numbakv.reference.CellCache` (SPEC §2-§8)
with a fast host table, the KV pool and step buffers on the device, and numba.cuda
kernels for placement, the table mirror and the masks.
"""

import numpy as np

from numbakv.base import CacheBase
from numbakv.checks import check_layer, check_shape
from numbakv.config import CacheConfig
from numbakv.device import cuda
from numbakv.errors import StepError
from numbakv.kernels import attention, masks, placement, seq_cells, verbs
from numbakv.pool import DevicePool, device_allocator
from numbakv.reference.attention import default_scale
from numbakv.reference.pool import Allocator
from numbakv.step import Step, StepBuffers
from numbakv.table import HostTable

INPUT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))


class CellCache(CacheBase):
    """Several sequences sharing one pool of per-token cells, K/V on the device.

    The same API, placement and errors as `numbakv.reference.CellCache` (see its
    docstring for a worked step); every verb is atomic and every verb but `seq_new`
    makes the last `Step` stale. Per step only the step's small arrays cross the bus:
    the table's mirror on the device is kept by kernels, never copied over.
    """

    def __init__(self, config: CacheConfig, allocator: Allocator = device_allocator):
        super().__init__(config, HostTable(config), DevicePool(config, allocator))
        self._buffers = StepBuffers(config)
        self._workspaces: dict[int, tuple] = {}  # n_heads -> decode split scratch, reused

    # -- table verbs: the host table decides, a kernel updates the mirror ------

    def seq_new(self) -> int:
        """Reserves the lowest free sequence id; the sequence is live and empty."""
        seq = self._table.seq_new()
        self._notify("seq_new")
        return seq

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence sharing `src`'s cells with position < upto (default pos(src))."""
        seq, cells = self._table.seq_clone(src, upto)
        b = self._buffers
        verbs.launch_add_owner(_to_device(cells), len(cells), seq, b.cell_owners)
        seq_cells.launch_copy_prefix(b.seq_cells, b.seq_len, src, seq, len(cells))
        return self._after("seq_clone", seq)

    def seq_rm(self, seq: int) -> None:
        """Releases `seq`: clears its bit everywhere and frees the cells left unowned."""
        seq = self._table.check_live(seq)
        self._drop(seq, self._table.seq_rm(seq), length=0)
        self._after("seq_rm")

    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id stays live."""
        seq = self._table.check_live(seq)
        self._drop(seq, self._table.rewind(seq, position), length=self._table.length(seq))
        self._after("rewind")

    def clear(self) -> None:
        """Frees every cell and id and drops the step; the pool keeps its storage."""
        self._table.clear()
        verbs.launch_clear_table(self._buffers.cell_pos, self._buffers.cell_owners)
        seq_cells.launch_clear_lengths(self._buffers.seq_len)
        self._declared = None
        self._after("clear")

    def _drop(self, seq: int, cells: np.ndarray, length: int) -> None:
        """Mirrors a seq_rm or rewind: `seq` leaves `cells`, and holds `length` positions."""
        b = self._buffers
        if len(cells):
            verbs.launch_drop_owner(_to_device(cells), len(cells), seq, b.cell_pos, b.cell_owners)
        seq_cells.launch_set_length(b.seq_len, seq, length)

    # -- the step (SPEC §3) ----------------------------------------------------

    def prepare_step(self, width: int | None = None) -> Step:
        """Grows the pool, places the declared tokens and writes the step buffers and masks.

        width : rows of the step, default the declared count; a larger width pads
        (cell, position and sequence -1, an all-zero mask row). Uploads only the step's
        [width] arrays and read_len; kernels update the mirror and write the masks.
        """
        cells, positions, seq_ids = self._place(width)
        read_len = self._table.read_len
        self._write_step(cells, positions, seq_ids, read_len)
        return self._prepared(Step(cells, positions, seq_ids, read_len, self._buffers))

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

    def write(self, layer: int, k, v) -> None:
        """Writes the step's K and V rows into their cells of `layer`, cast to the storage dtype.

        k, v : [width, n_kv_heads, head_dim] float32 or float16, NumPy or device arrays;
               other float dtypes are cast to float32 on the host. Padded rows are skipped.
        """
        step = self._current_step()
        layer = check_layer(layer, self.config.n_layers)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        check_shape("k", np.shape(k), shape)
        check_shape("v", np.shape(v), shape)
        k, v = _device_input(k), _device_input(v)
        b = self._buffers
        placement.launch_scatter_kv(
            k, v, self._pool.k[layer], self._pool.v[layer], b.cells, step.width
        )
        self._written.add(layer)

    def attend(self, layer: int, q, scale: float | None = None, mode: str = "gathered"):
        """[width, n_heads, head_dim] float32 device array: each token's attention over the
        cells it sees, computed on the device.

        q     : [width, n_heads, head_dim] float32 (NumPy or device), n_heads a multiple of
                n_kv_heads; query head h reads KV head h // (n_heads // n_kv_heads)
        scale : default 1 / sqrt(head_dim)
        mode  : "gathered" (default) reads each token's own cells through seq_cells, work in
                proportion to what it sees; "masked" sweeps [0, read_len) under the window's
                mask (the seed design). Both equal the reference's attend.
        Rows that see no cell (padding) give 0. Requires `write(layer, ...)` in this step.
        """
        step, layer = self._attend_step(layer, np.shape(q), mode)
        q = _device_input(q, np.float32)
        scale = default_scale(self.config.head_dim) if scale is None else np.float32(scale)
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

    # -- state -----------------------------------------------------------------

    @property
    def buffers(self) -> StepBuffers:
        """The fixed device buffers (step arrays, masks, table mirror); they never move."""
        return self._buffers

    def mirror(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the device mirror: cell_pos [capacity] int32, cell_owners
        [capacity, n_owner_words] uint64. Copies capacity-sized arrays: for tests and debugging."""
        return self._buffers.cell_pos.copy_to_host(), self._buffers.cell_owners.copy_to_host()

    def seq_table(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the position -> cell table: seq_cells [max_seqs, max_seq_len] int32
        (entries past a length are stale) and seq_len [max_seqs] int32. For tests."""
        return self._buffers.seq_cells.copy_to_host(), self._buffers.seq_len.copy_to_host()

    def pool_kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `layer`'s K and V: [rows, n_kv_heads, head_dim], storage dtype."""
        layer = check_layer(layer, self.config.n_layers)
        if self._pool.rows == 0:
            empty = np.zeros((0, self.config.n_kv_heads, self.config.head_dim), self.config.dtype)
            return empty, empty.copy()
        return self._pool.k[layer].copy_to_host(), self._pool.v[layer].copy_to_host()


def _to_device(array: np.ndarray):
    return cuda.to_device(np.ascontiguousarray(array, dtype=np.int32))


def _device_input(x, *dtypes):
    """A C-contiguous device array of one of `dtypes` (default float32 or float16) for x:
    NumPy arrays are cast to float32 where needed and uploaded; device arrays (anything
    with `__cuda_array_interface__`) are used in place and must have such a dtype."""
    dtypes = tuple(np.dtype(d) for d in dtypes) or INPUT_DTYPES
    if hasattr(x, "__cuda_array_interface__") and not hasattr(x, "copy_to_host"):
        x = cuda.as_cuda_array(x)
    if hasattr(x, "copy_to_host"):
        if np.dtype(x.dtype) not in dtypes:
            raise StepError(f"device array of dtype {x.dtype}; give one of {dtypes}")
        return x
    x = np.asarray(x)
    if x.dtype not in dtypes:
        x = x.astype(np.float32)
    return cuda.to_device(np.ascontiguousarray(x))
