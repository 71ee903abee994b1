"""Op scripts: a workload as a list of `Op`s, run on the reference and a cache under test side
by side, compared after every op (`run_script`). What `check_cache` generates and shrinks,
and what its failure message prints, so that a failure replays with two lines:

    from numbakv.testing import Op, run_script
    run_script(factory, config, [Op("seq_new"), Op("step", ([0, 0], 3, 2, 7))])

An op is a verb of docs/contract.md §2 with its arguments (`seq_new`, `seq_clone`, `seq_rm`,
`rewind`, `clear`) or a whole step: `Op("step", (seq_ids, width, group, seed))` declares
`seq_ids`, prepares `width` rows (None: the declared count), then per layer writes K/V and
attends a q of `group * n_kv_heads` query heads, all drawn from `seed`; an optional fifth
field, `Op("step", (seq_ids, width, group, seed, mode))`, is the attention mode ("gathered"
or "masked"; without it `attend` is called without `mode`, so its default). NumPy only.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from numbakv.checks import as_host
from numbakv.config import TOLERANCE, CacheConfig
from numbakv.errors import CacheError
from numbakv.testing.compare import differences, outcome_difference
from numbakv.testing.state import after_op, observed, refusal_changed, track_step

COMPARES = ("semantic", "table")
VERBS = ("seq_new", "seq_clone", "seq_rm", "rewind", "clear", "step")
MODES = ("gathered", "masked")

Check = Callable[..., "str | None"]  # check(reference, cache, op, expected, got)


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
    attention output as a host array, of the dtype the cache returned])."""
    if op.verb != "step":
        return getattr(cache, op.verb)(*op.args)
    seq_ids, width, group, seed, *mode = op.args
    keywords = {"mode": mode[0]} if mode else {}
    cache.declare_step(list(seq_ids))
    step = cache.prepare_step(width)
    outs = []
    for layer in range(config.n_layers):
        k, v, q = step_inputs(config, step.width, group, seed, layer)
        cache.write(layer, k, v)
        outs.append(as_host(cache.attend(layer, q, **keywords)))
    return step, outs


def outcome(cache, op: Op, config: CacheConfig):
    """(result, None) or (None, the CacheError it raised)."""
    try:
        return apply(cache, op, config), None
    except CacheError as error:
        return None, error


class Runner:
    """The reference and a cache under test side by side: `run(op)` applies `op` to both and
    raises `Divergence` at the first difference (see `run_script` for `compare`, `tolerance`
    and `check`)."""

    def __init__(self, factory: Callable[[CacheConfig], object], config: CacheConfig,
                 compare: str = "semantic", reference=None,
                 tolerance: float | None = None, check: Check | None = None):  # fmt: skip
        if compare not in COMPARES:
            raise ValueError(f"compare={compare!r}: give one of {COMPARES}")
        if reference is None:
            from numbakv.reference import CellCache as reference
        self.config, self.compare, self.check, self.ops = config, compare, check, []
        self.tolerance = TOLERANCE[config.dtype] if tolerance is None else tolerance
        self.replay_keywords = "".join(  # the run_script keywords that replay this runner's ops
            text for text, given in ((f", compare={compare!r}", compare != "semantic"),
                                     (f", tolerance={tolerance!r}", tolerance is not None),
                                     (", check=check", check is not None)) if given
        )  # fmt: skip
        self.reference, self.cache = reference(config), factory(config)
        self.steps = None  # (the reference's, the cache's) last prepared step

    def run(self, op: Op) -> None:
        self.ops.append(op)
        before = observed(self.cache, self.compare)
        expected = outcome(self.reference, op, self.config)
        got = outcome(self.cache, op, self.config)
        problem = None
        if got[1] is not None and type(got[1]) is type(expected[1]):
            problem = refusal_changed(self.cache, self.compare, before)
        problem = problem or differences(self.reference, self.cache, op, expected, got,
                                         self.compare, self.tolerance)  # fmt: skip
        self._raise(problem or after_op(self, op, expected, got))

    def setup(self, ops: Sequence[Op]) -> None:
        """Runs `ops` (a prefix that makes a state: ids parked, sequences open) comparing
        each op's outcome (`outcome_difference`: the error class, the result) and, after
        the last, everything `run` compares; `run_script` of the printed script checks
        each of them fully."""
        for op in ops[:-1]:
            self.ops.append(op)
            expected = outcome(self.reference, op, self.config)
            got = outcome(self.cache, op, self.config)
            self._raise(outcome_difference(op, expected, got, self.compare, self.tolerance))
            track_step(self, op, expected, got)
        for op in ops[-1:]:
            self.run(op)

    def _raise(self, problem: str | None) -> None:
        if problem:
            i = len(self.ops) - 1
            raise Divergence(self._message(problem, i), self.ops, i, self.config)

    def _message(self, problem: str, index: int) -> str:
        return (
            f"op {index} ({self.ops[index]!r}) differs from the reference: {problem}\n"
            f"config = {self.config!r}\n"
            f"ops = {script(self.ops)}\n"
            f"replay: numbakv.testing.run_script(factory, config, ops{self.replay_keywords})"
        )


def run_script(factory: Callable[[CacheConfig], object], config: CacheConfig,
               ops: Sequence[Op], compare: str = "semantic", reference=None,
               tolerance: float | None = None, *, check: Check | None = None) -> None:  # fmt: skip
    """Runs `ops` on `factory(config)` and on the reference cache (or `reference`, a factory
    of the oracle), comparing after every op; raises `Divergence` at the first difference.

    compare   : "semantic" (any layout): the same refusals (error class), ids, pos of every
                live id, live ids, cells used and free, step positions/seq_ids/width/n_tokens,
                attention outputs within `tolerance` (float32 [width, n_heads, head_dim],
                padding rows exactly 0); a refused op leaves the cache as it was; the last
                step goes stale when the reference's does (then its fields raise StepError);
                `check_invariants()` holds after every op on a cache that has it. "table"
                (cell layouts) adds the snapshot, each step's cells and read_len, every
                window's mask (uint8 [width, read_len]) and, when the cache has `pool_kv`,
                the K/V bytes of every occupied cell.
    tolerance : of attention outputs, relative to max(1, the row's largest |value|); by
                default `numbakv.config.TOLERANCE` of the storage dtype (a cache may compute
                in it); give TOLERANCE["float32"] for a cache that computes in float32
    check     : an optional hook, `check(reference, cache, op, expected, got)`, called
                after every op once the built-in comparisons agree: `expected` and `got`
                are the reference's and the cache's (result, error) — result the verb's
                return value or, for a step, (step, [per layer the attention output]),
                error None or the CacheError raised. It returns a sentence naming a
                difference (or raises AssertionError), or None: for checks of a layout's
                own state (a device mirror, bindings)
    """
    runner = Runner(factory, config, compare, reference, tolerance, check)
    for op in ops:
        runner.run(op)
