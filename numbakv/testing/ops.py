"""Op scripts: a workload as a list of `Op`s, run on the reference and a cache under test side
by side, compared after every op (`run_script`). What `check_cache` generates and shrinks,
and what its failure message prints, so that a failure replays with two lines:

    from numbakv.testing import Op, run_script
    run_script(factory, config, [Op("seq_new"), Op("step", ([0, 0], 3, 2, 7))])

An op is a verb of docs/contract.md §2 with its arguments (`seq_new`, `seq_clone`, `seq_rm`,
`rewind`, `clear`), a whole step, or one call of the step protocol (§3, §5):

    Op("step", (seq_ids, width, group, seed[, mode]))  declare_step(seq_ids), prepare_step(
        width) (None: the declared count), then per layer write K/V and attend a q of `group *
        n_kv_heads` query heads, all drawn from `seed`, in `mode` ("gathered" or "masked";
        without it `attend` gets no `mode`)
    Op("declare", (seq_ids,))      declare_step(list(seq_ids)); anything but a tuple as is
    Op("prepare", (width,))        prepare_step(width)
    Op("write", (layer, rows, seed[, dtype]))  write(layer, k, v) of k, v [rows, n_kv_heads,
                                   head_dim] float32 from `seed` (cast to `dtype`, a name)
    Op("attend", (layer, rows, n_heads, seed, scale, mode))  attend(layer, q) of q [rows,
                                   n_heads, head_dim] float32 from `seed`, with `scale=` and
                                   `mode=` when they are not None
    Op("read", (field,)), Op("read", ("mask", window))  a field (or a mask) of the last
                                   prepared step, stale or not: its value or the StepError
    Op("reload", (seq, start))     seq_load(seq_save(seq, start=start), onto=seq when start
                                   is not 0): the new id (docs/contract.md §13)
    Op("save", (seq, start))       seq_save(seq, start=start): the state, which each side
                                   keeps for a later load (what `OpLog` records)
    Op("load", (source, onto[, convert]))  seq_load(state, onto=onto[, convert=]): source
                                   the index of an earlier save op (each side loads the
                                   state it saved; none saved: both refuse) or a `SeqState`

Any exception the cache under test raises is an outcome: an error class the reference did
not raise (an `IndexError`, a timeout past `op_timeout` seconds) is a `Divergence` like any
other difference, with the last frame of its traceback. NumPy only.
"""

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from numbakv.core.arrays import as_host
from numbakv.core.config import CacheConfig
from numbakv.core.errors import CacheError, StateError
from numbakv.core.seq_state import SeqState
from numbakv.testing import state as rules  # what must hold besides the same outcomes
from numbakv.testing.compare import differences, outcome_difference, said
from numbakv.testing.etiquette import annotated, as_floats, broken
from numbakv.testing.op import Op
from numbakv.testing.refusals import MODES as MODES  # MODES: an op names one
from numbakv.testing.refusals import Protocol
from numbakv.testing.saved import SavedStates, by_position

COMPARES = ("semantic", "table")
TABLE_VERBS = ("seq_new", "seq_clone", "seq_rm", "rewind", "clear")
STEP_VERBS = ("declare", "prepare", "write", "attend", "read")
VERBS = (*TABLE_VERBS, "step", *STEP_VERBS, "reload", "save", "load")
OP_TIMEOUT = 10.0  # seconds one op of the cache under test may take before it is a hang

Check = Callable[..., "str | None"]  # check(reference, cache, op, expected, got)


class Divergence(AssertionError):
    """The cache under test differed from the reference. `ops` is the script up to and
    including the op that differed, `index` that op's index, `config` the CacheConfig;
    from `check_cache`, `coverage` is what the run exercised up to the divergence."""

    def __init__(self, message: str, ops: Sequence[Op], index: int, config: CacheConfig):
        super().__init__(message)
        self.ops, self.index, self.config = list(ops), index, config
        self.coverage = None


class OpTimeout(TimeoutError):
    """An op of the cache under test ran past the runner's `op_timeout`."""


def script(ops: Sequence[Op]) -> str:
    """The ops as a Python list literal, one per line (what `run_script` takes)."""
    return "[\n" + "".join(f"    {op!r},\n" for op in ops) + "]"


