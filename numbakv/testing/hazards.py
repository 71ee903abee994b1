"""Hazard scenarios: short op scripts, fixed for a config, that walk the known hazards of KV
caches (forks inside a block, rewinds into shared cells, ids reused, windows at their edge,
padding, growth inside a step, GQA groups, long sequences, the step protocol's rules).
`check_cache` runs every one before its random workloads, so a cache that fails one fails
it whatever the seed, and the failure names it: `hazard 'fork-partial-then-append' at
offset 3 of 24`. `HAZARDS` maps each name to what it walks and its scripts (`scripts(config)`:
(label, ops) pairs). Ids are those `seq_new` hands out (the lowest free: 0, then 1, ...).
The fork, rewind and reload hazards scale with the layout: they cut at the edges of block
sizes up to 8, 16 and 32, or of the block size given (`cuts`, `BLOCKWISE`). NumPy only.
"""

from collections.abc import Callable, Iterable, Iterator

from numbakv.core.config import CacheConfig
from numbakv.testing.op import Op
from numbakv.testing.workloads import GROUPS, READS

Scripts = Iterator[tuple[str, list[Op]]]


class Script:
    """An op script under construction, opening `n_seqs` sequences (ids 0, 1, ...); each
    step's seed is its index (distinct K/V)."""

    def __init__(self, config: CacheConfig, n_seqs: int = 1):
        self.config, self.ops = config, [Op("seq_new")] * n_seqs

    def add(self, verb: str, *args) -> "Script":
        self.ops.append(Op(verb, args))
        return self

    def step(self, ids, width=None, group: int = 1, *mode: str) -> "Script":
        return self.add("step", tuple(ids), width, group, len(self.ops), *mode)

    def prefill(self, seq: int, n: int) -> "Script":
        """n tokens of `seq`, max_width at a time."""
        for start in range(0, n, self.config.max_width):
            self.step([seq] * min(self.config.max_width, n - start))
        return self

    def attend(self, layer, rows: int, n_heads: int, scale=None, mode=None) -> "Script":
        return self.add("attend", layer, rows, n_heads, len(self.ops), scale, mode)


