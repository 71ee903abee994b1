"""Random workloads: `decode` reads one integer as one op for the present state, in the mix
of a `Swarm` (which verbs, how often, hostile values or not, long prefills or not: each
workload of `check_cache` draws its own, as swarm testing does, so that orders rare in one
mix are common in another). NumPy only; the integers come from `numpy.random` seeded by
the caller, so a workload depends on the seed alone.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.testing.op import Op
from numbakv.testing.protocol import SEMANTIC_FIELDS

GROUPS = (1, 2, 4, 8)  # query heads per KV head of a step's attends (GQA)
KINDS = ("step", "seq_new", "seq_clone", "rewind", "seq_rm", "clear",
         "declare", "prepare", "write", "attend", "read")  # fmt: skip
# kinds a workload draws only when asked: "reload" is seq_save then seq_load (docs/contract.md
# §13), which a cache without saved sequences does not answer
OPTIONAL_KINDS = ("reload",)
ALL_KINDS = KINDS + OPTIONAL_KINDS
CLASSIC = (8, 3, 3, 3, 2, 1, 1, 1, 1, 1, 1, 0)  # each kind's weight in the default mix
PICKS = 8  # an id is a pick in [0, PICKS): 0-3 any live id, 4-5 one of the two highest
# live ids, 6 any id in [0, max_seqs], 7 a hostile one (see `decode`)
HOSTILE_POSITIONS = (-1, 0.5)  # refused: a negative position, one that is not an integer
HOSTILE_DECLARATIONS = (3, "0", None)  # not a list of ids
HOSTILE_SCALES = (0.0, -1.0, "0.5")  # not a finite positive real
SCALES = (0.5, 2.0)
CODES = 2**64  # an op is drawn as one integer below this, read digit by digit (`decode`)
READS = {  # the step fields a read op reads, by compare
    "semantic": (*SEMANTIC_FIELDS, "is_stale"),
    "table": (*SEMANTIC_FIELDS, "is_stale", "cells", "read_len", "windows", "mask"),
}


@dataclass(frozen=True)
class Swarm:
    """The mix of one workload: `weights`, one per kind of op (`ALL_KINDS`; 0 = never);
    `hostile`, whether ids, positions, layers, scales and modes may be hostile; `long`,
    whether steps favour prefills of max_width tokens of one sequence (so that sequences
    reach max_seq_len)."""

    weights: tuple[int, ...] = CLASSIC
    hostile: bool = True
    long: bool = False

    @classmethod
    def draw(cls, rng: np.random.Generator, kinds=KINDS) -> "Swarm":
        """A random mix of `kinds`: each on with probability 1/2 (steps always) at a weight
        in [1, 8]; hostile values in 3 mixes of 4; long prefills in 1 of 2."""
        on = (rng.random(len(KINDS)) < 0.5) & np.isin(KINDS, list(kinds))
        on[0] = True
        weights = [int(w) for w in np.where(on, rng.integers(1, 9, len(KINDS)), 0)]
        hostile, long = bool(rng.random() < 0.75), bool(rng.random() < 0.5)
        for kind in OPTIONAL_KINDS:  # drawn last and only when asked: KINDS' mixes stay
            weights.append(int(rng.integers(1, 9)) if kind in kinds and rng.random() < 0.5 else 0)
        return cls(tuple(weights), hostile, long)

    def __str__(self) -> str:
        pairs = zip(ALL_KINDS, self.weights, strict=True)
        mix = ", ".join(f"{kind} {w}" for kind, w in pairs if w)
        return f"{mix}; hostile {self.hostile}; long {self.long}"


class Digits:
    """An op's integer read as digits of mixed radix: `take(n)` is the next one in [0, n);
    a smaller integer is a simpler op (a step, of live ids, of fewer tokens)."""

    def __init__(self, code: int):
        self.code = code

    def take(self, n: int) -> int:
        self.code, digit = divmod(self.code, n)
        return digit


def hostile_ids(config: CacheConfig) -> tuple:
    """Ids no cache may take for a live one: negative, past max_seqs, not integers. Each is
    its own repr, so a printed script replays."""
    return (-1, -2, config.max_seqs + 1, 1.5, "0", None)


def decode(code: int, reference, config: CacheConfig, swarm: Swarm | None = None,
           width: int | None = None, compare: str = "semantic") -> Op:  # fmt: skip
    """The op of `code` for the present state of `reference` (anything with `live_seqs`,
    `pos(seq)` and `used_cells`: the reference cache, or a table's view of itself), in the
    mix of `swarm` (default `Swarm()`); `width` is the reference's valid step's (None:
    none), which write and attend ops mostly match.

    Ids: 3 in 4 live (any, or one of the two highest, so that ids past 63 carry tokens when
    they are live), else any id in [0, max_seqs] (max_seqs is never live) or a hostile one
    (`hostile_ids`). Positions, `upto` and a reload's `start` (half the time the whole
    sequence): from the end down to 0, one past the end, sometimes -1 or 0.5. Steps (and
    declarations): any ids, a prefill of one sequence beside one decode token of others (in
    either order or interleaved), one decode token of each of several sequences, or an empty
    declaration; up to one token too many; width the declared count, one more, or any in [0,
    max_width + 1]; 1, 2, 4 or 8 query heads per KV head; mode gathered or masked. Writes
    and attends: layers in range or not, the step's rows or one more, float16 or int32 K/V,
    heads not a multiple of n_kv_heads, scales 0.5, 2 or hostile, modes named or hostile.
    Reads: every field of `READS[compare]`, a mask of a window the config has or not.
    `clear` only when half the cells are used."""
    digits, live, swarm = Digits(code), list(reference.live_seqs), swarm or Swarm()

    def seq():
        pick = digits.take(PICKS)
        if live and pick < 4:  # counted from the highest, so that a used-up code gives it
            return live[-1 - digits.take(len(live))]
        if live and pick < 6:
            return live[-1 - digits.take(min(2, len(live)))]
        if pick < 7 or not swarm.hostile:
            return digits.take(config.max_seqs + 1)
        hostile = hostile_ids(config)
        return hostile[digits.take(len(hostile))]

    verb = _kind(digits, swarm.weights)
    if verb == "clear" and 2 * reference.used_cells < config.capacity:
        verb = "step"
    if verb == "step" and not live:
        verb = "seq_new"  # an empty cache opens a sequence before any step
    if verb in ("seq_new", "clear"):
        return Op(verb)
    if verb in ("step", "declare"):
        return _step(digits, seq, live, config, swarm, verb)
    if verb in ("prepare", "write", "attend", "read"):
        return _protocol(digits, verb, config, swarm, width, compare)
    target = seq()
    if verb == "seq_rm":
        return Op(verb, (target,))
    if verb in ("seq_clone", "reload") and digits.take(2):  # the whole sequence
        return Op(verb, (target, None if verb == "seq_clone" else 0))
    end = reference.pos(target) if target in live else config.max_seq_len
    back = digits.take(end + 2)
    position = end - back if back <= end else end + 1  # the end, down to 0, one past the end
    if swarm.hostile and digits.take(8) == 7:
        position = HOSTILE_POSITIONS[digits.take(len(HOSTILE_POSITIONS))]
    return Op(verb, (target, position))


def _kind(digits: Digits, weights: tuple[int, ...]) -> str:
    """The kind of op, drawn by weight (the first kinds, steps, at the smallest digits)."""
    draw = digits.take(sum(weights))
    for kind, weight in zip(ALL_KINDS, weights, strict=True):
        if draw < weight:
            return kind
        draw -= weight
    raise AssertionError("a draw below the total weight picks a kind")


def _step(digits: Digits, seq: Callable[[], object], live: list[int], config: CacheConfig,
          swarm: Swarm, verb: str) -> Op:  # fmt: skip
    """A step or declare op (see `decode`): its shape, mode, count, width and group, its
    ids, then the seed of its K/V and queries (the digits read last; 0 once used up)."""
    shape = digits.take(16)  # 0-7 any ids, 8-11 a prefill beside decodes, 12-14 decodes, 15 none
    mode = ("masked",) if digits.take(2) else ()
    n = 1 + digits.take(config.max_width + 1)
    if swarm.long and digits.take(2):
        shape, n = 8, config.max_width
    width_kind, group = digits.take(4), GROUPS[digits.take(len(GROUPS))]
    if shape < 8:
        ids = [seq() for _ in range(n)]
    elif shape < 12:
        ids = _prefill(digits, seq(), live, n)
    elif shape < 15:
        ids = _from_the_top(live, digits.take(len(live)) if live else 0)[:n]
    else:
        ids = []
    if verb == "declare":
        if swarm.hostile and digits.take(8) == 7:
            return Op(verb, (HOSTILE_DECLARATIONS[digits.take(len(HOSTILE_DECLARATIONS))],))
        return Op(verb, (tuple(ids),))
    width = (None, len(ids), len(ids) + 1, digits.take(config.max_width + 2))[width_kind]
    return Op("step", (tuple(ids), width, group, digits.take(2**16), *mode))


def _protocol(digits: Digits, verb: str, config: CacheConfig, swarm: Swarm,
              width: int | None, compare: str) -> Op:  # fmt: skip
    """A prepare, write, attend or read op (see `decode`)."""
    hostile = swarm.hostile and digits.take(4) == 3  # this op's one hostile value
    if verb == "prepare":
        widths = (None, width, digits.take(config.max_width + 2))
        return Op(verb, (1.5 if hostile else widths[digits.take(3)],))
    if verb == "read":
        fields, windows = READS[compare], config.distinct_windows
        field = fields[digits.take(len(fields))]
        if field != "mask":
            return Op(verb, (field,))
        window = max(windows) + 1 if hostile else windows[digits.take(len(windows))]
        return Op(verb, (field, window))
    layer = digits.take(config.n_layers)
    rows = digits.take(config.max_width + 1) if width is None else width
    seed = digits.take(2**16)
    bad = digits.take(3 if verb == "write" else 5) if hostile else -1  # which value is bad
    if bad == 0:
        layer = (-1, config.n_layers, 1.5)[digits.take(3)]
    if bad == 1:
        rows += 1
    if verb == "write":
        dtype = ("float16", "int32")[digits.take(2)] if bad == 2 else None
        return Op(verb, (layer, rows, seed, *([dtype] if dtype else [])))
    n_kv = config.n_kv_heads
    n_heads = GROUPS[digits.take(len(GROUPS))] * n_kv
    scale = (None, None, *SCALES)[digits.take(4)]
    mode = (None, "gathered", "masked")[digits.take(3)]
    if bad == 2:
        n_heads = n_kv + 1 if n_kv > 1 else 0
    if bad == 3:
        scale = HOSTILE_SCALES[digits.take(len(HOSTILE_SCALES))]
    if bad == 4:
        mode = "sparse"
    return Op(verb, (layer, rows, n_heads, seed, scale, mode))


def _prefill(digits: Digits, focus, live: list[int], n: int) -> list:
    """n tokens: a prefill of `focus` and one decode token of each of some other live ids,
    the prefill first, the decodes first, or a decode token after each prefill token."""
    others = [s for s in live if s != focus]
    others = _from_the_top(others, digits.take(len(others)) if others else 0)
    decodes = others[: digits.take(min(n, len(others) + 1))]
    prefill = [focus] * (n - len(decodes))
    order = digits.take(3)
    if order < 2:
        return prefill + decodes if order == 0 else decodes + prefill
    ids = []
    for i, token in enumerate(prefill):
        ids += [token, *decodes[i : i + 1]]
    return ids + decodes[len(prefill) :]


def _from_the_top(ids: list[int], skip: int) -> list[int]:
    """`ids` from the highest down, starting `skip` below the highest and wrapping round."""
    down = ids[::-1]
    return down[skip:] + down[:skip]