def step_inputs(config: CacheConfig, width: int, group: int, seed: int, layer: int):
    """(k, v, q) of one layer of a step op: float32 normal, [width, n_kv_heads, head_dim]
    and [width, group * n_kv_heads, head_dim]."""
    rng = np.random.default_rng([seed, _key(layer)])
    kv = (width, config.n_kv_heads, config.head_dim)
    k, v = rng.standard_normal((2, *kv), dtype=np.float32)
    q = rng.standard_normal((width, group * config.n_kv_heads, config.head_dim), np.float32)
    return k, v, q


def query(config: CacheConfig, rows: int, n_heads: int, seed: int, layer) -> np.ndarray:
    """The q of an attend op: float32 normal [rows, n_heads, head_dim]."""
    rng = np.random.default_rng([seed, _key(layer), 1])
    return rng.standard_normal((rows, n_heads, config.head_dim), np.float32)


def _key(layer) -> int:
    """A layer as a seed word: itself when a non-negative int, else 0 (a refused layer)."""
    return layer if type(layer) is int and layer >= 0 else 0


def apply(cache, op: Op, config: CacheConfig, last=None):
    """Runs `op` on `cache` and gives its result: the verb's return value; for a step (the
    step, [per layer the attention output as a host array, of the dtype the cache
    returned]); for a prepare the step; for an attend the output as a host array; for a
    read the field as an array (None without a step). `last`: the step this cache
    prepared last, stale or not (what a read reads)."""
    verb, args = op.verb, op.args
    if verb in TABLE_VERBS:
        return getattr(cache, verb)(*args)
    if verb == "step":
        return _step(cache, args, config)
    if verb == "declare":
        (ids,) = args
        return cache.declare_step(list(ids) if isinstance(ids, tuple) else ids)
    if verb == "prepare":
        return cache.prepare_step(*args)
    if verb == "write":
        layer, rows, seed, *dtype = args
        k, v, _ = step_inputs(config, rows, 1, seed, layer)
        return cache.write(layer, *(x.astype(dtype[0]) for x in (k, v)) if dtype else (k, v))
    if verb == "attend":
        layer, rows, n_heads, seed, scale, mode = args
        keywords = {name: value for name, value in (("scale", scale), ("mode", mode))
                    if value is not None}  # fmt: skip
        return as_host(cache.attend(layer, query(config, rows, n_heads, seed, layer), **keywords))
    if verb == "reload":
        seq, start = args
        return cache.seq_load(cache.seq_save(seq, start=start), onto=seq if start else None)
    if verb == "save":
        seq, start = args
        return cache.seq_save(seq, start=start)
    if verb == "load":
        state, onto, *convert = args
        if not isinstance(state, SeqState):  # a save op's index that no save answered
            raise StateError(f"load of save op {state!r}: no state was saved there")
        return cache.seq_load(state, onto=onto, **({"convert": convert[0]} if convert else {}))
    if verb == "read":
        if last is None:
            return None
        field, *window = args
        return np.asarray(last.mask(*window) if field == "mask" else getattr(last, field))
    raise ValueError(f"{op!r}: the verb is not one of {VERBS}")


def _step(cache, args: tuple, config: CacheConfig):
    seq_ids, width, group, seed, *mode = args
    keywords = {"mode": mode[0]} if mode else {}
    cache.declare_step(list(seq_ids))
    step = cache.prepare_step(width)
    outs = []
    for layer in range(config.n_layers):
        k, v, q = step_inputs(config, step.width, group, seed, layer)
        cache.write(layer, k, v)
        outs.append(as_host(cache.attend(layer, q, **keywords)))
    return step, outs


