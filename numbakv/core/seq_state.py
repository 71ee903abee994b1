"""`SeqState`: one sequence's positions and K/V as a cache stores them, saved by
`seq_save` and loaded by `seq_load` into either cache (docs/contract.md §13); numba-free.

A state is made for a geometry (`Geometry`: layers, KV heads, head_dim, windows, per-layer
formats and fp8 scales). Its K and V are the pool's entries, byte for byte: a round trip
never rounds. The checks here are pure: what a state must hold, and whether a cache of a
given config may load it.
"""

import json
from dataclasses import dataclass, fields

import numpy as np

from numbakv.core.calls import check_position
from numbakv.core.config import INT32_MAX, CacheConfig
from numbakv.core.errors import CacheError, CapacityError, ConfigError, SequenceError, StateError
from numbakv.core.formats import ARRAY_DTYPES, FLOATS, row_width
from numbakv.core.seq_file import VERSION, read_state, write_state

SHAPE_FIELDS = ("n_layers", "n_kv_heads", "head_dim", "windows")  # never converted


@dataclass(frozen=True)
class Geometry:
    """What a state was made for, from its cache's config.

    windows    : per layer, as `CacheConfig.windows`
    formats    : per layer (K format, V format), as `CacheConfig.formats`
    fp8_scales : per layer (K scales, V scales), each [n_kv_heads] floats (ones unless fp8)
    """

    n_layers: int
    n_kv_heads: int
    head_dim: int
    windows: tuple[int, ...]
    formats: tuple[tuple[str, str], ...]
    fp8_scales: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]

    @classmethod
    def of(cls, config: CacheConfig) -> "Geometry":
        scales = tuple(
            tuple(tuple(config.fp8_scale(i, which).tolist()) for which in (0, 1))
            for i in range(config.n_layers)
        )
        return cls(config.n_layers, config.n_kv_heads, config.head_dim, config.windows,
                   config.formats, scales)  # fmt: skip

    def entry_shape(self, layer: int, which: int) -> tuple[int, int]:
        """(n_kv_heads, row_width) of one cell of `layer`'s K (which 0) or V (1)."""
        return self.n_kv_heads, row_width(self.formats[layer][which], self.head_dim)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, eq=False)
class SeqState:
    """A sequence's positions start .. end-1 and their K/V, as its cache stored them.

    geometry  : what it was made for
    positions : [n_tokens] int32, start, start + 1, ... in order
    start     : the first position it holds (0 unless saved with `start`; kept apart from
                positions so that an empty tail still says where it begins)
    k, v      : per layer [n_tokens, n_kv_heads, row_width] of the layer's K (V) format's
                array dtype (docs/contract.md §4.1: uint16 patterns for bfloat16, uint8
                blocks for q8_0 / q4_0 / fp8), entry i for positions[i]; read-only
    version   : VERSION
    tokens    : None, or [end] int64, the token ids of positions 0 .. end-1 (the whole
                context, so that a loader can index it: `Engine.save` / `Engine.load`)

    Made by a cache's `seq_save`; `save(path)` / `SeqState.load(path)` keep one in a file.
    Two states are equal when their geometry, positions and every byte are.
    """

    geometry: Geometry
    positions: np.ndarray
    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]
    start: int = 0
    version: int = VERSION
    tokens: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_state(self)
        for array in (
            self.positions,
            *self.k,
            *self.v,
            *([] if self.tokens is None else [self.tokens]),
        ):
            array.flags.writeable = False

    @property
    def end(self) -> int:
        """One past the last position: what pos(seq) is once loaded."""
        return self.start + self.n_tokens

    @property
    def n_tokens(self) -> int:
        return len(self.positions)

    @property
    def nbytes(self) -> int:
        """Bytes of K and V over all layers (what loading it writes into the pool)."""
        return sum(x.nbytes for x in (*self.k, *self.v))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SeqState):
            return NotImplemented
        return (
            (self.version, self.geometry, self.start)
            == (other.version, other.geometry, other.start)
            and np.array_equal(self.positions, other.positions)
            and (self.tokens is None) == (other.tokens is None)
            and (self.tokens is None or np.array_equal(self.tokens, other.tokens))
            and all(
                a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))
                for a, b in zip((*self.k, *self.v), (*other.k, *other.v), strict=True)
            )
        )

    __hash__ = None

    def save(self, path) -> None:
        """Writes the state to `path`: one `.npz` (`numbakv.core.seq_file`)."""
        write_state(path, self)

    @classmethod
    def load(cls, path) -> "SeqState":
        """The state saved at `path`; StateError naming the reason for a missing, damaged or
        foreign file, raised before the payload is allocated."""
        geometry, positions, k, v, start, tokens = read_state(path)
        try:
            return cls(Geometry(**geometry), positions, k, v, start, tokens=tokens)
        except StateError as error:
            raise StateError(f"{path} is not a readable numbakv state ({error})") from None


