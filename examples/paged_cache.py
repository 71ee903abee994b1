"""A paged KV cache in the style of vLLM, held to numbakv's contract.

numbakv keeps K/V in one pool of per-token cells; many runtimes keep it in fixed-size pages
with a block table per sequence (vLLM's PagedAttention). This is such a cache, written as a
numbakv user would write one, that answers `numbakv.testing.protocol.CacheUnderTest`:

    PagePool      K/V pages of every layer, a reference count per page
    paged_attend  one token's attention, read through its block table
    PagedCache    the contract's verbs, step, errors and capacity over a PagePool

- A fork (`seq_clone(src, upto)`) shares the full pages of the prefix and copies the partial
  last one (copy-on-write); a `rewind` ending inside a shared page copies it too. So a
  shared page is always full, and a sequence writes only into pages it alone holds.
- Capacity is counted the reference's way, not in pages: `used_cells` counts positions
  held, one shared by clones (or copied on a fork) once, and a declaration needs a free
  cell per token, so this cache refuses where the reference does. The pool starts at
  ceil(initial_cells / block_size) pages and doubles when a step or a copy needs more.
- Planted bugs (`BUGS`), off by default: `PagedCache(config, bugs={"gqa_mapping"})`; each
  is a bug class that block-table caches have shipped.

Held to the contract by `numbakv.testing` (tests/testing/test_kit_on_the_paged_example.py):

    check_cache(lambda config: PagedCache(config, block_size=4))
"""

from collections import Counter

import numpy as np

from numbakv.core import arrays, calls, values
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CapacityError, ConfigError, StepError
from numbakv.core.values import int_at_least

BUGS = {
    "window_off_by_one": "a layer with window W attends W + 1 keys",
    "shared_partial_block": "a fork shares the partial last page instead of copying it",
    "rewind_keeps_one": "rewind(seq, p) keeps position p as well",
    "clone_one_too_many": "seq_clone(src, upto) shares position upto as well",
    "padding_nonzero": "padding rows of attend give q instead of 0",
    "gqa_mapping": "query head h reads KV head h % n_kv_heads",
    "rewind_to_zero_noop": "rewind(seq, 0) reads 0 as 'to the end' and drops nothing",
    "refcount_leak_on_remove": "seq_rm keeps its hold on the pages it shares, and their cells",
    "stale_table_after_growth": "a step that grew the pool writes its old pages to the old K/V",
    "reused_id_inherits": "seq_rm leaves the block table: the id's next user reads its pages",
    "window_off_by_one_at_edge": "the token at p = W - 1 (window W > 1) drops position 0",
    "decl_survives_rm": "a successful seq_clone, seq_rm, rewind or clear keeps the declaration",
}


class PagePool:
    """Fixed-size pages of K and V for every layer, with a reference count per page.

    k, v : [n_layers, n_pages, block_size, n_kv_heads, head_dim] of the storage dtype
    refs : [n_pages] int32, how many block tables hold each page (0 = free)
    """

    def __init__(self, config: CacheConfig, block_size: int, n_pages: int):
        shape = (config.n_layers, n_pages, block_size, config.n_kv_heads, config.head_dim)
        self.k, self.v = np.zeros((2, *shape), dtype=config.storage_dtype)
        self.refs = np.zeros(n_pages, dtype=np.int32)

    def alloc(self) -> int:
        """The lowest free page, now held once; the pool doubles when no page is free."""
        free = np.flatnonzero(self.refs == 0)
        if len(free) == 0:
            free = [len(self.refs)]
            self.k, self.v = (np.concatenate([x, np.zeros_like(x)], 1) for x in (self.k, self.v))
            self.refs = np.concatenate([self.refs, np.zeros_like(self.refs)])
        page = int(free[0])
        self.refs[page] = 1
        return page

    def copy(self, src: int, n_slots: int) -> int:
        """A new page holding the first `n_slots` slots of page `src`, in every layer."""
        dst = self.alloc()
        self.k[:, dst, :n_slots] = self.k[:, src, :n_slots]
        self.v[:, dst, :n_slots] = self.v[:, src, :n_slots]
        return dst

    def share(self, pages: list[int]) -> None:
        self.refs[pages] += 1  # a block table holds a page at most once

    def release(self, pages: list[int]) -> None:
        self.refs[pages] -= 1