def outcome(cache, op: Op, config: CacheConfig, last=None, catch=CacheError,
            timeout: float | None = None):  # fmt: skip
    """(result, None) or (None, the exception it raised): a CacheError, or any `catch` (the
    cache under test: any Exception, a hang past `timeout` seconds as `OpTimeout`)."""
    try:
        with time_limit(timeout):
            return apply(cache, op, config, last), None
    except catch as error:
        return None, error


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raises `OpTimeout` in the block once it has run `seconds` (SIGALRM: in the main
    thread of a POSIX process; elsewhere, or for None, no limit)."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise OpTimeout(f"the op ran past op_timeout={seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Runner:
    """The reference and a cache under test side by side: `run(op)` applies `op` to both and
    raises `Divergence` at the first difference (see `run_script` for `compare`, `tolerance`,
    `check`, `op_timeout` and `strict`). `watch`, an optional observer of the run
    (`Coverage`), has `after(runner, op, expected, got)` called after each op and
    `note(rule, op)` at each etiquette rule the cache broke (admitted: not strict)."""

    def __init__(self, factory: Callable[[CacheConfig], object], config: CacheConfig,
                 compare: str = "semantic", reference=None, tolerance: float | None = None,
                 check: Check | None = None, op_timeout: float | None = OP_TIMEOUT,
                 watch=None, strict: bool = False):  # fmt: skip
        if compare not in COMPARES:
            raise ValueError(f"compare={compare!r}: give one of {COMPARES}")
        if reference is None:
            from numbakv.reference import CellCache as reference
        self.config, self.compare, self.check, self.ops = config, compare, check, []
        self.tolerance = config.tolerance if tolerance is None else tolerance
        self.op_timeout, self.watch, self.strict = op_timeout, watch, strict
        self.replay_keywords = "".join(  # the run_script keywords that replay this runner's ops
            text for text, given in ((f", compare={compare!r}", compare != "semantic"),
                                     (f", tolerance={tolerance!r}", tolerance is not None),
                                     (", check=check", check is not None),
                                     (", strict=True", strict)) if given
        )  # fmt: skip
        self.protocol, self.faults = Protocol(config), []  # the faults of the op being run
        self.etiquette: dict[str, Op] = {}  # rule broken (not strict): the first op that did
        self.reference = reference(config)
        self.cache = self._made(factory, config)
        self.steps = None  # (the reference's, the cache's) last prepared step, while compared
        self.last = [None, None]  # the same, kept stale: what a read op reads
        self.unwritten = [set() for _ in range(config.n_layers)]  # the reference's cells
        self.states = SavedStates()  # what save ops saved, for the load ops after them

    def _made(self, factory, config: CacheConfig):
        try:
            with time_limit(self.op_timeout):
                return factory(config)
        except Exception as error:
            message = f"factory({config!r}) {said(error)}"
            raise Divergence(message, [], -1, config) from error

    def run(self, op: Op) -> None:
        self.ops.append(op)
        self.faults = self.protocol.faults(op, self.reference)
        problem, before = self._read(rules.observed, self.cache, self.compare)
        expected, got, rule = self._outcomes(op)
        if self.watch is not None:
            self.watch.after(self, op, expected, got)
        expected, seen = self._admit(op, expected, got, rule)
        if problem is None:
            failed, problem = self._read(self._compare, op, before, expected, got, seen, rule)
            problem = failed or problem
        self._raise(problem)

    def _outcomes(self, op: Op) -> tuple:
        """(expected, got, rule): each side's outcome of `op`, and the `ETIQUETTE` rule that
        alone they differ in (None: none)."""
        stale = self.last[0] is not None and self.last[0].is_stale
        expected = outcome(self.reference, self.states.side(op, 0), self.config, self.last[0])
        got = outcome(self.cache, self.states.side(op, 1), self.config, self.last[1],
                      Exception, self.op_timeout)  # fmt: skip
        return expected, got, broken(op, self.faults, expected, got, stale)

    def _admit(self, op: Op, expected, got, rule: str | None) -> tuple:
        """Keeps the op's outcomes (`_keep`); gives (expected, seen): the reference's outcome
        and the one the cache's is held to, `got` or, `rule` admitted (not strict: noted),
        `expected`. A cache that took K/V that are not floats is held to the reference's
        write of their float32 values."""
        admitted = rule is not None and not self.strict
        if admitted and rule == "write-dtype" and got[1] is None:
            layer, rows, seed, _ = op.args
            expected = as_floats(self.reference, op, *step_inputs(self.config, rows, 1, seed,
                                                                  layer)[:2])  # fmt: skip
        self._keep(op, expected, got)
        if not admitted:
            return expected, got
        self.note(rule, op)
        return expected, expected

    def note(self, rule: str, op: Op) -> None:
        """The cache broke etiquette `rule` at `op` (not strict): kept, and told the watch."""
        self.etiquette.setdefault(rule, op)
        if self.watch is not None:
            self.watch.note(rule, op)

    def _compare(self, op: Op, before, expected, got, seen, rule: str | None) -> str | None:
        problem = None
        if got[1] is not None and expected[1] is not None:  # a refusal changes nothing
            problem = rules.refusal_changed(self.cache, self.compare, before)
        n_tokens = self.last[0].n_tokens if op.verb == "attend" and expected[1] is None else None
        problem = problem or annotated(differences(
            self.reference, self.cache, op, expected, seen, self.compare, self.tolerance,
            n_tokens, rules.undefined(self, op, expected)), rule)  # fmt: skip
        return problem or rules.after_op(self, op, expected, got)

    def _read(self, function, *args):
        """(None, function(*args)), or (a sentence, None) when reading the cache raised."""
        try:
            with time_limit(self.op_timeout):
                return None, function(*args)
        except Exception as error:
            return f"reading the cache's state {said(error)}", None

    def _keep(self, op: Op, expected, got) -> None:
        """The protocol's state after the op; a step that a prepare or step op made is each
        side's last step; the reference's unwritten cells (`keep_unwritten`)."""
        result, error = expected
        refused = None if error is None else (self.faults or ["unexplained"])[0]
        self.protocol.after(op, refused, result)
        rules.keep_unwritten(self, op, expected)
        if op.verb in ("step", "prepare"):
            for side, (result, error) in enumerate((expected, got)):
                if error is None:
                    self.last[side] = result[0] if op.verb == "step" else result
        self.states.keep(op, expected, got, self.reference, self.unwritten)
        if op.verb == "reload" and expected[1] is None:  # a copy of an unwritten cell is one
            snapshot = self.reference.snapshot()
            source, copy = (by_position(snapshot, seq) for seq in (op.args[0], expected[0]))
            for cells in self.unwritten:
                cells |= {copy[p] for p, cell in source.items() if cell in cells}

    def setup(self, ops: Sequence[Op]) -> None:
        """Runs `ops` (a prefix that makes a state: ids parked, sequences open) comparing
        each op's outcome (`outcome_difference`: the error class, the result) and, after
        the last, everything `run` compares; `run_script` of the printed script checks
        each of them fully."""
        for op in ops[:-1]:
            self.ops.append(op)
            self.faults = self.protocol.faults(op, self.reference)
            expected, got, rule = self._outcomes(op)
            expected, seen = self._admit(op, expected, got, rule)
            self._raise(annotated(outcome_difference(op, expected, seen, self.compare,
                                                     self.tolerance), rule))  # fmt: skip
            rules.track_step(self, op, expected, got)
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
               tolerance: float | None = None, *, check: Check | None = None,
               op_timeout: float | None = OP_TIMEOUT, strict: bool = False) -> None:  # fmt: skip
    """Runs `ops` on `factory(config)` and on the reference cache (or `reference`, a factory
    of the oracle), comparing after every op; raises `Divergence` at the first difference.

    compare    : "semantic" (any layout): the same outcome (returned, or the same error
                 class: any other exception of the cache, `IndexError` included, is a
                 difference, but as `strict` admits), ids, pos of every live id, live ids,
                 cells used and free, step positions/seq_ids/width/n_tokens, attention
                 outputs within `tolerance` (float32 [width, n_heads, head_dim], padding rows
                 exactly 0), a read field's value; a refused op leaves the cache as it was;
                 the last step goes stale when the reference's does;
                 `check_invariants()` holds after every op on a cache that has it. "table"
                 (cell layouts) adds the snapshot, each step's cells and read_len, every
                 window's mask (uint8 [width, read_len]) and, when the cache has `pool_kv`,
                 the K/V bytes of every occupied cell.
    tolerance  : of attention outputs, relative to max(1, the row's largest |value|); by
                 default `config.tolerance`, `numbakv.core.config.TOLERANCE` of the loosest
                 format any layer's K or V stores (a cache may compute in it); give
                 TOLERANCE["float32"] for a cache that computes in float32
    check      : an optional hook, `check(reference, cache, op, expected, got)`, called
                 after every op once the built-in comparisons agree: `expected` and `got`
                 are the reference's and the cache's (result, error) — result what `apply`
                 gives, error None or the exception raised. It returns a sentence naming a
                 difference (or raises AssertionError), or None: for checks of a layout's
                 own state (a device mirror, bindings)
    op_timeout : seconds one op of the cache may run before it is a hang (a Divergence);
                 None: no limit (SIGALRM: only in the main thread on POSIX)
    strict     : also hold the cache to numbakv's argument etiquette (`etiquette.ETIQUETTE`:
                 K/V that are not floats refused, a stale step's fields raising StepError,
                 the class of the first of several faults, StepError for a malformed
                 argument); by default a difference in those alone is admitted (the
                 runner's `etiquette` keeps the first op that broke each rule)
    """
    runner = Runner(factory, config, compare, reference, tolerance, check, op_timeout,
                    strict=strict)  # fmt: skip
    for op in ops:
        runner.run(op)