def check_state(state: SeqState) -> None:
    """StateError naming what is wrong unless `state` holds what its geometry says."""
    g = state.geometry
    if not isinstance(g, Geometry):
        raise StateError(f"a SeqState's geometry must be a Geometry, got {type(g).__name__}")
    check_geometry(g)
    if type(state.version) is not int or state.version != VERSION:
        raise StateError(f"SeqState version {state.version!r}; this numbakv reads {VERSION}")
    positions = state.positions
    if not isinstance(positions, np.ndarray) or positions.dtype != np.int32 or positions.ndim != 1:
        raise StateError("a SeqState's positions must be a 1-d int32 array")
    n, start = len(positions), state.start
    if type(start) is not int or not 0 <= start <= INT32_MAX - max(n - 1, 0):
        raise StateError(f"a SeqState's start must be an int >= 0 whose positions fit int32, "
                         f"got {start!r}")  # fmt: skip
    if not np.array_equal(positions, start + np.arange(n)):
        raise StateError(f"a SeqState's positions must be {start}, {start + 1}, ... in order")
    tokens = state.tokens
    if tokens is not None and (
        not isinstance(tokens, np.ndarray)
        or tokens.dtype != np.int64
        or tokens.shape != (state.end,)
    ):
        raise StateError(f"a SeqState's tokens must be None or [{state.end}] int64")
    for name, arrays in (("k", state.k), ("v", state.v)):
        if not isinstance(arrays, tuple) or len(arrays) != g.n_layers:
            raise StateError(f"a SeqState's {name} must be a tuple of {g.n_layers} arrays")
        for layer, x in enumerate(arrays):
            which = "kv".index(name)
            fmt = g.formats[layer][which]
            shape = (n, *g.entry_shape(layer, which))
            if not isinstance(x, np.ndarray) or x.dtype != ARRAY_DTYPES[fmt] or x.shape != shape:
                got = (x.dtype, x.shape) if isinstance(x, np.ndarray) else type(x).__name__
                raise StateError(
                    f"layer {layer}'s {name.upper()} must be {shape} {ARRAY_DTYPES[fmt]} "
                    f"({fmt}), got {got}"
                )


def check_geometry(g: Geometry) -> None:
    """StateError unless `g` is what `Geometry.of` gives for some `CacheConfig`: plain ints,
    known formats, blocks that fit head_dim, one window, format pair and scale pair per
    layer, finite positive float32 scales."""
    try:
        config = CacheConfig(
            n_layers=g.n_layers, n_kv_heads=g.n_kv_heads, head_dim=g.head_dim,
            windows=g.windows, layer_dtypes=g.formats, fp8_scales=g.fp8_scales, capacity=1,
            max_width=1, max_seqs=1,
        )  # fmt: skip
        same = json.dumps(g.as_dict()) == json.dumps(Geometry.of(config).as_dict())
    except (CacheError, TypeError, ValueError, IndexError, KeyError) as error:
        raise StateError(f"a SeqState's geometry is not one a CacheConfig holds: {error}") from None
    if not same:
        raise StateError(f"a SeqState's geometry is not as a CacheConfig holds it: {g}")


