"""`Saver`: `seq_save` and `seq_load` of the device cache (docs/contract.md §13).

Saving a sequence is one gather launch per layer into one staging buffer and one copy to the
host; loading is one copy to the device, one launch that writes the sequence's cells into
the table mirror, and one scatter launch per layer; all on the cache's stream. The staging
buffer holds, in sections each aligned to ALIGN bytes:

    [4, columns] int32   (loading) the sequence's tokens as a step buffer: its cells, their
                         positions, its id (`prepare_tokens` writes them into the mirror)
    [4, columns] int32   (loading, when a layer converts) the loaded tokens alone: the
                         cells the write kernel stores into
    per layer K, then V  [n, row words] of the layer's word dtype (`rows.word_dtype`), as
                         stored; a converted layer's [n, n_kv_heads, head_dim] float32
"""

import numpy as np

from numbakv.cache.buffers import StepBuffers
from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import placement, rows
from numbakv.cache.kernels.step_buffer import CELLS, POSITIONS, SCALARS, SEQ_IDS, WIDTH, columns
from numbakv.cache.pool import ALLOCATION_ERRORS, DevicePool
from numbakv.cache.streams import Streams
from numbakv.cache.table import HostTable
from numbakv.core.config import CacheConfig
from numbakv.core.errors import AllocationError
from numbakv.core.formats import ARRAY_DTYPES, FLOATS
from numbakv.core.seq_state import (
    Geometry,
    SeqState,
    check_onto,
    check_room,
    check_start,
    load_plan,
)

ALIGN = 16  # bytes: every section starts on a word of any dtype the kernels read


class Saver:
    """Saves a sequence of the device cache to a `SeqState` and loads one as a new sequence
    (`CellCache.seq_save`, `seq_load`). Owns nothing between calls (each stages through a
    buffer of its own); reads the config, the host table (a load places the state's tokens
    in it), the pool (a load grows it), the fixed buffers (the table mirror and seq_cells)
    and the stream in use. The cache holds its lock around every call, refuses them inside
    a capture, and after a load expires its step and tells its observers."""

    def __init__(self, config: CacheConfig, table: HostTable, pool: DevicePool,
                 buffers: StepBuffers, streams: Streams):  # fmt: skip
        self._config, self._table, self._pool = config, table, pool
        self._buffers, self._streams = buffers, streams

    def save(self, seq: int, start: int = 0) -> SeqState:
        """`seq`'s positions start .. pos(seq)-1 and their K/V in every layer, as stored."""
        config, table = self._config, self._table
        seq = table.check_live(seq)
        length = table.length(seq)
        start = check_start(start, length, seq)
        n = length - start
        layout = Layout(config, n, (False,) * config.n_layers)
        stream = self._streams.current
        try:
            host = np.empty(layout.n_bytes, np.uint8)
            staging = cuda.device_array(layout.n_bytes, np.uint8, stream=stream) if n else None
        except ALLOCATION_ERRORS as error:
            raise AllocationError(
                f"could not allocate the {layout.n_bytes} bytes of staging to save sequence {seq}"
            ) from error
        if n:
            cells = self._buffers.seq_cells[seq, start:length]
            pool = self._pool
            for layer in range(config.n_layers):
                word = layout.words[layer]
                k_rows, v_rows = layout.device_rows(staging, layer)
                rows.launch_gather_rows(
                    rows.as_words(pool.k[layer], word), rows.as_words(pool.v[layer], word),
                    cells, k_rows, v_rows, stream,
                )  # fmt: skip
            staging.copy_to_host(host, stream=stream)
            stream.synchronize()
        entries = [layout.host_entries(host, layer) for layer in range(config.n_layers)]
        k, v = tuple(e[0] for e in entries), tuple(e[1] for e in entries)
        positions = np.arange(start, length, dtype=np.int32)
        return SeqState(Geometry.of(config), positions, k, v, start)

    def load(self, state: SeqState, onto: int | None = None, convert: bool = False) -> int:
        """The id of a new sequence holding `state`'s positions and K/V (on `onto`'s first
        state.start positions); refused with nothing changed."""
        config, table = self._config, self._table
        convert = load_plan(state, config, convert)
        onto = None if onto is None else table.check_live(onto)
        check_onto(onto, 0 if onto is None else table.length(onto), state.start)
        check_room(state, config, table.free_cells, table.live)
        start, n = state.start, state.n_tokens
        cells = table.find_cells(n)
        prefix = np.zeros(0, np.int32) if onto is None else table.cells_of(onto)[:start]
        seq = table.next_id()
        layout = Layout(config, n, convert, start + n)
        host = layout.staged(state, seq, np.concatenate([prefix, cells]))
        stream = self._streams.current
        if layout.width:
            try:  # before any change: a refused allocation leaves the cache as it was
                staging = cuda.to_device(host, stream=stream)
            except ALLOCATION_ERRORS as error:
                raise AllocationError(
                    f"could not allocate {layout.n_bytes} bytes on the device to stage the state"
                ) from error
        read_len = table.read_len
        self._pool.grow_to(min(config.capacity, read_len + n), read_len, stream)
        if onto is None:
            table.seq_new()
        else:
            table.seq_clone(onto, start)
        table.claim(cells, np.full(n, seq, np.int32))
        if layout.width:  # else an empty state of a new sequence: the mirror has nothing
            b = self._buffers
            tokens, cells, loaded = layout.steps(staging)
            placement.launch_prepare_tokens(
                tokens, start + n, b.cell_pos, b.cell_owners, b.seq_cells, b.seq_len, stream
            )
            if n:
                self._store(layout, staging, cells, loaded, stream)
        return seq

    def _store(self, layout: "Layout", staging, cells, loaded, stream) -> None:
        """Each layer's staged entries into pool rows `cells` ([n] int32 device array);
        `loaded` is their step buffer, which the write kernel of a converted layer reads."""
        pool, n = self._pool, layout.n
        for layer, is_converted in enumerate(layout.convert):
            k_rows, v_rows = layout.device_rows(staging, layer)
            if is_converted:
                placement.launch_scatter_kv(
                    k_rows, v_rows, pool.k[layer], pool.v[layer], loaded, n, stream,
                    kinds=pool.kinds[layer], kv_scales=pool.scales[layer],
                )  # fmt: skip
            else:
                word = layout.words[layer]
                rows.launch_scatter_rows(
                    k_rows, v_rows, cells, rows.as_words(pool.k[layer], word),
                    rows.as_words(pool.v[layer], word), stream,
                )  # fmt: skip


