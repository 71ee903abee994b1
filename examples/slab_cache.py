"""A per-sequence slab KV cache, held to numbakv's contract.

numbakv keeps K/V in one pool of per-token cells; the simplest runtimes (HF transformers'
DynamicCache, many hand-rolled decoders) give each sequence its own contiguous buffer
instead, position p in row p, reallocated bigger as the sequence grows. This is such a
cache, written as a numbakv user would write one, that answers
`numbakv.testing.protocol.CacheUnderTest`:

    Slab         one sequence's K/V of every layer, position p in row p
    slab_attend  one token's attention over rows of its slab
    SlabCache    the contract's verbs, step, errors and capacity over one slab per sequence

- A slab starts with `initial_rows` rows (seq_new); `prepare_step` doubles it, copying its
  rows, when a token's position reaches its end, so a sequence grows in the middle of a
  step and each token is written to the slab it has once every token is placed.
  `seq_clone(src, upto)` copies rows [0, upto) into the clone's own slab (a physical copy);
  `rewind` keeps the slab (rows past pos are never read); `seq_rm` drops it.
- Capacity is counted the reference's way, not in rows: each position holds a logical cell
  id (a clone takes its source's, a step makes new ones); `used_cells` counts the ids held,
  one shared by clones once, and a declaration needs a free cell per token, so this cache
  refuses exactly where the reference does, however many rows its slabs have.
- Planted bugs (`BUGS`), off by default: `SlabCache(config, bugs={"growth_loses_tail"})`.
  Each is a one-line deviation of a class contiguous-buffer caches have shipped: in growth
  (a stale buffer, a short copy), in the verbs (a short or aliased clone, rewind to 0, a
  reused id, a leaked hold), in the step protocol (padding written through index -1,
  staleness, a pending declaration, attend before write) and in attention (the window's
  edge, GQA, the masked mode's causal edge, the scale).

Held to the contract by `numbakv.testing` (tests/testing/test_slab_example.py):

    check_cache(SlabCache)
"""

from collections import Counter
from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike

from numbakv.core import arrays, calls, values
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError, ConfigError, StepError
from numbakv.core.values import int_at_least

BUGS = {
    "stale_slab_after_growth": "a token writes to its slab as placed, before a later token grew it",
    "growth_loses_tail": "a doubled slab copies rows [0, rows - 1): the old last row is lost",
    "clone_one_short": "seq_clone(src, upto) copies rows [0, upto - 1) but holds upto positions",
    "clone_aliases_slab": "seq_clone gives the clone src's slab itself, not a copy of it",
    "rewind_to_zero_noop": "rewind(seq, 0) reads 0 as 'to the end' and drops nothing",
    "reused_id_inherits": "seq_rm leaves the id's positions: its next user continues them",
    "refcount_leak_on_remove": "seq_rm keeps its hold on the cells a clone shares with it",
    "padding_kv_written": "write() stores padding rows too: sequence -1, position -1",
    "step_never_stale": "the last step's is_stale stays False after every later verb",
    "decl_survives_rm": "a successful seq_clone, seq_rm, rewind or clear keeps the declaration",
    "attend_before_write_accepted": "attend(layer) runs without write(layer) in the step",
    "window_off_by_one_at_edge": "the token at p = W - 1 (window W > 1) drops position 0",
    "gqa_mapping": "query head h reads KV head h % n_kv_heads",
    "masked_mode_differs": 'mode="masked" lets a token see the next row of its slab too',
    "scale_ignored": "attend() uses 1 / sqrt(head_dim) whatever scale it is given",
}


class Slab:
    """One sequence's K and V of every layer: position p in row p.

    k, v : [n_layers, rows, n_kv_heads, head_dim] of the storage dtype
    """

    def __init__(self, config: CacheConfig, rows: int):
        shape = (config.n_layers, rows, config.n_kv_heads, config.head_dim)
        self.k, self.v = np.zeros((2, *shape), dtype=config.storage_dtype)

    @property
    def rows(self) -> int:
        return self.k.shape[1]

    def copy(self, config: CacheConfig, rows: int, n_rows: int) -> "Slab":
        """A new slab of `rows` rows holding this one's rows [0, n_rows), in every layer."""
        slab = Slab(config, rows)
        slab.k[:, :n_rows], slab.v[:, :n_rows] = self.k[:, :n_rows], self.v[:, :n_rows]
        return slab


def slab_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_head: np.ndarray,
                scale: np.float32) -> np.ndarray:  # fmt: skip
    """[n_heads, head_dim] float32: one token's attention over the rows it sees.

    q       : [n_heads, head_dim] float32
    k, v    : [n_keys, n_kv_heads, head_dim] of the storage dtype, its slab's rows it sees
    kv_head : [n_heads] int, the KV head each query head reads
    """
    k, v = k[:, kv_head].astype(np.float32), v[:, kv_head].astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf: float32 arithmetic
        scores = np.einsum("hd,nhd->hn", q, k) * scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return np.einsum("hn,nhd->hd", weights, v).astype(np.float32)


class SlabStep:
    """One prepared step (the contract's semantic fields; a token's row is its position).

    positions, seq_ids : [width] int32, each token's position and sequence, -1 for padding
    width, n_tokens    : rows (padding included) and declared tokens (rows [0, n_tokens))

    Stale after any later verb but `seq_new` (then every accessor but `is_stale` raises).
    """

    def __init__(self, **arrays: np.ndarray):
        self._arrays, self.is_stale = arrays, False

    def _get(self, name: str) -> np.ndarray:
        if self.is_stale:
            raise StepError("this step is stale: a verb ran after prepare_step(); prepare anew")
        return self._arrays[name].copy()

    positions = property(lambda self: self._get("positions"))
    seq_ids = property(lambda self: self._get("seq_ids"))
    width = property(lambda self: len(self._get("seq_ids")))
    n_tokens = property(lambda self: int(np.count_nonzero(self._get("seq_ids") >= 0)))


