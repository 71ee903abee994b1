"""Op scripts: a workload as a list of `Op`s, run on the reference and a cache under test side
by side, compared after every op (`run_script`). What `check_cache` generates and shrinks,
and what its failure message prints, so that a failure replays with two lines:

    from numbakv.testing import Op, run_script
    run_script(factory, config, [Op("seq_new"), Op("step", ([0, 0], 3, 2, 7))])

An op is a verb of SPEC §2 with its arguments (`seq_new`, `seq_clone`, `seq_rm`, `rewind`,
`clear`) or a whole step: `Op("step", (seq_ids, width, group, seed))` declares `seq_ids`,
prepares `width` rows (None: the declared count), then per layer writes K/V and attends a q
of `group * n_kv_heads` query heads, all drawn from `seed`. NumPy only.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from numbakv.checks import as_host
from numbakv.config import TOLERANCE, CacheConfig
from numbakv.errors import CacheError
from numbakv.testing.compare import differences

COMPARES = ("semantic", "table")
VERBS = ("seq_new", "seq_clone", "seq_rm", "rewind", "clear", "step")


@dataclass(frozen=True)
class Op:
    """One operation of a workload: `verb` with `args` (see the module docstring)."""

    verb: str
    args: tuple = ()

    def __repr__(self) -> str:
        return f"Op({self.verb!r}, {self.args!r})" if self.args else f"Op({self.verb!r})"


class Divergence(AssertionError):
    """The cache under test differed from the reference. `ops` is the script up to and
    including the op that differed, `index` that op's index, `config` the CacheConfig."""

    def __init__(self, message: str, ops: Sequence[Op], index: int, config: CacheConfig):
        super().__init__(message)
        self.ops, self.index, self.config = list(ops), index, config


def script(ops: Sequence[Op]) -> str:
    """The ops as a Python list literal, one per line (what `run_script` takes)."""
    return "[\n" + "".join(f"    {op!r},\n" for op in ops) + "]"


def step_inputs(config: CacheConfig, width: int, group: int, seed: int, layer: int):
    """(k, v, q) of one layer of a step op: float32 normal, [width, n_kv_heads, head_dim]
    and [width, group * n_kv_heads, head_dim]."""
    rng = np.random.default_rng([seed, layer])
    kv = (width, config.n_kv_heads, config.head_dim)
    k, v = rng.standard_normal((2, *kv), dtype=np.float32)
    q = rng.standard_normal((width, group * config.n_kv_heads, config.head_dim), np.float32)
    return k, v, q


def apply(cache, op: Op, config: CacheConfig):
    """Runs `op` on `cache`: the verb's result, or for a step (the step, [per layer the
    attention output as a float32 array])."""
    if op.verb != "step":
        return getattr(cache, op.verb)(*op.args)
    seq_ids, width, group, seed = op.args
    cache.declare_step(list(seq_ids))
    step = cache.prepare_step(width)
    outs = []
    for layer in range(config.n_layers):
        k, v, q = step_inputs(config, step.width, group, seed, layer)
        cache.write(layer, k, v)
        outs.append(as_host(cache.attend(layer, q)).astype(np.float32, copy=False))
    return step, outs


def outcome(cache, op: Op, config: CacheConfig):
    """(result, None) or (None, the CacheError it raised)."""
    try:
        return apply(cache, op, config), None
    except CacheError as error:
        return None, error


class Runner:
    """The reference and a cache under test side by side: `run(op)` applies `op` to both and
    raises `Divergence` at the first difference (see `run_script` for `compare`)."""

    def __init__(self, factory: Callable[[CacheConfig], object], config: CacheConfig,
                 compare: str = "semantic", reference=None,
                 tolerance: float | None = None):  # fmt: skip
        if compare not in COMPARES:
            raise ValueError(f"compare={compare!r}: give one of {COMPARES}")
        if reference is None:
            from numbakv.reference import CellCache as reference
        self.config, self.compare, self.ops = config, compare, []
        self.tolerance = TOLERANCE[config.dtype] if tolerance is None else tolerance
        self.reference, self.cache = reference(config), factory(config)

    def run(self, op: Op) -> None:
        self.ops.append(op)
        expected = outcome(self.reference, op, self.config)
        got = outcome(self.cache, op, self.config)
        problem = differences(self.reference, self.cache, op, expected, got, self.compare,
                              self.tolerance)  # fmt: skip
        if problem:
            i = len(self.ops) - 1
            raise Divergence(_message(problem, self.ops, i, self.config), self.ops, i,
                             self.config)  # fmt: skip


def run_script(factory: Callable[[CacheConfig], object], config: CacheConfig,
               ops: Sequence[Op], compare: str = "semantic", reference=None,
               tolerance: float | None = None) -> None:  # fmt: skip
    """Runs `ops` on `factory(config)` and on the reference cache (or `reference`, a factory
    of the oracle), comparing after every op; raises `Divergence` at the first difference.

    compare   : "semantic" (any layout): the same refusals (error class), ids, pos of every
                live id, live ids, cells used, step positions/seq_ids/width/n_tokens, and
                attention outputs within `tolerance`; "table" (cell layouts) adds the
                snapshot, each step's cells and read_len, and every window's mask.
    tolerance : of attention outputs, relative to max(1, the row's largest |value|); by
                default `numbakv.config.TOLERANCE` of the storage dtype (a cache may compute
                in it); give TOLERANCE["float32"] for a cache that computes in float32
    """
    runner = Runner(factory, config, compare, reference, tolerance)
    for op in ops:
        runner.run(op)


def _message(problem: str, ops: Sequence[Op], index: int, config: CacheConfig) -> str:
    return (
        f"op {index} ({ops[index]!r}) differs from the reference: {problem}\n"
        f"config = {config!r}\n"
        f"ops = {script(ops)}\n"
        "replay: numbakv.testing.run_script(factory, config, ops)"
    )