def span(config: CacheConfig) -> int:
    """The length of the sequences the id-reuse and clear hazards fill: as long as two of it
    fit (beside two tokens each), at most 24 (6 blocks of 4)."""
    return max(1, min(config.max_seq_len - 2, (config.capacity - 4) // 2, 24))


SMALL_BLOCKS = 8  # block sizes up to 8: the fork hazards cut at every position to 2 * 8 + 1
LARGE_BLOCKS = (16, 32)  # larger block sizes whose edges they cut at by default


def room(config: CacheConfig) -> int:
    """The longest sequence the fork and rewind hazards fork: it, and two more tokens of
    each side of the fork, fit in max_seq_len and in the pool."""
    return max(1, min(config.max_seq_len - 2, config.capacity - 4))


def edges(block_size: int) -> set[int]:
    """0, 1, N-1, N, N+1, 2N-1, 2N and 2N+1 positions for N = `block_size`: nothing, one
    token, a partial block, one whole block, one past, a partial second one, two whole ones
    and one past them."""
    n = block_size
    return {0, 1, n - 1, n, n + 1, 2 * n - 1, 2 * n, 2 * n + 1}


def larger(block_size: int | None) -> tuple[int, ...]:
    """The block sizes past SMALL_BLOCKS whose edges are cut: `block_size`, or by default
    LARGE_BLOCKS."""
    if block_size is None:
        return LARGE_BLOCKS
    return (block_size,) if block_size > SMALL_BLOCKS else ()


def cuts(config: CacheConfig, block_size: int | None = None) -> list[int]:
    """The positions the fork, rewind and reload hazards cut at: every one up to 2 * 8 + 1
    (so every block size up to 8 is forked whole, partial and past two blocks), and the
    `edges` of `block_size` (default 16 and 32), as far as `room(config)` reaches."""
    wanted = set(range(2 * SMALL_BLOCKS + 2)).union(*map(edges, larger(block_size)))
    return sorted(cut for cut in wanted if cut <= room(config))


def forked(config: CacheConfig, offset: int) -> int:
    """The length of the sequence a fork at `offset` cuts: 24 (every block of up to 8 past
    the first positions), or two past the offset, as far as `room(config)` reaches."""
    return min(room(config), max(3 * SMALL_BLOCKS, offset + 2))


def fork_partial(config: CacheConfig, block_size: int | None = None) -> Scripts:
    for offset in cuts(config, block_size):
        n = forked(config, offset)
        s = Script(config).prefill(0, n).add("seq_clone", 0, offset)
        yield f"at offset {offset} of {n}", s.step([0, 1]).step([1]).step([0]).ops


def fork_whole(config: CacheConfig, block_size: int | None = None) -> Scripts:
    for n in cuts(config, block_size):
        s = Script(config).prefill(0, n).add("seq_clone", 0, None)
        yield f"of length {n}", s.step([1]).step([1, 0]).step([0]).ops


def rewind_shared(config: CacheConfig, block_size: int | None = None) -> Scripts:
    """A whole fork of min(24, room) positions rewound to each position up to 2 * 8 + 1
    (into a shared whole block of every block size up to 8); and of 2N and 2N + 1 (two
    whole blocks, and a partial third) for each larger block size N, rewound into or to the
    edge of each whole block (N - 1, N, N + 1, 2N - 1, 2N)."""
    n, limit = min(3 * SMALL_BLOCKS, room(config)), room(config)
    forks = [(n, range(min(n, 2 * SMALL_BLOCKS + 1) + 1))]
    for size in larger(block_size):
        inside = (size - 1, size, size + 1, 2 * size - 1, 2 * size)
        forks += [(m, inside) for m in (2 * size, 2 * size + 1) if m <= limit]
    for n, positions in forks:
        for who, name in ((0, "parent"), (1, "clone")):
            for position in positions:
                s = Script(config).prefill(0, n).add("seq_clone", 0, None)
                s.add("rewind", who, position).step([0, 1]).step([who]).step([1 - who])
                yield f"{name} of {n} to {position}", s.ops


def rewind_every(config: CacheConfig, block_size: int | None = None) -> Scripts:
    """A sequence as long as the config holds (n) rewound to each position up to 24 when n
    is at most 24, else to each up to 2 * 8 + 1, to each larger block size's `edges` and to
    n - 1 and n."""
    n = min(config.max_seq_len, config.capacity)
    every = 3 * SMALL_BLOCKS if n <= 3 * SMALL_BLOCKS else 2 * SMALL_BLOCKS + 1
    wanted = set(range(every + 1)).union(*map(edges, larger(block_size)))
    for position in sorted(p for p in wanted | {n - 1, n} if 0 <= p <= n):
        s = Script(config).prefill(0, n).add("rewind", 0, position)
        yield f"to {position} of {n}", s.step([0]).step([0] * min(2, config.max_width)).ops


def remove_parent(config: CacheConfig, block_size: int | None = None) -> Scripts:
    for offset in cuts(config, block_size):
        s = Script(config).prefill(0, forked(config, offset))
        s.add("seq_clone", 0, offset).add("seq_rm", 0)
        s.step([1]).step([1]).add("seq_new").step([0]).add("seq_rm", 1)
        yield f"at offset {offset}", s.step([0]).ops


def id_reuse(config: CacheConfig) -> Scripts:
    for n in sorted({1, span(config) // 2, span(config)}):
        s = Script(config).prefill(0, n).add("seq_rm", 0).add("seq_new")
        yield f"of the only sequence, of {n}", s.step([0]).step([0]).ops
    if config.max_seqs < 2:
        return
    for n in sorted({1, span(config) // 2, span(config)}):
        s = Script(config, 2).prefill(0, n).prefill(1, n).add("seq_rm", 0).add("seq_new")
        yield f"of a sequence of {n}", s.step([0]).step([0, 1]).ops
        s = Script(config).prefill(0, n).add("seq_clone", 0, None).add("seq_rm", 1)
        yield f"of a clone of {n}", s.add("seq_new").step([1]).step([0, 1]).ops


def clear_reuse(config: CacheConfig) -> Scripts:
    for n in sorted({1, span(config)}):
        s = Script(config).prefill(0, n).add("seq_clone", 0, None).add("clear")
        yield f"after {n} positions", s.add("seq_new").step([0]).add("seq_new").step([1, 0]).ops


def window_edges(config: CacheConfig) -> Scripts:
    for window in sorted(set(config.windows) - {0}):
        for p in (window - 2, window - 1, window, window + 1, config.max_seq_len - 1):
            if 0 <= p < config.max_seq_len and p < config.capacity:
                yield f"W={window}, a decode at {p}", Script(config).prefill(0, p).step([0]).ops
        n = min(window + 1, config.max_width, config.capacity)
        yield f"W={window}, a prefill of {n}", Script(config).step([0] * n).ops


def padding(config: CacheConfig) -> Scripts:
    for n in range(1, config.max_width):
        for width in sorted({n + 1, config.max_width}):
            s = Script(config).step([0] * n, width).step([0], width, 2, "masked")
            yield f"{n} tokens in width {width}", s.ops
    if config.capacity == config.max_seq_len:  # padding beside the last cell (index -1)
        s = Script(config).prefill(0, config.capacity - 1).step([0], 2)
        yield "of the step that takes the last cell", s.step([0]).ops


def growth(config: CacheConfig) -> Scripts:
    cells, room = config.initial_cells, config.capacity - config.max_width
    for filled in sorted({cells - 1, cells, 2 * cells - 1, 4 * cells - 1}):
        if 0 <= filled <= room and config.max_seqs >= 2 and filled <= config.max_seq_len:
            s = Script(config, 2).prefill(0, filled)
            ids = [1, 0] * config.max_width
            yield f"at {filled} cells", s.step(ids[: config.max_width]).step([0]).ops


def gqa(config: CacheConfig) -> Scripts:
    n = min(3, config.max_width)
    for group in range(1, max(GROUPS) + 1):
        s = Script(config).step([0] * n, None, group).step([0], None, group, "masked")
        s.add("prepare", None)  # refused: nothing declared; the step stays valid
        yield f"group {group}", s.attend(0, 1, group * config.n_kv_heads, 0.5).ops


def long_sequences(config: CacheConfig) -> Scripts:
    n = min(config.max_seq_len, config.capacity)
    s = Script(config).prefill(0, n).step([0]).add("rewind", 0, n - 1).step([0])
    yield f"one to {n}", s.add("seq_clone", 0, None).step([1]).ops
    if config.max_seqs >= 2 and 2 * n <= config.capacity:
        s = Script(config, 2)
        for _ in range(-(-n // config.max_width)):
            s.step([0, 1] * (config.max_width // 2) or [0])
        yield f"two to {n}", s.step([1]).step([0]).ops


def full_cache(config: CacheConfig) -> Scripts:
    n_seqs = min(config.max_seqs, -(-config.capacity // config.max_seq_len))
    s = Script(config, n_seqs)
    for seq in range(n_seqs):
        s.prefill(seq, min(config.max_seq_len, config.capacity - seq * config.max_seq_len))
    s.step([0]).add("rewind", 0, 0).step([0]).add("seq_rm", 0).add("seq_new").step([0])
    yield "of cells", s.ops
    s = Script(config, config.max_seqs).add("seq_new").add("seq_clone", 0, None).add("seq_rm", 0)
    yield "of ids", s.add("seq_clone", 1, None).add("seq_new").step([0]).ops


def wrap_round(config: CacheConfig) -> Scripts:
    """Every cell taken but `spare`, the first or second sequence removed, then steps that
    take the spare cells at the end and the freed ones before them (a ring's head wraps
    round: the cells it passes on the way may still be held)."""
    h = min(config.max_width // 2, config.capacity // 3)
    n = config.capacity - 2 * h + 1  # one more than the cells past the head
    if config.max_seqs >= 2 and h and n <= config.max_seq_len:
        s = Script(config, 2).step([0] * h + [1] * h).add("rewind", 1, 0).prefill(1, n)
        yield "past held cells to freed ones", s.step([0]).step([0, 1]).ops
    n_seqs = -(-config.capacity // config.max_seq_len)
    for removed in range(min(2, n_seqs - 1)):
        for spare in range(3):
            s, left = Script(config, n_seqs), config.capacity - spare
            for seq in range(n_seqs):
                s.prefill(seq, min(config.max_seq_len, left - seq * config.max_seq_len))
            s.add("seq_rm", removed).add("seq_new")
            n = min(spare + 2, config.max_width)
            s.step([removed] * n, config.max_width).step([removed], None, 2).step([0])
            yield f"with {spare} cells spare, sequence {removed} removed", s.step([0, 1]).ops


def interleaved(config: CacheConfig) -> Scripts:
    if config.max_seqs < 3 or config.max_width < 4:
        return
    s = Script(config, 3).step([1]).step([2])
    yield "prefill beside decodes", s.step([0, 1, 0, 2][: config.max_width]).step([2, 1, 0]).ops
    yield "alternating", Script(config, 2).step([0, 1, 0, 1]).step([1, 0]).step([0]).ops


STALE_AFTER = (("seq_new",), ("seq_clone", 0, None), ("seq_rm", 1), ("rewind", 0, 1),
               ("clear",), ("declare", (0,)), ("prepare", None))  # fmt: skip


def stale_reads(config: CacheConfig) -> Scripts:
    if config.max_seqs < 2:
        return
    for verb, *args in STALE_AFTER:
        s = Script(config, 2).step([0, 0, 1][: config.max_width])
        if verb == "prepare":
            s.add("declare", (0,))
        s.add(verb, *args)
        for field in READS["table"]:
            s.add("read", *(("mask", config.windows[0]) if field == "mask" else (field,)))
        yield f"after {verb}", s.add("write", 0, 1, 0).attend(0, 1, config.n_kv_heads).ops


BETWEEN = (("seq_new",), ("seq_clone", 0, None), ("seq_rm", 0), ("rewind", 0, 0), ("clear",),
           ("seq_rm", -1), ("rewind", 0, 99), ("seq_clone", 5, None))  # fmt: skip


def declare_then_verb(config: CacheConfig) -> Scripts:
    for verb, *args in BETWEEN:
        s = Script(config).step([0]).add("declare", (0, 0)[: config.max_width]).add(verb, *args)
        label = f"{verb}{tuple(args)!r}" if args else verb
        yield f"{label} in between", s.add("prepare", None).add("read", "positions").ops


def step_rules(config: CacheConfig) -> Scripts:
    n, n_kv = min(2, config.max_width), config.n_kv_heads
    s = Script(config).step([0] * n).add("seq_clone", 0, n + 1).add("seq_clone", 0, -1)
    s.add("seq_clone", 0, 0.5).add("rewind", 0, n + 1).add("rewind", 0, -1).add("seq_rm", -1)
    s.add("seq_clone", config.max_seqs, None).add("rewind", config.max_seqs, 0)
    yield "refused verbs", s.add("declare", (0, config.max_seqs)).step([0]).ops
    s = Script(config).add("declare", (0,) * n).add("prepare", None)
    yield "attend before write", s.attend(0, n, n_kv).add("write", 0, n, 1).attend(0, n, n_kv).ops
    s = Script(config).step([0] * n).add("write", config.n_layers, n, 1).add("write", -1, n, 1)
    s.attend(config.n_layers, n, n_kv).attend(1.5, n, n_kv)
    yield "refused layers", s.add("read", "mask", max(config.windows) + 1).step([0]).ops
    s = Script(config).step([0] * n).attend(0, n, n_kv + 1 if n_kv > 1 else 0)
    yield "refused heads", s.attend(0, n + 1, n_kv).add("write", 0, n + 1, 2).add(
        "write", 0, n, 3, "int32").ops  # fmt: skip
    s = Script(config).add("declare", (0,) * n).add("prepare", n - 1).add("prepare", 1.5)
    s.add("prepare", config.max_width + 1).add("prepare", n).add("prepare", None)
    yield "refused widths", s.add("declare", ()).add("declare", 3).add(
        "declare", (0,) * (config.max_width + 1)).step([0]).ops  # fmt: skip
    s = Script(config).step([0] * n).attend(0, n, n_kv, 0.5, "masked").attend(0, n, 2 * n_kv, 2.0)
    s.attend(0, n, n_kv, 0.0).attend(0, n, n_kv, -1.0).attend(0, n, n_kv, "0.5")
    yield (
        "scales and modes",
        s.attend(0, n, n_kv, None, "sparse").attend(0, n, n_kv, None, "gathered").ops,
    )


HAZARDS: dict[str, tuple[str, Callable[[CacheConfig], Scripts]]] = {
    "fork-partial-then-append": ("a fork at every offset to 17 and at each block size's "
                                 "edges, then both append", fork_partial),
    "fork-whole-then-append": ("a whole fork of every length to 17 and of each block size's "
                               "edges, then both append", fork_whole),
    "rewind-into-shared": ("parent or clone rewound into shared cells (into shared whole "
                           "blocks), then both append", rewind_shared),
    "rewind-to-every-position": ("rewind to 0 and to every position (past 24, to a block "
                                 "size's edges and the last two), then append",
                                 rewind_every),
    "id-reuse-after-removal": ("a removed id handed out again, then used", id_reuse),
    "remove-parent-after-fork": ("the parent removed after a fork, the clone appends, then "
                                 "goes too", remove_parent),
    "clear-then-reuse": ("clear, then new sequences", clear_reuse),
    "window-edges": ("histories of W-2, W-1, W, W+1 and far past W", window_edges),
    "padding-rows": ("steps padded past their tokens, every count", padding),
    "growth-mid-step": ("a step whose cells cross the pool's growth", growth),
    "gqa-groups": ("1 to 8 query heads per KV head", gqa),
    "long-sequences": ("sequences up to max_seq_len, and one past it", long_sequences),
    "full-cache": ("every cell or every id taken", full_cache),
    "wrap-round": ("the cells at the end and the freed ones at the start in one step",
                   wrap_round),
    "interleaved-tokens": ("one step of several sequences' tokens interleaved", interleaved),
    "stale-step-reads": ("every field of a step after each verb", stale_reads),
    "verb-between-declare-and-prepare": ("each verb, accepted or refused, in between",
                                         declare_then_verb),
    "step-rules": ("refused verbs; attend before write, refused layers, heads, widths, "
                   "scales, modes",
                   step_rules),
}  # fmt: skip


def reload_into_holes(config: CacheConfig, block_size: int | None = None) -> Scripts:
    """Two sequences of n interleaved cell by cell, one removed; the other reloaded whole
    (into the holes: in a full config the pool's tail is too short), reloaded again (too
    few cells or ids: refused where the pool is full), and both append. Then the copies
    removed, the sequence cut to m positions, its tail from each start of `cuts` reloaded
    onto it, and both append, the reloaded one first: its step reads the reloaded tail
    through every global layer (docs/contract.md §13). n and m as large as the appends
    fit."""
    c, length, width = config.capacity, config.max_seq_len, config.max_width
    if width < 2 or config.max_seqs < 2:
        return
    n = max(1, min(length - 1, (c - 2) // 2))
    second = config.max_seqs >= 3 and c - 2 * n >= n  # the second whole reload is taken
    taken = 3 * n if second else 2 * n  # the cells held after the whole reloads
    held = n + 1 if c - taken >= 2 else n  # the first's positions once both appended
    for start in cuts(config, block_size):
        m = min(held, length - 2, (c - 3 + start) // 2)  # m + (m - start) + 3 cells
        if not 0 < start < m:
            continue
        s = Script(config, 2)
        for done in range(0, n, width // 2):
            s.step([0, 1] * min(width // 2, n - done))
        s.add("seq_rm", 1).add("reload", 0, 0).add("reload", 0, 0).step([1, 0]).add("seq_rm", 1)
        if second:
            s.add("seq_rm", 2)
        if m < held:
            s.add("rewind", 0, m)
        s.add("reload", 0, start).step([1]).step([0, 1])
        yield f"of {n}, then the tail from {start} of {m} onto it", s.ops


# hazards of the optional kinds (`workloads.OPTIONAL_KINDS`): run only when asked for
OPTIONAL_HAZARDS: dict[str, tuple[str, Callable[[CacheConfig], Scripts]]] = {
    "reload-into-holes": ("a sequence reloaded into a fragmented pool, refused when full, "
                          "and its tail from each cut reloaded onto it, then read",
                          reload_into_holes),
}  # fmt: skip
ALL_HAZARDS = {**HAZARDS, **OPTIONAL_HAZARDS}
# the hazards that cut at a block size's edges (`cuts`): `scripts(..., block_size=)`
BLOCKWISE = ("fork-partial-then-append", "fork-whole-then-append", "rewind-into-shared",
             "rewind-to-every-position", "remove-parent-after-fork",
             "reload-into-holes")  # fmt: skip


def scripts(config: CacheConfig, compare: str = "semantic", names: Iterable[str] = HAZARDS,
            block_size: int | None = None) -> Iterator[tuple[str, str, list[Op]]]:  # fmt: skip
    """The scripts of the hazards `names` (default all but the optional ones) for `config`:
    (name, label, ops), in `ALL_HAZARDS` order; reads of the fields of `READS[compare]`
    only. Those of `BLOCKWISE` cut at the edges of `block_size` (default 16 and 32)
    besides every position up to 17 (`cuts`)."""
    fields, names = READS[compare], set(names)
    unknown = names - set(ALL_HAZARDS)
    if unknown:
        raise ValueError(f"no hazards {sorted(unknown)}; the hazards are {list(ALL_HAZARDS)}")
    for name, (_, make) in ALL_HAZARDS.items():
        if name not in names:
            continue
        made = make(config, block_size) if name in BLOCKWISE else make(config)
        for label, ops in made:
            yield name, label, [op for op in ops if op.verb != "read" or op.args[0] in fields]
