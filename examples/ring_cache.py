"""A unified ring of cells in the style of llama.cpp, held to numbakv's contract.

llama.cpp keeps one K/V cache of `capacity` cells that every sequence shares: each cell has
a position (-1 free) and a set of owning sequences, and a step's tokens go into free cells
found from a `head` cursor that wraps round. This is such a cache, written as a numbakv
user would write one, that answers `numbakv.testing.protocol.CacheUnderTest`:

    ring_attend  one token's attention over the cells it sees
    RingStep     a prepared step: each token's position, sequence and cell
    RingCache    the contract's verbs, step, errors and capacity over the ring

- Placement differs from the reference's (lowest free cells first): the search starts at
  `head`, wraps past the last cell to cell 0, and leaves `head` one past the last cell it
  took. So cells differ from the reference's and only the semantics are compared
  (compare="semantic"); `clear()` puts `head` back at 0.
- `seq_clone(src, upto)` adds the new id to the owners of src's cells with pos < upto and
  copies nothing; `seq_rm` and `rewind` take the id off cells and free those left without
  an owner. Capacity is counted as the reference counts it: `used_cells` is the number of
  cells with an owner (a cell shared by clones once) and a declaration needs a free cell
  per token, so this cache refuses exactly where the reference does.
- Planted bugs (`BUGS`), off by default: `RingCache(config, bugs={"head_wrap_overwrite"})`.
  Each is a one-line deviation of a class unified caches have shipped: in the verbs (a
  reused id, shared cells freed, clone and rewind bounds, clear), in placement (the head's
  wrap, the capacity check), in the step protocol (padding writes, staleness, a pending
  declaration) and in attention (the window's edge, GQA, masked mode, the scale).

Held to the contract by `numbakv.testing` (tests/testing/test_ring_example.py):

    check_cache(RingCache)
"""

from collections import Counter
from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike

from numbakv.core import arrays, calls, values
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError, ConfigError, StepError

BUGS = {
    "reused_id_inherits": "seq_rm leaves the id on cells a clone owns: its next user sees them",
    "rm_frees_shared": "seq_rm frees every cell of the sequence, those a clone still owns too",
    "clone_one_short": "seq_clone(src, upto) shares positions < upto - 1 only",
    "rewind_to_zero_noop": "rewind(seq, 0) reads 0 as 'to the end' and drops nothing",
    "head_wrap_overwrite": "placement looks from head to the end, then takes 0, 1, ... unchecked",
    "capacity_off_by_one": "a declaration needing exactly the free cells is refused",
    "padding_kv_written": "write() scatters padding rows too: cell -1, the ring's last cell",
    "window_off_by_one_at_edge": "the token at position p == W (window W) sees position 0 too",
    "gqa_mapping": "query head h reads KV head h % n_kv_heads",
    "masked_mode_differs": 'mode="masked" ignores the window',
    "scale_ignored": "attend() uses 1 / sqrt(head_dim) whatever scale it is given",
    "clear_keeps_owners": "clear() frees every position but leaves the owner bits",
    "decl_survives_rm": "a successful seq_clone, seq_rm, rewind or clear keeps the declaration",
    "step_never_stale": "the last step's is_stale stays False after every later verb",
}


def ring_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_head: np.ndarray,
                scale: np.float32) -> np.ndarray:  # fmt: skip
    """[n_heads, head_dim] float32: one token's attention over the keys it sees.

    q       : [n_heads, head_dim] float32
    k, v    : [n_keys, n_kv_heads, head_dim] of the storage dtype, the cells it sees
    kv_head : [n_heads] int, the KV head each query head reads
    """
    k, v = k[:, kv_head].astype(np.float32), v[:, kv_head].astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf: float32 arithmetic
        scores = np.einsum("hd,nhd->hn", q, k) * scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return np.einsum("hn,nhd->hd", weights, v).astype(np.float32)