def check_start(start, length: int, seq: int) -> int:
    """`seq_save`'s `start` as an int in [0, length], else SequenceError naming it."""
    return check_position("start", start, length, seq)


def load_plan(state, config: CacheConfig, convert) -> tuple[bool, ...]:
    """Per layer, whether `seq_load` must convert it (re-store its values in the cache's
    formats) rather than copy its entries; ConfigError naming the first field the cache
    does not match.

    The shape fields (SHAPE_FIELDS) must match. A layer whose K and V formats (and fp8
    scales) match is copied; one that differs is converted only when `convert` is True and
    both its K and V are float formats (float32, float16, bfloat16: exact as float32);
    quantized entries are never re-quantized.
    """
    if not isinstance(state, SeqState):
        raise ConfigError(f"seq_load() takes a SeqState, got {type(state).__name__}")
    check_state(state)  # again: its fields may have been replaced since it was made
    if not isinstance(convert, bool):
        raise ConfigError(f"convert must be True or False, got {convert!r}")
    mine = Geometry.of(config)
    for name in SHAPE_FIELDS:
        theirs, ours = getattr(state.geometry, name), getattr(mine, name)
        if theirs != ours:
            raise ConfigError(
                f"the state was saved with {name}={theirs!r}; this cache has {name}={ours!r}"
            )
    plan = []
    for layer in range(mine.n_layers):
        formats, scales = state.geometry.formats[layer], state.geometry.fp8_scales[layer]
        same = formats == mine.formats[layer] and all(
            scales[which] == mine.fp8_scales[layer][which]
            for which in (0, 1) if formats[which] == "fp8_e4m3"
        )  # fmt: skip
        if not same and not convert:
            raise ConfigError(
                f"layer {layer}: the state's formats are {formats} (fp8 scales {scales}), the "
                f"cache's {mine.formats[layer]} ({mine.fp8_scales[layer]}); pass convert=True "
                "to re-store float states"
            )
        if not same and not set(formats) <= set(FLOATS):
            raise ConfigError(
                f"layer {layer}: the state's formats {formats} are quantized and the cache's "
                f"are {mine.formats[layer]}; quantized K/V loads only into its own format"
            )
        plan.append(not same)
    return tuple(plan)


def check_room(state: SeqState, config: CacheConfig, free_cells: int, live: np.ndarray) -> None:
    """CapacityError naming the sizes unless a cache with `free_cells` free cells and `live`
    ([max_seqs] bool) ids can take `state` as a new sequence."""
    if live.all():
        raise CapacityError(
            f"all {config.max_seqs} sequence ids are live; seq_rm() one to load a state"
        )
    if state.n_tokens > free_cells:
        raise CapacityError(
            f"the state holds {state.n_tokens} positions but only {free_cells} of "
            f"{config.capacity} cells are free; seq_rm() or rewind() sequences first"
        )
    if state.end > config.max_seq_len:
        raise CapacityError(
            f"the state ends at position {state.end}, past max_seq_len={config.max_seq_len}"
        )


def check_onto(onto: int | None, length: int, start: int) -> None:
    """SequenceError naming both unless `seq_load`'s `onto` (None, or a live id checked by
    the caller, holding `length` positions) holds the state's first `start` positions: the
    new sequence clones positions [0, start) of it. Without `onto`, start must be 0."""
    if onto is None and start:
        raise SequenceError(
            f"the state starts at position {start}; pass onto= a sequence that holds its "
            "first positions"
        )
    if onto is not None and length < start:
        raise SequenceError(
            f"onto={onto} holds {length} positions; the state starts at position {start}, so "
            f"its prefix must hold at least {start}"
        )