class SlabCache:
    """A slab-per-sequence KV cache with the verbs, step protocol and errors of numbakv's
    contract.

    config       : a numbakv CacheConfig (dtype "float32" or "float16")
    bugs         : names of `BUGS` to switch on (to test a test kit); none by default
    initial_rows : rows of a new sequence's slab; it doubles as the sequence grows

    Per live sequence: a `Slab` of initial_rows * 2**k >= pos rows and, to count capacity
    the reference's way, a logical cell id per position (a clone shares its source's).
    """

    def __init__(self, config: CacheConfig, bugs: Iterable[str] = frozenset(),
                 initial_rows: int = 4):  # fmt: skip
        if not isinstance(config, CacheConfig):
            raise ConfigError(f"expected a CacheConfig, got {config!r}")
        if config.uniform_dtype not in ("float32", "float16"):  # one format, every K and V
            raise ConfigError(f"formats {config.formats}: this example stores float32 or float16")
        if unknown := set(bugs) - set(BUGS):
            raise ConfigError(f"unknown bugs {sorted(unknown)}; known: {sorted(BUGS)}")
        self.config, self.bugs = config, frozenset(bugs)
        self.initial_rows = int_at_least("initial_rows", initial_rows, 1)
        self._step, self._declared = None, None  # the last SlabStep, the declared ids
        self.clear()

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        """The lowest free id in [0, max_seqs), live and empty, with a slab of its own."""
        seq = self._free_id()
        self._slabs[seq] = Slab(self.config, self.initial_rows)
        self._live[seq] = True
        return seq

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence holding `src`'s positions [0, upto) (default all of them): their
        cells shared, their rows copied into a slab of its own."""
        src = calls.check_live(src, self._live)
        n = len(self._cells[src])
        upto = n if upto is None else calls.check_position("upto", upto, n, src)
        seq = self._free_id()
        rows = self.initial_rows
        while rows < upto:
            rows *= 2
        copied = max(upto - 1, 0) if "clone_one_short" in self.bugs else upto
        slab = self._slabs[src]
        if "clone_aliases_slab" not in self.bugs:  # a physical copy, in a slab of its own
            slab = slab.copy(self.config, rows, copied)
        self._slabs[seq] = slab
        self._cells[seq] = self._cells[src][:upto]
        self._held.update(self._cells[seq])
        self._live[seq] = True
        self._changed()
        return seq

    def seq_rm(self, seq: int) -> None:
        """Frees `seq`'s id, its slab, and its cells no clone holds."""
        seq = calls.check_live(seq, self._live)
        cells = self._cells[seq][:]
        if "refcount_leak_on_remove" in self.bugs:  # never lets go of what it shares
            self._held.update(cell for cell in cells if self._held[cell] > 1)
        self._truncate(seq, 0)
        if "reused_id_inherits" in self.bugs:
            self._cells[seq] = cells
        self._slabs[seq], self._live[seq] = None, False
        self._changed()

    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id and its slab stay."""
        seq = calls.check_live(seq, self._live)
        n = len(self._cells[seq])
        position = calls.check_position("position", position, n, seq)
        if "rewind_to_zero_noop" in self.bugs and position == 0:
            position = n
        self._truncate(seq, position)
        self._changed()

    def clear(self) -> None:
        """Every id, slab and cell free; the step and any declaration dropped."""
        n = self.config.max_seqs
        self._live = np.zeros(n, dtype=bool)
        self._slabs: list[Slab | None] = [None] * n
        self._cells: list[list[int]] = [[] for _ in range(n)]
        self._held, self._next_cell = Counter(), 0  # logical cell -> sequences holding it
        self._changed()

    # -- the step --------------------------------------------------------------

    def declare_step(self, seq_ids: ArrayLike) -> None:
        """Records the next step's tokens, one live id per token, checked in the contract's
        order: not a list, tuple, range or 1-d array, the first id not live, a count outside
        [1, max_width], more tokens than free cells, a sequence past max_seq_len."""
        is_array = isinstance(seq_ids, np.ndarray) and seq_ids.ndim == 1
        if not (is_array or isinstance(seq_ids, list | tuple | range)):
            raise StepError(f"declare_step takes a list or 1-d array of ids, not {seq_ids!r}")
        ids = [calls.check_live(seq, self._live) for seq in seq_ids]
        if not 1 <= len(ids) <= self.config.max_width:
            raise StepError(f"a step declares 1 to {self.config.max_width} tokens, not {len(ids)}")
        if len(ids) > self.free_cells:
            raise CapacityError(f"{len(ids)} tokens, {self.free_cells} cells free; seq_rm() one")
        for seq, count in Counter(ids).items():
            if len(self._cells[seq]) + count > self.config.max_seq_len:
                raise CapacityError(f"sequence {seq} would pass max_seq_len; rewind() it")
        self._changed()  # the last step is stale; a pending declaration replaced
        self._declared = np.array(ids, dtype=np.int32)

    def prepare_step(self, width: int | None = None) -> SlabStep:
        """Places the declared tokens: each gets its sequence's next position, the row of
        that number in its slab, which doubles (rows copied) when the position reaches its
        end. Rows past the declared count (width > n) are padding, -1 everywhere."""
        if self._declared is None:
            raise StepError("prepare_step() with nothing declared; call declare_step() first")
        seq_ids = self._declared
        width = calls.check_width(width, len(seq_ids), self.config.max_width)
        rows = np.full((2, width), -1, dtype=np.int32)  # positions, seq_ids
        self._placed = []  # the slab each token had when placed (a later token may grow it)
        for t, seq in enumerate(seq_ids.tolist()):
            p, slab = len(self._cells[seq]), self._slabs[seq]
            if p == slab.rows:
                kept = slab.rows - ("growth_loses_tail" in self.bugs)
                self._slabs[seq] = slab.copy(self.config, 2 * slab.rows, kept)
            self._placed.append(self._slabs[seq])
            rows[:, t] = p, seq
            self._cells[seq].append(self._next_cell)
            self._held[self._next_cell] = 1
            self._next_cell += 1
        self._changed(consumed=True)  # an earlier step is stale
        self._step = SlabStep(positions=rows[0], seq_ids=rows[1])
        return self._step

    def write(self, layer: int, k: ArrayLike, v: ArrayLike) -> None:
        """Stores the step's K and V rows (k, v: [width, n_kv_heads, head_dim], any real
        float dtype) in row p of each token's slab, rounded to float32, then to the
        storage dtype."""
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        k, v = arrays.host_floats("k", k), arrays.host_floats("v", v)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        values.check_shape("k", k.shape, shape), values.check_shape("v", v.shape, shape)
        dtype = self.config.storage_dtype
        k, v = (np.asarray(x, dtype=np.float32).astype(dtype) for x in (k, v))
        n = step.width if "padding_kv_written" in self.bugs else step.n_tokens
        ids, positions = step.seq_ids[:n].tolist(), step.positions[:n].tolist()
        stale = "stale_slab_after_growth" in self.bugs  # the slab as placed, not as grown
        for t, (seq, p) in enumerate(zip(ids, positions, strict=True)):
            slab = self._placed[t] if stale else self._slabs[seq]
            slab.k[layer, p], slab.v[layer, p] = k[t], v[t]
        self._written.add(layer)

    def attend(self, layer: int, q: ArrayLike, scale: float | None = None,
               mode: str = "gathered") -> np.ndarray:  # fmt: skip
        """[width, n_heads, head_dim] float32: each token's attention over its slab's rows
        [max(0, p - W + 1), p] (W = config.windows[layer], 0 = all of [0, p]), which
        include the tokens of its sequence placed before it in this step.

        q     : [width, n_heads, head_dim], n_heads a multiple of n_kv_heads; query head h
                reads KV head h // (n_heads // n_kv_heads)
        scale : default 1 / sqrt(head_dim)
        mode  : "gathered" reads those rows; "masked" every row of the slab under the
                token's mask (row r seen when first <= r <= p): the same rows
        Padding rows give 0. Requires write(layer, ...) in this step.
        """
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        calls.check_mode(mode)
        if layer not in self._written and "attend_before_write_accepted" not in self.bugs:
            raise StepError(f"attend({layer}) before write({layer}) in this step")
        q = arrays.host_floats("q", q).astype(np.float32)
        n_heads = calls.check_query(q.shape, step.width, self.config)
        scale = calls.check_scale(scale, self.config.head_dim)
        if "scale_ignored" in self.bugs:
            scale = calls.default_scale(self.config.head_dim)
        n_kv, window = self.config.n_kv_heads, self.config.windows[layer]
        heads = np.arange(n_heads)
        kv_head = heads % n_kv if "gqa_mapping" in self.bugs else heads // (n_heads // n_kv)
        future = "masked_mode_differs" in self.bugs  # the mask's causal edge one row late
        out = np.zeros(q.shape, dtype=np.float32)
        ids, positions = step.seq_ids.tolist(), step.positions.tolist()
        for t, (seq, p) in enumerate(zip(ids, positions, strict=True)):
            if seq < 0:  # padding
                continue
            first = max(0, p - window + 1) if window else 0
            if "window_off_by_one_at_edge" in self.bugs and p + 1 == window > 1:
                first = 1
            slab, seen = self._slabs[seq], np.arange(first, p + 1)
            if mode == "masked":
                every = np.arange(slab.rows)
                seen = every[(every >= first) & (every <= p + future)]
            k, v = slab.k[layer, seen], slab.v[layer, seen]
            out[t] = slab_attend(q[t], k, v, kv_head, scale)
        return out

    # -- state -----------------------------------------------------------------

    def pos(self, seq: int) -> int:
        """Positions `seq` holds: the position (and slab row) its next token gets."""
        return len(self._cells[calls.check_live(seq, self._live)])

    @property
    def live_seqs(self) -> list[int]:
        """The live ids, ascending."""
        return np.flatnonzero(self._live).tolist()

    @property
    def used_cells(self) -> int:
        """Positions held, a position shared by clones (copied into each slab) once."""
        return len(self._held)

    @property
    def free_cells(self) -> int:
        return self.config.capacity - self.used_cells

    def slab_rows(self, seq: int) -> int:
        """Rows of `seq`'s slab: initial_rows, doubled as it grew; at least pos(seq)."""
        return self._slabs[calls.check_live(seq, self._live)].rows

    def check_invariants(self) -> None:
        """Raises AssertionError unless each cell's count is the number of live sequences
        holding it, a dead id holds no cell and no slab, each live sequence holds distinct
        cells in a slab of its own of initial_rows * 2**k >= pos rows."""
        held = Counter(cell for seq in self.live_seqs for cell in self._cells[seq])
        if held != self._held:
            raise AssertionError(f"slab cache: counts {dict(self._held)}, sequences {dict(held)}")
        for seq in np.flatnonzero(~self._live).tolist():
            if self._cells[seq] or self._slabs[seq] is not None:
                raise AssertionError(f"slab cache: dead id {seq} holds cells or a slab")
        buffers = set()
        for seq in self.live_seqs:
            cells, rows = self._cells[seq], self._slabs[seq].rows
            if len(set(cells)) != len(cells):
                raise AssertionError(f"slab cache: sequence {seq} holds a cell twice")
            ratio = rows // self.initial_rows
            if rows < len(cells) or rows % self.initial_rows or ratio & (ratio - 1):
                raise AssertionError(f"slab cache: sequence {seq} has {rows} rows for {len(cells)}")
            buffers.add(id(self._slabs[seq].k))
        if len(buffers) != len(self.live_seqs):
            raise AssertionError("slab cache: two live sequences share one slab")

    def _free_id(self) -> int:
        free = np.flatnonzero(~self._live)
        if len(free) == 0:
            raise CapacityError(f"all {self.config.max_seqs} sequence ids are live; seq_rm() one")
        return int(free[0])

    def _truncate(self, seq: int, position: int) -> None:
        """Drops `seq`'s hold on the cells of its positions >= position."""
        self._held.subtract(self._cells[seq][position:])
        self._held = +self._held  # forget cells no sequence holds
        del self._cells[seq][position:]

    def _current_step(self) -> SlabStep:
        if self._step is None:
            raise StepError("no prepared step; call declare_step() and prepare_step() first")
        return self._step

    def _changed(self, consumed: bool = False) -> None:
        """A verb changed the sequences or the declaration: the last step is stale, the
        declaration dropped (consumed by prepare_step)."""
        if consumed or "decl_survives_rm" not in self.bugs:
            self._declared = None
        if self._step is not None and "step_never_stale" not in self.bugs:
            self._step.is_stale = True
        self._step, self._written = None, set()