class RingStep:
    """One prepared step (the contract's semantic fields, plus where each token went).

    positions, seq_ids : [width] int32, each token's position and sequence, -1 for padding
    cells              : [width] int32, the ring cell of each token, -1 for padding
    width, n_tokens    : rows (padding included) and declared tokens (rows [0, n_tokens))

    Stale after any later verb but `seq_new` (then every accessor but `is_stale` raises).
    """

    def __init__(self, **arrays: np.ndarray):
        self._arrays = arrays
        self.is_stale = False

    def _get(self, name: str) -> np.ndarray:
        if self.is_stale:
            raise StepError("this step is stale: a verb ran after prepare_step(); prepare anew")
        return self._arrays[name].copy()

    positions = property(lambda self: self._get("positions"))
    seq_ids = property(lambda self: self._get("seq_ids"))
    cells = property(lambda self: self._get("cells"))
    width = property(lambda self: len(self._get("seq_ids")))
    n_tokens = property(lambda self: int(np.count_nonzero(self._get("seq_ids") >= 0)))


class RingCache:
    """A unified ring KV cache with the verbs, step protocol and errors of numbakv's contract.

    config : a numbakv CacheConfig (dtype "float32" or "float16")
    bugs   : names of `BUGS` to switch on (to test a test kit); none by default

    The ring, allocated once at full size:
    k, v    : [n_layers, capacity, n_kv_heads, head_dim] of the storage dtype
    cell_pos: [capacity] int32, each cell's position, -1 free
    owners  : [capacity, max_seqs] bool, the sequences that own each cell
    head    : the cell the next placement searches from
    pos(seq) is the number of cells `seq` owns.
    """

    def __init__(self, config: CacheConfig, bugs: Iterable[str] = frozenset()):
        if not isinstance(config, CacheConfig):
            raise ConfigError(f"expected a CacheConfig, got {config!r}")
        if config.uniform_dtype not in ("float32", "float16"):  # one format, every K and V
            raise ConfigError(f"formats {config.formats}: this example stores float32 or float16")
        unknown = set(bugs) - set(BUGS)
        if unknown:
            raise ConfigError(f"unknown bugs {sorted(unknown)}; known: {sorted(BUGS)}")
        self.config, self.bugs = config, frozenset(bugs)
        shape = (config.n_layers, config.capacity, config.n_kv_heads, config.head_dim)
        self.k = np.zeros(shape, dtype=config.storage_dtype)
        self.v = np.zeros(shape, dtype=config.storage_dtype)
        self.cell_pos = np.full(config.capacity, -1, dtype=np.int32)
        self.owners = np.zeros((config.capacity, config.max_seqs), dtype=bool)
        self._live = np.zeros(config.max_seqs, dtype=bool)
        self._step: RingStep | None = None
        self._declared: np.ndarray | None = None
        self.clear()

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        """The lowest free id in [0, max_seqs), live and empty."""
        seq = self._free_id()
        self._live[seq] = True
        return seq

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence owning `src`'s cells of positions [0, upto) (default all of them)."""
        src = calls.check_live(src, self._live)
        n = self.pos(src)
        upto = n if upto is None else calls.check_position("upto", upto, n, src)
        seq = self._free_id()
        if "clone_one_short" in self.bugs:
            upto = max(upto - 1, 0)
        self.owners[:, seq] = self.owners[:, src] & (self.cell_pos < upto)
        self._live[seq] = True
        self._changed()
        return seq

    def seq_rm(self, seq: int) -> None:
        """Takes `seq` off every cell, frees the cells left without an owner, frees the id."""
        seq = calls.check_live(seq, self._live)
        cells = self.owners[:, seq].copy()
        if "reused_id_inherits" in self.bugs:  # only the cells it alone owns
            cells &= self.owners.sum(axis=1) == 1
        if "rm_frees_shared" in self.bugs:
            self.owners[cells] = False
        self._drop(seq, cells)
        self._live[seq] = False
        self._changed()

    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id stays live."""
        seq = calls.check_live(seq, self._live)
        n = self.pos(seq)
        position = calls.check_position("position", position, n, seq)
        if "rewind_to_zero_noop" in self.bugs:
            position = position or n
        self._drop(seq, self.owners[:, seq] & (self.cell_pos >= position))
        self._changed()

    def clear(self) -> None:
        """Every id and cell free, `head` at 0, the step and any declaration dropped; the
        K/V storage stays."""
        self.cell_pos[:] = -1
        if "clear_keeps_owners" not in self.bugs:
            self.owners[:] = False
        self._live[:] = False
        self.head = 0
        self._changed()

    # -- the step --------------------------------------------------------------

    def declare_step(self, seq_ids: ArrayLike) -> None:
        """Records the next step's tokens, one live id per token. Checked in the contract's
        order: not a list, tuple, range or 1-d array (StepError); the first id not live
        (SequenceError); a count outside [1, max_width] (StepError); more tokens than free
        cells, a sequence past max_seq_len (CapacityError)."""
        is_array = isinstance(seq_ids, np.ndarray) and seq_ids.ndim == 1
        if not (is_array or isinstance(seq_ids, list | tuple | range)):
            raise StepError(f"declare_step takes a list or 1-d array of ids, not {seq_ids!r}")
        ids = [calls.check_live(seq, self._live) for seq in seq_ids]
        if not 1 <= len(ids) <= self.config.max_width:
            raise StepError(f"a step declares 1 to {self.config.max_width} tokens, not {len(ids)}")
        free = self.free_cells - ("capacity_off_by_one" in self.bugs)
        if len(ids) > free:
            raise CapacityError(
                f"{len(ids)} tokens declared, {self.free_cells} cells free; seq_rm() or rewind()"
            )
        for seq, count in Counter(ids).items():
            if self.pos(seq) + count > self.config.max_seq_len:
                raise CapacityError(f"sequence {seq} would pass max_seq_len; rewind() it")
        self._declared = np.array(ids, dtype=np.int32)
        self._expire()

    def prepare_step(self, width: int | None = None) -> RingStep:
        """Places the declared tokens: each gets its sequence's next position and the next
        free cell from `head` round the ring, which it alone owns. Rows past the declared
        count (width > n) are padding, -1 everywhere."""
        if self._declared is None:
            raise StepError("prepare_step() with nothing declared; call declare_step() first")
        seq_ids = self._declared
        width = calls.check_width(width, len(seq_ids), self.config.max_width)
        rows = np.full((3, width), -1, dtype=np.int32)  # positions, seq_ids, cells
        lengths = self.owners.sum(axis=0)
        for t, (seq, cell) in enumerate(zip(seq_ids.tolist(), self._find_cells(len(seq_ids)),
                                            strict=True)):  # fmt: skip
            rows[:, t] = lengths[seq], seq, cell
            self.cell_pos[cell], self.owners[cell, seq] = lengths[seq], True
            lengths[seq] += 1
        self.head = (int(rows[2, len(seq_ids) - 1]) + 1) % self.config.capacity
        self._declared = None  # used; an earlier step is stale
        self._expire()
        self._step = RingStep(positions=rows[0], seq_ids=rows[1], cells=rows[2])
        return self._step

    def write(self, layer: int, k: ArrayLike, v: ArrayLike) -> None:
        """Stores the step's K and V rows (k, v: [width, n_kv_heads, head_dim], any real
        float dtype) in their cells, rounded to float32, then to the storage dtype."""
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        k, v = arrays.host_floats("k", k), arrays.host_floats("v", v)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        values.check_shape("k", k.shape, shape), values.check_shape("v", v.shape, shape)
        real = step.seq_ids >= 0
        if "padding_kv_written" in self.bugs:
            real[:] = True
        cells, dtype = step.cells[real], self.config.storage_dtype
        self.k[layer, cells] = np.asarray(k[real], dtype=np.float32).astype(dtype)
        self.v[layer, cells] = np.asarray(v[real], dtype=np.float32).astype(dtype)
        self._written.add(layer)

    def attend(self, layer: int, q: ArrayLike, scale: float | None = None,
               mode: str = "gathered") -> np.ndarray:  # fmt: skip
        """[width, n_heads, head_dim] float32: each token (sequence s, position p) attends
        over the cells s owns with position in [max(0, p - W + 1), p] (W =
        config.windows[layer], 0 = all of [0, p]), which includes the tokens of s placed
        before it in this step.

        q     : [width, n_heads, head_dim], n_heads a multiple of n_kv_heads; query head h
                reads KV head h // (n_heads // n_kv_heads)
        scale : default 1 / sqrt(head_dim)
        mode  : "gathered" reads the token's cells in position order, "masked" in ring
                order under the mask; the same cells
        Padding rows give 0. Requires write(layer, ...) in this step.
        """
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        calls.check_mode(mode)
        if layer not in self._written:
            raise StepError(f"attend({layer}) before write({layer}) in this step")
        q = arrays.host_floats("q", q)
        n_heads = calls.check_query(q.shape, step.width, self.config)
        scale = calls.check_scale(scale, self.config.head_dim)
        if "scale_ignored" in self.bugs:
            scale = calls.default_scale(self.config.head_dim)
        q = q.astype(np.float32)
        n_kv, window = self.config.n_kv_heads, self.config.windows[layer]
        if "gqa_mapping" in self.bugs:
            kv_head = np.arange(n_heads) % n_kv
        else:
            kv_head = np.arange(n_heads) // (n_heads // n_kv)
        if mode == "masked" and "masked_mode_differs" in self.bugs:
            window = 0
        edge = "window_off_by_one_at_edge" in self.bugs
        out = np.zeros(q.shape, dtype=np.float32)
        for t, (seq, p) in enumerate(zip(step.seq_ids.tolist(), step.positions.tolist(),
                                         strict=True)):  # fmt: skip
            if seq < 0:  # padding
                continue
            first = 0 if not window or p < window + edge else p - window + 1
            seen = self.owners[:, seq] & (self.cell_pos >= first) & (self.cell_pos <= p)
            cells = np.flatnonzero(seen)
            if mode == "gathered":
                cells = cells[np.argsort(self.cell_pos[cells])]
            out[t] = ring_attend(q[t], self.k[layer, cells], self.v[layer, cells], kv_head, scale)
        return out

    # -- state -----------------------------------------------------------------

    def pos(self, seq: int) -> int:
        """Positions `seq` holds: the number of cells it owns, the position its next token
        gets."""
        return int(np.count_nonzero(self.owners[:, calls.check_live(seq, self._live)]))

    @property
    def live_seqs(self) -> list[int]:
        """The live ids, ascending."""
        return np.flatnonzero(self._live).tolist()

    @property
    def used_cells(self) -> int:
        """Cells with an owner: a cell shared by clones counts once."""
        return int(np.count_nonzero(self.owners.any(axis=1)))

    @property
    def free_cells(self) -> int:
        return self.config.capacity - self.used_cells

    def check_invariants(self) -> None:
        """Raises AssertionError unless a cell has a position exactly when it has an owner,
        every owner is live, `head` lies in the ring and each live sequence owns positions
        0 .. pos - 1 once each."""
        owned = self.owners.any(axis=1)
        odd = np.flatnonzero(owned != (self.cell_pos >= 0)).tolist()
        _require(not odd, f"cells {odd} have a position without an owner, or the reverse")
        dead = np.flatnonzero(self.owners.any(axis=0) & ~self._live).tolist()
        _require(not dead, f"ids {dead} are not live but own cells")
        _require(0 <= self.head < self.config.capacity, f"head {self.head} is off the ring")
        for seq in self.live_seqs:
            held = np.sort(self.cell_pos[self.owners[:, seq]])
            wrong = not np.array_equal(held, np.arange(len(held)))
            _require(not wrong, f"sequence {seq} holds positions {held.tolist()}")

    def _find_cells(self, n: int) -> list[int]:
        """The first `n` free cells from `head` round the ring (n <= free cells)."""
        capacity = self.config.capacity
        if "head_wrap_overwrite" in self.bugs:  # looks from head to the end only
            tail = np.arange(self.head, capacity)
            tail = tail[self.cell_pos[tail] < 0][:n]
            return [*tail.tolist(), *range(n - len(tail))]
        ring = (self.head + np.arange(capacity)) % capacity
        return ring[self.cell_pos[ring] < 0][:n].tolist()

    def _drop(self, seq: int, cells: np.ndarray) -> None:
        """Takes `seq` off `cells` ([capacity] bool) and frees the cells left unowned."""
        self.owners[cells, seq] = False
        self.cell_pos[~self.owners.any(axis=1)] = -1

    def _free_id(self) -> int:
        free = np.flatnonzero(~self._live)
        if len(free) == 0:
            raise CapacityError(f"all {self.config.max_seqs} sequence ids are live; seq_rm() one")
        return int(free[0])

    def _current_step(self) -> RingStep:
        if self._step is None:
            raise StepError("no prepared step; call declare_step() and prepare_step() first")
        return self._step

    def _expire(self) -> None:
        if self._step is not None and "step_never_stale" not in self.bugs:
            self._step.is_stale = True
        self._step, self._written = None, set()

    def _changed(self) -> None:  # a verb changed the table: the step stale, no declaration
        if "decl_survives_rm" not in self.bugs:
            self._declared = None
        self._expire()


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(f"ring cache invariant broken: {what}")