def paged_attend(q: np.ndarray, k_pages: np.ndarray, v_pages: np.ndarray,
                 block_table: np.ndarray, positions: np.ndarray, kv_head: np.ndarray,
                 scale: np.float32) -> np.ndarray:  # fmt: skip
    """[n_heads, head_dim] float32: one token's attention over `positions` of its sequence.

    q            : [n_heads, head_dim] float32
    k_pages      : [n_pages, block_size, n_kv_heads, head_dim] of one layer; v_pages the same
    block_table  : [n_blocks] int, the page of each block of the sequence
    positions    : [n_keys] int, the positions the token sees
    kv_head      : [n_heads] int, the KV head each query head reads
    """
    block_size = k_pages.shape[1]
    pages, offsets = block_table[positions // block_size], positions % block_size
    k = k_pages[pages, offsets][:, kv_head].astype(np.float32)  # [n_keys, n_heads, head_dim]
    v = v_pages[pages, offsets][:, kv_head].astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf: float32 arithmetic
        scores = np.einsum("hd,nhd->hn", q, k) * scale
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return np.einsum("hn,nhd->hd", weights, v).astype(np.float32)


class PagedStep:
    """One prepared step (the contract's semantic fields, plus where each token went).

    positions, seq_ids : [width] int32, each token's position and sequence, -1 for padding
    pages, offsets     : [width] int32, the slot each token's K/V is written to, -1 padding
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
    pages = property(lambda self: self._get("pages"))
    offsets = property(lambda self: self._get("offsets"))
    width = property(lambda self: len(self._get("seq_ids")))
    n_tokens = property(lambda self: int(np.count_nonzero(self._get("seq_ids") >= 0)))


class PagedCache:
    """A block-table KV cache with the verbs, step protocol and errors of numbakv's contract.

    config     : a numbakv CacheConfig (dtype "float32" or "float16")
    block_size : positions per page
    bugs       : names of `BUGS` to switch on (to test a test kit); none by default

    Per live sequence: a block table (position p in slot p % block_size of page
    table[p // block_size]) and, to count capacity the reference's way, a logical cell id
    per position (a clone shares its source's, a step makes new ones).
    """

    def __init__(self, config: CacheConfig, block_size: int = 4, bugs=frozenset()):
        if not isinstance(config, CacheConfig):
            raise ConfigError(f"expected a CacheConfig, got {config!r}")
        if config.uniform_dtype not in ("float32", "float16"):  # one format, every K and V
            raise ConfigError(f"formats {config.formats}: this example stores float32 or float16")
        if unknown := set(bugs) - set(BUGS):
            raise ConfigError(f"unknown bugs {sorted(unknown)}; known: {sorted(BUGS)}")
        self.config = config
        self.block_size = int_at_least("block_size", block_size, 1)
        self.bugs = frozenset(bugs)
        self._step, self._declared = None, None  # the last PagedStep, the declared ids
        self.clear()

    # -- verbs -----------------------------------------------------------------

    def seq_new(self) -> int:
        """The lowest free id in [0, max_seqs), live and empty."""
        seq = self._free_id()
        self._live[seq] = True
        return seq

    def seq_clone(self, src: int, upto: int | None = None) -> int:
        """A new sequence sharing `src`'s positions [0, upto) (default all of them)."""
        src = calls.check_live(src, self._live)
        n = len(self._cells[src])
        upto = n if upto is None else calls.check_position("upto", upto, n, src)
        seq = self._free_id()
        if "clone_one_too_many" in self.bugs:
            upto = min(upto + 1, n)
        full, rest = divmod(upto, self.block_size)
        if rest and "shared_partial_block" in self.bugs:  # shared as though it were full
            full, rest = full + 1, 0
        table = self._tables[src][:full]
        self._pool.share(table)
        if rest:  # copy-on-write: the clone writes its next position into its own page
            table.append(self._pool.copy(self._tables[src][full], rest))
        self._tables[seq] = table
        self._cells[seq] = self._cells[src][:upto]
        self._held.update(self._cells[seq])
        self._live[seq] = True
        self._changed()
        return seq

    def seq_rm(self, seq: int) -> None:
        """Frees `seq`'s id, its pages no other table holds, and its cells no clone holds."""
        seq = calls.check_live(seq, self._live)
        table = self._tables[seq][:]
        if "refcount_leak_on_remove" in self.bugs:  # never lets go of what it shares
            shared = [page for page in table if self._pool.refs[page] > 1]  # a prefix
            self._pool.share(shared)
            self._held.update(self._cells[seq][: len(shared) * self.block_size])
        self._truncate(seq, 0)
        if "reused_id_inherits" in self.bugs:
            self._tables[seq] = table
        self._live[seq] = False
        self._changed()

    def rewind(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position; the id stays live."""
        seq = calls.check_live(seq, self._live)
        n = len(self._cells[seq])
        position = calls.check_position("position", position, n, seq)
        if "rewind_keeps_one" in self.bugs:
            position = min(position + 1, n)
        if "rewind_to_zero_noop" in self.bugs and position == 0:
            position = n
        self._truncate(seq, position)
        table, rest = self._tables[seq], position % self.block_size
        if rest and self._pool.refs[table[-1]] > 1:  # a partial page is never shared
            self._pool.release(table[-1:])  # the others still hold it: no alloc() takes it
            table[-1] = self._pool.copy(table[-1], rest)
        self._changed()

    def clear(self) -> None:
        """Every id, page and cell free; the step and any declaration dropped."""
        config = self.config
        n_pages = -(-config.initial_cells // self.block_size)  # doubles as steps need more
        self._pool = PagePool(config, self.block_size, n_pages)
        self._live = np.zeros(config.max_seqs, dtype=bool)
        self._tables: list[list[int]] = [[] for _ in range(config.max_seqs)]
        self._cells: list[list[int]] = [[] for _ in range(config.max_seqs)]
        self._held, self._next_cell = Counter(), 0  # logical cell -> sequences holding it
        self._changed()

    # -- the step --------------------------------------------------------------

    def declare_step(self, seq_ids) -> None:
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

    def prepare_step(self, width: int | None = None) -> PagedStep:
        """Places the declared tokens: each gets its sequence's next position and a slot
        in that sequence's last page, or in a new page when the last one is full. Rows
        past the declared count (width > n) are padding, -1 everywhere."""
        if self._declared is None:
            raise StepError("prepare_step() with nothing declared; call declare_step() first")
        seq_ids = self._declared
        width = calls.check_width(width, len(seq_ids), self.config.max_width)
        rows = np.full((4, width), -1, dtype=np.int32)  # positions, ids, pages, offsets
        n_pages = self.n_pages
        for t, seq in enumerate(seq_ids.tolist()):
            p = len(self._cells[seq])
            if p % self.block_size == 0:
                self._tables[seq].append(self._pool.alloc())
            rows[:, t] = p, seq, self._tables[seq][-1], p % self.block_size
            self._cells[seq].append(self._next_cell)
            self._held[self._next_cell] = 1
            self._next_cell += 1
        self._changed(consumed=True)  # an earlier step is stale
        grown = "stale_table_after_growth" in self.bugs and self.n_pages > n_pages
        self._lost = n_pages if grown else 0  # writes to pages below it go to the old K/V
        self._step = PagedStep(positions=rows[0], seq_ids=rows[1], pages=rows[2], offsets=rows[3])
        return self._step

    def write(self, layer: int, k, v) -> None:
        """Stores the step's K and V rows (k, v: [width, n_kv_heads, head_dim], any real
        float dtype) in their slots, rounded to float32, then to the storage dtype."""
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        k, v = arrays.host_floats("k", k), arrays.host_floats("v", v)
        shape = (step.width, self.config.n_kv_heads, self.config.head_dim)
        values.check_shape("k", k.shape, shape), values.check_shape("v", v.shape, shape)
        real, dtype = (step.seq_ids >= 0) & (step.pages >= self._lost), self.config.storage_dtype
        slots = layer, step.pages[real], step.offsets[real]
        self._pool.k[slots] = np.asarray(k[real], dtype=np.float32).astype(dtype)
        self._pool.v[slots] = np.asarray(v[real], dtype=np.float32).astype(dtype)
        self._written.add(layer)

    def attend(self, layer: int, q, scale: float | None = None, mode: str = "gathered"):
        """[width, n_heads, head_dim] float32: each token's attention over its own
        sequence's positions [max(0, p - W + 1), p] (W = config.windows[layer], 0 = all
        of [0, p]), which includes the tokens of its sequence placed before it in this step.

        q     : [width, n_heads, head_dim], n_heads a multiple of n_kv_heads; query head h
                reads KV head h // (n_heads // n_kv_heads)
        scale : default 1 / sqrt(head_dim)
        mode  : "gathered" or "masked": checked, both read through the block table
        Padding rows give 0. Requires write(layer, ...) in this step.
        """
        step = self._current_step()
        layer = calls.check_layer(layer, self.config.n_layers)
        calls.check_mode(mode)
        if layer not in self._written:
            raise StepError(f"attend({layer}) before write({layer}) in this step")
        q = arrays.host_floats("q", q).astype(np.float32)
        n_heads = calls.check_query(q.shape, step.width, self.config)
        scale = calls.check_scale(scale, self.config.head_dim)
        n_kv, window = self.config.n_kv_heads, self.config.windows[layer]
        heads = np.arange(n_heads)
        kv_head = heads % n_kv if "gqa_mapping" in self.bugs else heads // (n_heads // n_kv)
        seen = window + ("window_off_by_one" in self.bugs)
        out = np.zeros(q.shape, dtype=np.float32)
        k_pages, v_pages = self._pool.k[layer], self._pool.v[layer]
        ids, positions = step.seq_ids.tolist(), step.positions.tolist()
        for t, (seq, p) in enumerate(zip(ids, positions, strict=True)):
            if seq < 0:  # padding
                out[t] = q[t] if "padding_nonzero" in self.bugs else 0
                continue
            first = max(0, p - seen + 1) if window else 0
            if "window_off_by_one_at_edge" in self.bugs and p + 1 == window > 1:
                first = 1
            table, seen_positions = np.asarray(self._tables[seq]), np.arange(first, p + 1)
            out[t] = paged_attend(q[t], k_pages, v_pages, table, seen_positions, kv_head, scale)
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
        """Positions held, a position shared by clones (or copied on a fork) once."""
        return len(self._held)

    @property
    def free_cells(self) -> int:
        return self.config.capacity - self.used_cells

    @property
    def n_pages(self) -> int:
        """Pages in the pool, free ones included."""
        return len(self._pool.refs)

    def block_table(self, seq: int) -> list[int]:
        """A copy of `seq`'s block table: the page of each block, in order."""
        return list(self._tables[calls.check_live(seq, self._live)])

    def check_invariants(self) -> None:
        """Raises AssertionError unless each page's count is the number of tables holding
        it, each live sequence has ceil(pos / block_size) pages and a partial last page
        that no other table holds."""
        held = Counter(page for table in self._tables for page in table)
        counted = Counter({page: int(n) for page, n in enumerate(self._pool.refs) if n})
        if held != counted:
            raise AssertionError(f"paged cache: refs {dict(counted)}, tables hold {dict(held)}")
        for seq in self.live_seqs:
            table, n = self._tables[seq], len(self._cells[seq])
            if len(table) != -(-n // self.block_size):
                raise AssertionError(f"paged cache: sequence {seq} has {len(table)} pages for {n}")
            if n % self.block_size and held[table[-1]] > 1:
                raise AssertionError(f"paged cache: sequence {seq} shares its partial last page")

    def _free_id(self) -> int:
        free = np.flatnonzero(~self._live)
        if len(free) == 0:
            raise CapacityError(f"all {self.config.max_seqs} sequence ids are live; seq_rm() one")
        return int(free[0])

    def _truncate(self, seq: int, position: int) -> None:
        """Drops `seq`'s positions >= position: its pages past the last block it keeps,
        its hold on the cells of those positions."""
        keep = -(-position // self.block_size)
        self._pool.release(self._tables[seq][keep:])
        del self._tables[seq][keep:]
        self._held.subtract(self._cells[seq][position:])
        self._held = +self._held  # forget cells no sequence holds
        del self._cells[seq][position:]

    def _current_step(self) -> PagedStep:
        if self._step is None:
            raise StepError("no prepared step; call declare_step() and prepare_step() first")
        return self._step

    def _changed(self, consumed: bool = False) -> None:
        """A verb changed the table or the declaration: the last step is stale, the
        declaration dropped (consumed by prepare_step)."""
        if consumed or "decl_survives_rm" not in self.bugs:
            self._declared = None
        if self._step is not None:
            self._step.is_stale = True
        self._step, self._written = None, set()