class Layout:
    """Where each section of a staging buffer lies (the module's docstring).

    n        : the tokens whose K/V are staged
    convert  : per layer, whether its section holds float32 values rather than entries
    width    : the tokens of the step-buffer section (the loaded sequence's, prefix
               included); 0 when saving, which stages no step buffer
    """

    def __init__(self, config, n: int, convert: tuple[bool, ...], width: int = 0):
        self.config, self.n, self.convert, self.width = config, n, convert, width
        h, d = config.n_kv_heads, config.head_dim
        offset = 0
        self.step_offsets = []
        for size in (width, n if any(convert) else 0):
            if size:
                self.step_offsets.append(offset)
                offset = _aligned(offset + 4 * 4 * columns(size))
        self.sections, self.words = [], []  # per layer ((offset, dtype, shape) of K, of V)
        for layer, is_converted in enumerate(convert):
            pair = []
            for which in (0, 1):
                fmt = config.formats[layer][which]
                shape = config.pool_shape(layer, which, n)
                dtype = ARRAY_DTYPES[fmt]
                if is_converted:
                    dtype, shape = np.dtype(np.float32), (n, h, d)
                pair.append((offset, dtype, shape))
                offset = _aligned(offset + int(np.prod(shape)) * dtype.itemsize)
            self.sections.append(pair)
            row_bytes = [int(np.prod(s[1:])) * t.itemsize for _, t, s in pair]
            self.words.append(rows.word_dtype(*row_bytes))
        self.n_bytes = offset

    def host_entries(self, host: np.ndarray, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of `layer`'s K and V sections of host bytes `host`, as their arrays."""
        return tuple(_section(host, *section) for section in self.sections[layer])

    def device_rows(self, staging, layer: int) -> tuple:
        """`layer`'s K and V sections of device bytes `staging`: [n, row words] of the
        layer's word dtype, or [n, n_kv_heads, head_dim] float32 when it converts."""
        views = []
        for offset, dtype, shape in self.sections[layer]:
            nbytes = int(np.prod(shape)) * dtype.itemsize
            block = staging[offset : offset + nbytes]
            if self.convert[layer]:
                views.append(block.view(np.float32).reshape(shape))
            else:
                word = self.words[layer]
                views.append(block.view(word).reshape(self.n, nbytes // self.n // word.itemsize))
        return tuple(views)

    def steps(self, staging) -> tuple:
        """(the [4, columns] int32 step buffer of every token of the loaded sequence, the
        [n] int32 cells of the loaded tokens, the step buffer of those alone or None when
        no layer converts): views of device bytes `staging`."""
        views = [
            staging[offset : offset + 16 * columns(size)].view(np.int32).reshape(4, -1)
            for offset, size in zip(self.step_offsets, (self.width, self.n), strict=False)
        ]
        cells = views[0][CELLS, self.width - self.n : self.width]
        return views[0], cells, views[1] if len(views) > 1 else None

    def staged(self, state: SeqState, seq: int, cells: np.ndarray) -> np.ndarray:
        """The host bytes to upload for loading `state` as sequence `seq` into `cells`
        ([width] int32, its prefix's then its own, in position order)."""
        host = np.zeros(self.n_bytes, np.uint8)
        sizes = (self.width, self.n)
        for offset, size in zip(self.step_offsets, sizes, strict=False):
            cols = columns(size)
            step = _section(host, offset, np.dtype(np.int32), (4, cols))
            step[:] = -1
            step[CELLS, :size] = cells[-size:]
            step[POSITIONS, :size] = np.arange(self.width - size, self.width)
            step[SEQ_IDS, :size] = seq
            step[SCALARS, WIDTH] = size
        for layer, is_converted in enumerate(self.convert):
            formats = state.geometry.formats[layer]
            for which, section in enumerate(self.sections[layer]):
                entries = (state.k, state.v)[which][layer]
                if is_converted:
                    entries = _float32(entries, formats[which])
                _section(host, *section)[:] = entries
        return host


def _section(buffer: np.ndarray, offset: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
    nbytes = int(np.prod(shape)) * dtype.itemsize
    return buffer[offset : offset + nbytes].view(dtype).reshape(shape)


def _float32(entries: np.ndarray, fmt: str) -> np.ndarray:
    """[n, n_kv_heads, head_dim] float32 values of entries of float format `fmt` (exact)."""
    assert fmt in FLOATS
    if fmt == "bfloat16":  # the pattern is the float32's top half
        return (entries.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return entries.astype(np.float32)


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN
