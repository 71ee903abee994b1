"""A paged KV cache with lazy copy-on-write and blocks of 16, held to numbakv's contract.

Runtimes fork a sequence (parallel sampling, beam search, a shared prompt) by sharing its
pages, and copy a page only when a sequence writes into one another still holds (vLLM's
block manager). This is such a cache (`Pages`, `CowStep`, `CowCache`), written as a numbakv
user would write one: it answers `numbakv.testing.protocol.CacheUnderTest` and saves and
loads sequences (docs/contract.md §13).

- A fork (`seq_clone(src, upto)`) shares every page of the prefix, the partial last one
  too, and copies nothing. Placing a token into a page another table holds (count > 1)
  first copies the slots before it into a page of its own (copy-on-write), so a `rewind`
  into a shared page copies nothing until the next append.
- Pages come off a LIFO free list (the page freed last is handed out next: one freed while
  held is overwritten at once); the pool of ceil(initial_cells / block_size) pages doubles
  when the list runs dry.
- Capacity is counted the reference's way (a logical cell id per position, a clone sharing
  its source's), so this cache refuses where the reference does. `seq_load` forks `onto`,
  places the state's positions as a step's tokens are placed, then writes each entry.
- Planted bugs (`BUGS`), off by default: `CowCache(config, bugs={"cow_by_flag"})`, each a
  bug class copy-on-write caches have shipped.

Held to the contract by `numbakv.testing` (tests/testing/test_cow_example.py):

    check_cache(CowCache, kinds=(*KINDS, "reload"))
"""

from collections import Counter
from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike

from numbakv.core import arrays, calls, values
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError, ConfigError, StepError
from numbakv.core.seq_state import (
    Geometry,
    SeqState,
    check_onto,
    check_room,
    check_start,
    load_plan,
)
from numbakv.core.values import int_at_least

BUGS = {
    "cow_by_flag": "a page is copied on write when a partial fork flagged it, whatever its count",
    "cow_copies_k_only": "copy-on-write copies a page's K slots but not its V",
    "window_whole_blocks": "a window starts at the first slot of the block its first key is in",
    "clone_upto_zero_all": "seq_clone(src, 0) reads upto=0 as 'all of src'",
    "rm_frees_shared": "seq_rm frees every page of the sequence, those a clone holds too",
    "load_tail_misplaced": "seq_load(onto=) writes the tail from its first block's slot 0",
}


class Pages:
    """k, v: [n_layers, n_pages, block_size, n_kv_heads, head_dim] of the storage dtype;
    refs: [n_pages] int32, how many block tables hold each page (0: free); free: the free
    pages, the next one handed out last; flagged: [n_pages] bool, pages a partial fork
    shared (what bug `cow_by_flag` copies on write)."""

    def __init__(self, config: CacheConfig, block_size: int, n_pages: int):
        shape = (config.n_layers, n_pages, block_size, config.n_kv_heads, config.head_dim)
        self.k, self.v = np.zeros((2, *shape), dtype=config.storage_dtype)
        self.refs = np.zeros(n_pages, dtype=np.int32)
        self.flagged = np.zeros(n_pages, dtype=bool)
        self.free = list(range(n_pages - 1, -1, -1))  # page 0 first

    def alloc(self) -> int:
        """The page freed last, now held once; the pool doubles when none is free."""
        if not self.free:
            n = len(self.refs)
            self.k, self.v = (np.concatenate([x, np.zeros_like(x)], 1) for x in (self.k, self.v))
            self.refs, self.flagged = (np.pad(x, (0, n)) for x in (self.refs, self.flagged))
            self.free = list(range(2 * n - 1, n - 1, -1))
        page = self.free.pop()
        self.refs[page], self.flagged[page] = 1, False
        return page

    def copy(self, src: int, n_slots: int, v: bool = True) -> int:
        """A new page holding slots [0, n_slots) of page `src` (K, and V unless not `v`),
        in every layer; the caller's hold on `src` released."""
        dst = self.alloc()
        self.k[:, dst, :n_slots] = self.k[:, src, :n_slots]
        if v:
            self.v[:, dst, :n_slots] = self.v[:, src, :n_slots]
        self.release([src])
        return dst

    def release(self, pages: Iterable[int], whole: bool = False) -> None:
        """Drops one hold on each page (`whole`: every hold); a page left unheld is free."""
        for page in pages:
            self.refs[page] = 0 if whole else self.refs[page] - 1
            if self.refs[page] == 0:
                self.free.append(page)


def paged_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, kv_head: np.ndarray,
                 scale: np.float32) -> np.ndarray:  # fmt: skip
    """[n_heads, head_dim] float32: one token's attention (q: [n_heads, head_dim] float32)
    over the keys it sees (k, v: [n_keys, n_kv_heads, head_dim]); query head h reads KV head
    kv_head[h]."""
    k, v = k[:, kv_head].astype(np.float32), v[:, kv_head].astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf: float32 arithmetic
        scores = np.einsum("hd,nhd->hn", q, k) * scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return np.einsum("hn,nhd->hd", weights, v).astype(np.float32)


class CowStep:
    """One prepared step: [width] int32 positions, seq_ids, and the page and slot of each
    token's K/V (-1 for padding); width and n_tokens. Stale after any later verb but
    `seq_new` (then every accessor but `is_stale` raises)."""

    def __init__(self, **arrays: np.ndarray):
        self._arrays, self.is_stale = arrays, False

    def _get(self, name: str) -> np.ndarray:
        if self.is_stale:
            raise StepError("this step is stale: a verb ran after prepare_step(); prepare anew")
        return self._arrays[name].copy()

    positions = property(lambda self: self._get("positions"))
    seq_ids = property(lambda self: self._get("seq_ids"))
    pages = property(lambda self: self._get("pages"))
    slots = property(lambda self: self._get("slots"))
    width = property(lambda self: len(self._get("seq_ids")))
    n_tokens = property(lambda self: int(np.count_nonzero(self._get("seq_ids") >= 0)))


class CowCache:
    """A paged KV cache with lazy copy-on-write: the verbs, step protocol, errors and saved
    sequences of numbakv's contract.

    config     : a numbakv CacheConfig (one format for every K and V: float32 or float16)
    bugs       : names of `BUGS` to switch on (to test a test kit); none by default
    block_size : positions per page (default 16)

    Per live sequence a block table (position p in slot p % block_size of page
    table[p // block_size]) and a logical cell id per position (capacity, counted).
    """

    def __init__(self, config: CacheConfig, bugs: Iterable[str] = frozenset(),
                 block_size: int = 16):  # fmt: skip
        if not isinstance(config, CacheConfig):
            raise ConfigError(f"expected a CacheConfig, got {config!r}")
        if config.uniform_dtype not in ("float32", "float16"):  # one format, every K and V
            raise ConfigError(f"formats {config.formats}: this example stores float32 or float16")
        if unknown := set(bugs) - set(BUGS):
            raise ConfigError(f"unknown bugs {sorted(unknown)}; known: {sorted(BUGS)}")
        self.config, self.bugs = config, frozenset(bugs)
        self.block_size = int_at_least("block_size", block_size, 1)
        self._step, self._declared = None, None  # the last CowStep, the declared ids
        self.clear()

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        """The lowest free id in [0, max_seqs), live and empty."""
        seq = self._free_id()
        self._live[seq] = True
        return seq

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence sharing `src`'s positions [0, upto) (default all of them): every
        page they lie in, the partial last one too; nothing is copied."""
        src = calls.check_live(src, self._live)
        n = len(self._cells[src])
        upto = n if upto is None else calls.check_position("upto", upto, n, src)
        seq = self._free_id()
        if "clone_upto_zero_all" in self.bugs and upto == 0:
            upto = n
        table = self._tables[src][: -(-upto // self.block_size)]
        self._pages.refs[table] += 1  # a block table holds a page at most once
        if upto % self.block_size:  # a partial fork: its pages flagged copy-on-write
            self._pages.flagged[table] = True
        self._tables[seq], self._cells[seq] = table, self._cells[src][:upto]
        self._held.update(self._cells[seq])
        self._live[seq] = True
        self._changed()
        return seq

    def seq_rm(self, seq: int) -> None:
        """Frees `seq`'s id, its hold on its pages and cells (what no clone holds is free)."""
        seq = calls.check_live(seq, self._live)
        if "rm_frees_shared" in self.bugs:
            self._pages.release(self._tables[seq], whole=True)
            self._tables[seq] = []
        self._truncate(seq, 0)
        self._live[seq] = False
        self._changed()

    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; a page it shares is copied on a write."""
        seq = calls.check_live(seq, self._live)
        n = len(self._cells[seq])
        self._truncate(seq, calls.check_position("position", position, n, seq))
        self._changed()

    def clear(self) -> None:
        """Every id, page and cell free; the step and any declaration dropped."""
        config = self.config
        self._pages = Pages(config, self.block_size, -(-config.initial_cells // self.block_size))
        self._live = np.zeros(config.max_seqs, dtype=bool)
        self._tables: list[list[int]] = [[] for _ in range(config.max_seqs)]
        self._cells: list[list[int]] = [[] for _ in range(config.max_seqs)]
        self._held, self._next_cell = Counter(), 0  # logical cell -> sequences holding it
        self._changed()

    def seq_save(self, seq: int, start: int = 0) -> SeqState:
        """`seq`'s positions start .. pos(seq) - 1 and their K/V in every layer, as stored
        (docs/contract.md §13); nothing changes."""
        seq = calls.check_live(seq, self._live)
        n = len(self._cells[seq])
        start = check_start(start, n, seq)
        positions = np.arange(start, n, dtype=np.int32)
        pages = np.asarray(self._tables[seq], dtype=np.int64)[positions // self.block_size]
        slots = positions % self.block_size
        k, v = (tuple(x[layer, pages, slots] for layer in range(self.config.n_layers))
                for x in (self._pages.k, self._pages.v))  # fmt: skip
        return SeqState(Geometry.of(self.config), positions, k, v, start)

    def seq_load(self, state: SeqState, onto: int | None = None, convert: bool = False) -> int:
        """A new sequence (empty, or a fork of `onto`'s first `state.start` positions) holding
        `state`'s positions, placed as a step's tokens are, and its entries as stored (or
        re-stored, for the float layers `convert=True` lets differ). Refused as the
        reference refuses, with nothing changed."""
        convert = load_plan(state, self.config, convert)
        onto = None if onto is None else calls.check_live(onto, self._live)
        check_onto(onto, 0 if onto is None else len(self._cells[onto]), state.start)
        check_room(state, self.config, self.free_cells, self._live)
        seq = self.seq_new() if onto is None else self.seq_clone(onto, state.start)
        placed = [self._place(seq) for _ in range(state.n_tokens)]  # (page, slot) each
        if "load_tail_misplaced" in self.bugs:
            first = state.start - state.start % self.block_size  # as if the tail began a block
            placed = [divmod(first + i, self.block_size) for i in range(state.n_tokens)]
            placed = [(self._tables[seq][block], slot) for block, slot in placed]
        pages, slots = np.array(placed, dtype=np.int64).reshape(-1, 2).T
        for layer, is_converted in enumerate(convert):
            for which, pool in enumerate((self._pages.k, self._pages.v)):
                entries = (state.k, state.v)[which][layer]
                if is_converted and state.geometry.formats[layer][which] == "bfloat16":
                    entries = (entries.astype(np.uint32) << np.uint32(16)).view(np.float32)
                if is_converted:  # a float format (load_plan): exact as float32, then stored
                    entries = entries.astype(np.float32).astype(self.config.storage_dtype)
                pool[layer, pages, slots] = entries
        self._changed()
        return seq

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

    def prepare_step(self, width: int | None = None) -> CowStep:
        """Places the declared tokens, each at its sequence's next position (`_place`); rows
        past the declared count (width > n) are padding, -1 everywhere."""
        if self._declared is None:
            raise StepError("prepare_step() with nothing declared; call declare_step() first")
        seq_ids = self._declared
        width = calls.check_width(width, len(seq_ids), self.config.max_width)
        rows = np.full((4, width), -1, dtype=np.int32)  # positions, ids, pages, slots
        for t, seq in enumerate(seq_ids.tolist()):
            rows[:, t] = len(self._cells[seq]), seq, *self._place(seq)
        self._changed()  # an earlier step is stale, the declaration consumed
        self._step = CowStep(positions=rows[0], seq_ids=rows[1], pages=rows[2], slots=rows[3])
        return self._step

    def write(self, layer: int, k: ArrayLike, v: ArrayLike) -> None:
        """Stores the step's K and V rows (k, v: [width, n_kv_heads, head_dim], any real
        float dtype) in their slots, rounded to float32, then to the storage dtype."""
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        k, v = arrays.host_floats("k", k), arrays.host_floats("v", v)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        values.check_shape("k", k.shape, shape), values.check_shape("v", v.shape, shape)
        real, dtype = step.seq_ids >= 0, self.config.storage_dtype
        slots = layer, step.pages[real], step.slots[real]
        self._pages.k[slots] = np.asarray(k[real], dtype=np.float32).astype(dtype)
        self._pages.v[slots] = np.asarray(v[real], dtype=np.float32).astype(dtype)
        self._written.add(layer)

    def attend(self, layer: int, q: ArrayLike, scale: float | None = None,
               mode: str = "gathered") -> np.ndarray:  # fmt: skip
        """[width, n_heads, head_dim] float32: each token's attention over its sequence's
        positions [max(0, p - W + 1), p] (W = config.windows[layer], 0 = all of [0, p]),
        read through its block table in either mode; padding rows 0. q: [width, n_heads,
        head_dim], query head h reading KV head h // (n_heads // n_kv_heads); scale default
        1 / sqrt(head_dim). Requires write(layer, ...) in this step."""
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        calls.check_mode(mode)
        if layer not in self._written:
            raise StepError(f"attend({layer}) before write({layer}) in this step")
        q = arrays.host_floats("q", q).astype(np.float32)
        n_heads = calls.check_query(q.shape, step.width, self.config)
        scale = calls.check_scale(scale, self.config.head_dim)
        n_kv, window = self.config.n_kv_heads, self.config.windows[layer]
        kv_head = np.arange(n_heads) // (n_heads // n_kv)
        out = np.zeros(q.shape, dtype=np.float32)
        for t, (seq, p) in enumerate(zip(step.seq_ids.tolist(), step.positions.tolist(),
                                         strict=True)):  # fmt: skip
            if seq < 0:  # padding
                continue
            first = max(0, p - window + 1) if window else 0
            if "window_whole_blocks" in self.bugs:
                first -= first % self.block_size
            seen = np.arange(first, p + 1)
            pages = np.asarray(self._tables[seq])[seen // self.block_size]
            slots = layer, pages, seen % self.block_size
            out[t] = paged_attend(q[t], self._pages.k[slots], self._pages.v[slots], kv_head,
                                  scale)  # fmt: skip
        return out

    # -- state -----------------------------------------------------------------

    def pos(self, seq: int) -> int:
        """Positions `seq` holds: the position its next token gets."""
        return len(self._cells[calls.check_live(seq, self._live)])

    @property
    def live_seqs(self) -> list[int]:
        """The live ids, ascending."""
        return np.flatnonzero(self._live).tolist()

    @property
    def used_cells(self) -> int:
        """Positions held, a position shared by clones once."""
        return len(self._held)

    @property
    def free_cells(self) -> int:
        return self.config.capacity - self.used_cells

    def check_invariants(self) -> None:
        """Raises AssertionError unless each page's count is the number of tables holding
        it, the free list holds exactly the pages no table holds, once each, and each live
        sequence has ceil(pos / block_size) pages."""
        refs, free = self._pages.refs.tolist(), self._pages.free
        held = Counter(page for table in self._tables for page in table)
        if held != Counter({page: n for page, n in enumerate(refs) if n}):
            raise AssertionError(f"cow cache: refs {refs}, tables hold {dict(held)}")
        if sorted(free) != [page for page, n in enumerate(refs) if n == 0]:
            raise AssertionError(f"cow cache: free list {free}, refs {refs}")
        for seq in self.live_seqs:
            table, n = self._tables[seq], len(self._cells[seq])
            if len(table) != -(-n // self.block_size):
                raise AssertionError(f"cow cache: sequence {seq} has {len(table)} pages for {n}")

    def _place(self, seq: int) -> tuple[int, int]:
        """(page, slot) of `seq`'s next position, which it now holds with a new cell: a new
        page at a block's start; a copy of the last page when another table holds it."""
        table, p = self._tables[seq], len(self._cells[seq])
        slot, pages = p % self.block_size, self._pages
        shared = pages.flagged if "cow_by_flag" in self.bugs else pages.refs > 1
        if not slot:
            table.append(pages.alloc())
        elif shared[table[-1]]:
            table[-1] = self._pages.copy(table[-1], slot, v="cow_copies_k_only" not in self.bugs)
        self._cells[seq].append(self._next_cell)
        self._held[self._next_cell] = 1
        self._next_cell += 1
        return table[-1], slot

    def _free_id(self) -> int:
        free = np.flatnonzero(~self._live)
        if len(free) == 0:
            raise CapacityError(f"all {self.config.max_seqs} sequence ids are live; seq_rm() one")
        return int(free[0])

    def _truncate(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position: its hold on their cells and pages."""
        keep = -(-position // self.block_size)
        self._pages.release(self._tables[seq][keep:])
        del self._tables[seq][keep:]
        self._held.subtract(self._cells[seq][position:])
        self._held = +self._held  # forget cells no sequence holds
        del self._cells[seq][position:]

    def _current_step(self) -> CowStep:
        if self._step is None:
            raise StepError("no prepared step; call declare_step() and prepare_step() first")
        return self._step

    def _changed(self) -> None:
        """A verb changed the tables or the declaration: the step is stale, none declared."""
        self._declared = None
        if self._step is not None:
            self._step.is_stale = True
        self._step, self._written = None, set()
