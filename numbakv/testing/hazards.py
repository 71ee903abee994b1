"""Hazard scenarios: short op scripts, fixed for a config, that walk the known hazards of KV
caches (forks inside a block, rewinds into shared cells, ids reused, windows at their edge,
padding, growth inside a step, GQA groups, long sequences, the step protocol's rules).
`check_cache` runs every one before its random workloads, so a cache that fails one fails
it whatever the seed, and the failure names it: `hazard 'fork-partial-then-append' at
offset 3`. `HAZARDS` maps each name to what it walks and its scripts (`scripts(config)`:
(label, ops) pairs). Ids are those `seq_new` hands out (the lowest free: 0, then 1, ...).
NumPy only.
"""

from collections.abc import Callable, Iterable, Iterator

from numbakv.config import CacheConfig
from numbakv.testing.ops import Op
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
    """The length of the sequence the fork and rewind hazards cut at every position: as
    long as two of it fit (beside two tokens each), at most 24 (6 blocks of 4)."""
    return max(1, min(config.max_seq_len - 2, (config.capacity - 4) // 2, 24))


def fork_partial(config: CacheConfig) -> Scripts:
    n = span(config)
    for offset in range(n + 1):
        s = Script(config).prefill(0, n).add("seq_clone", 0, offset)
        yield f"at offset {offset}", s.step([0, 1]).step([1]).step([0]).ops


def fork_whole(config: CacheConfig) -> Scripts:
    for n in range(1, span(config) + 1):
        s = Script(config).prefill(0, n).add("seq_clone", 0, None)
        yield f"of length {n}", s.step([1]).step([1, 0]).step([0]).ops


def rewind_shared(config: CacheConfig) -> Scripts:
    n = span(config)
    for who, name in ((0, "parent"), (1, "clone")):
        for position in range(n + 1):
            s = Script(config).prefill(0, n).add("seq_clone", 0, None).add("rewind", who, position)
            yield f"{name} to {position}", s.step([0, 1]).step([who]).step([1 - who]).ops


def rewind_every(config: CacheConfig) -> Scripts:
    n = min(config.max_seq_len, config.capacity)
    for position in range(n + 1):
        s = Script(config).prefill(0, n).add("rewind", 0, position)
        yield f"to {position} of {n}", s.step([0]).step([0] * min(2, config.max_width)).ops


def remove_parent(config: CacheConfig) -> Scripts:
    n = span(config)
    for offset in range(n + 1):
        s = Script(config).prefill(0, n).add("seq_clone", 0, offset).add("seq_rm", 0)
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
    "fork-partial-then-append": ("a fork at every offset, then both append", fork_partial),
    "fork-whole-then-append": ("a whole fork of every length, then both append", fork_whole),
    "rewind-into-shared": ("parent or clone rewound into shared cells, then both append",
                           rewind_shared),
    "rewind-to-every-position": ("rewind to 0 and to every position, then append",
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


def reload_into_holes(config: CacheConfig) -> Scripts:
    """Two sequences interleaved cell by cell, one removed; the other reloaded whole (into
    the holes: the pool's tail is too short), reloaded again (too few cells or ids), and
    its second half reloaded onto it; then they append (docs/contract.md §13)."""
    n = max(1, min(config.max_seq_len - 1, config.capacity // 2))
    s = Script(config, 2)
    for _ in range(n):
        s.step([0, 1])
    s.add("seq_rm", 1).add("reload", 0, 0).add("reload", 0, 0).step([1, 0])
    s.add("seq_rm", 1).add("reload", 0, n // 2).step([1]).step([0, 1])
    yield f"of length {n}", s.ops


# hazards of the optional kinds (`workloads.OPTIONAL_KINDS`): run only when asked for
OPTIONAL_HAZARDS: dict[str, tuple[str, Callable[[CacheConfig], Scripts]]] = {
    "reload-into-holes": ("a sequence reloaded into a fragmented pool, refused when full, "
                          "and its tail reloaded onto it", reload_into_holes),
}  # fmt: skip
ALL_HAZARDS = {**HAZARDS, **OPTIONAL_HAZARDS}


def scripts(config: CacheConfig, compare: str = "semantic",
            names: Iterable[str] = HAZARDS) -> Iterator[tuple[str, str, list[Op]]]:  # fmt: skip
    """The scripts of the hazards `names` (default all but the optional ones) for `config`:
    (name, label, ops), in `ALL_HAZARDS` order; reads of the fields of `READS[compare]`
    only."""
    fields, names = READS[compare], set(names)
    unknown = names - set(ALL_HAZARDS)
    if unknown:
        raise ValueError(f"no hazards {sorted(unknown)}; the hazards are {list(ALL_HAZARDS)}")
    for name, (_, make) in ALL_HAZARDS.items():
        if name not in names:
            continue
        for label, ops in make(config):
            yield name, label, [op for op in ops if op.verb != "read" or op.args[0] in fields]
