"""What must hold after every op besides "the same as the reference" (`compare`): a refused
op changed nothing in the cache, the last step went stale exactly when the reference's did
(its fields then raise StepError: etiquette, held when strict), the cache's own
`check_invariants()` holds, a cell layout's occupied K/V bytes are the reference's, and the
caller's hook agrees (`after_op`); which rows of an attention see K/V no step wrote
(`undefined`). NumPy only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.core.errors import StepError
from numbakv.testing.compare import SIDES, step_difference, step_fields
from numbakv.testing.etiquette import annotated
from numbakv.testing.op import Op


class Runner(Protocol):
    """What these rules read and keep of a run: `numbakv.testing.ops.Runner`, which calls them
    after each op (this module is below it)."""

    reference: object
    cache: object
    config: CacheConfig
    compare: str
    strict: bool
    check: Callable | None
    steps: tuple | None  # (the reference's, the cache's) last prepared step, while compared
    last: list  # the same, kept stale
    unwritten: list[set[int]]  # per layer, the reference's cells no write has filled

    def note(self, rule: str, op: Op) -> None: ...


STATE_PARTS = {
    "semantic": ("live ids", "pos of the live ids", "used_cells", "free_cells"),
    "table": ("snapshot", "used_cells", "free_cells"),
}


def observed(cache, compare: str) -> tuple:
    """What a refused op must leave as it was: the live ids, each one's pos and the cells
    used and free; under compare="table" the snapshot (which holds the live ids and every
    cell's position) and the cells used and free."""
    if compare == "table":
        return cache.snapshot(), cache.used_cells, cache.free_cells
    live = list(cache.live_seqs)
    return live, [cache.pos(seq) for seq in live], cache.used_cells, cache.free_cells


def refusal_changed(cache, compare: str, before: tuple) -> str | None:
    """What of `observed(cache)` a refused op changed (`before`: observed before it)."""
    for part, was, now in zip(STATE_PARTS[compare], before, observed(cache, compare),
                              strict=True):  # fmt: skip
        if was != now:
            return f"the cache's {part} changed, though it refused the op"
    return None


def after_op(runner: Runner, op: Op, expected, got) -> str | None:
    """The first rule broken after `op` once the two caches agree on it (see the module
    docstring), as a sentence; None when all hold."""
    reference, cache, compare = runner.reference, runner.cache, runner.compare
    problem = _stale(runner, op, expected, got) or _invariants(cache)
    if problem:
        return problem
    if compare == "table" and hasattr(cache, "pool_kv"):
        problem = _pool(reference, cache, runner.unwritten)
        if problem:
            return problem
    if runner.check is not None:
        try:
            return runner.check(reference, cache, op, expected, got)
        except AssertionError as error:
            return f"check(...) failed: {error}"
    return None


def _stale(runner: Runner, op: Op, expected, got) -> str | None:
    """The last prepared steps of both: stale alike, a valid one's fields still the
    reference's; a stale one's fields raise StepError (etiquette "stale-step-fields": held
    when strict, else noted). A new step replaces them."""
    problem = None
    if runner.steps is not None:
        want, have = runner.steps
        if want.is_stale != have.is_stale:
            state = "stale" if have.is_stale else "still valid"
            return f"after {op.verb}, the cache's last step is {state}, the reference's is not"
        if want.is_stale:
            problem = _raises_stale(want, have, runner.compare)
            runner.steps = None
            if problem and not runner.strict:
                runner.note("stale-step-fields", op)
                problem = None
            problem = annotated(problem, "stale-step-fields")
        else:
            problem = step_difference(want, have, runner.compare)
    track_step(runner, op, expected, got)
    return problem


def track_step(runner: Runner, op: Op, expected, got) -> None:
    """After a step or prepare op both prepared, its two steps are the last ones."""
    if op.verb in ("step", "prepare") and expected[1] is None and got[1] is None:
        runner.steps = (
            (expected[0], got[0]) if op.verb == "prepare" else (expected[0][0], got[0][0])
        )


def _raises_stale(want, have, compare: str) -> str | None:
    """Which side's stale step gives a field without raising StepError (any other
    exception is not StepError either)."""
    for side, step in zip(SIDES, (want, have), strict=True):
        for field in step_fields(compare):
            try:
                getattr(step, field)
            except StepError:
                continue
            except Exception as error:
                return f"{side}'s stale step.{field} raised {type(error).__name__}, not StepError"
            return f"{side}'s stale step gives step.{field} without raising StepError"
    return None


def keep_unwritten(runner: Runner, op: Op, expected) -> None:
    """The reference's cells that a prepare placed are unwritten in every layer until a
    write of the step (`runner.unwritten`, per layer), before the op's step is the last."""
    result, error = expected
    if error is None and op.verb in ("step", "write"):
        cells = set(runner.last[0].cells.tolist() if op.verb == "write" else
                    result[0].cells.tolist())  # fmt: skip
        for layer in [op.args[0]] if op.verb == "write" else range(runner.config.n_layers):
            runner.unwritten[layer] -= cells
    if op.verb == "prepare" and error is None:
        placed = set(result.cells.tolist()) - {-1}
        for cells in runner.unwritten:
            cells |= placed


def undefined(runner: Runner, op: Op, expected) -> dict | None:
    """{layer: [width] bool}: the rows of an attending op that see a cell no step wrote
    in that layer (its K/V undefined: a prepare without writes), or None."""
    if expected[1] is not None or op.verb not in ("step", "attend"):
        return None
    step = expected[0][0] if op.verb == "step" else runner.last[0]
    layers = range(runner.config.n_layers) if op.verb == "step" else [op.args[0]]
    rows = {}
    for layer in layers:
        cells = sorted(c for c in runner.unwritten[layer] if c < step.read_len)
        if cells:
            rows[layer] = step.mask(runner.config.windows[layer])[:, cells].any(axis=1)
    return rows or None


def _invariants(cache) -> str | None:
    check = getattr(cache, "check_invariants", None)
    if check is None:
        return None
    try:
        check()
    except AssertionError as error:
        return f"the cache's check_invariants() failed: {error}"
    return None


def _pool(reference, cache, unwritten: list[set[int]]) -> str | None:
    """Every occupied cell's K and V bytes, layer by layer, equal the reference's (but those
    of cells `unwritten` in the layer: placed by a prepare, never written)."""
    placed = np.flatnonzero(reference.snapshot().pos >= 0)
    last = int(placed[-1]) if len(placed) else -1
    for layer in range(reference.config.n_layers):
        occupied = np.setdiff1d(placed, list(unwritten[layer]))
        pairs = zip("KV", reference.pool_kv(layer), cache.pool_kv(layer), strict=True)
        for name, want, have in pairs:
            have = np.asarray(have)
            if have.dtype != want.dtype or len(have) <= last:
                return (
                    f"pool_kv({layer}) {name} is {have.dtype} of {len(have)} rows; the "
                    f"reference's {want.dtype}, with cell {last} occupied"
                )
            if want[occupied].tobytes() != have[occupied].tobytes():
                differ = [c for c in occupied.tolist() if want[c].tobytes() != have[c].tobytes()]
                return f"pool_kv({layer}) {name} differs from the reference's in cells {differ}"
    return None
