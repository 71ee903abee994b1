"""numbakv's argument etiquette (`ETIQUETTE`): the rules of docs/contract.md that no runtime's
results depend on. `check_cache(..., strict=True)` holds a cache to them like any other
difference; by default (`strict=False`) a cache that breaks one still passes, and the report
(`Coverage.etiquette`) names the rules it did not follow. Everything else — placements,
positions, K/V bytes, attention outputs, and every refusal that changes what a runtime sees
(capacity, dead or reused ids, positions, windows, the protocol's state) — is behaviour,
held at both settings (docs/contract.md §12). NumPy only.
"""

from __future__ import annotations

import numpy as np

from numbakv.core.errors import CacheError
from numbakv.testing.op import Op
from numbakv.testing.refusals import REFUSALS, index

ETIQUETTE = {  # name: the rule (strict=True), and what the default admits
    "write-dtype": "write() refuses K or V of a dtype that is not a real float with StepError "
    "(§6.1 'write: bad dtype'); by default a cache may take them, held to storing their "
    "float32 values, or refuse them with any exception",
    "stale-step-fields": "every field of a stale step but is_stale raises StepError (§3); by "
    "default the fields of a step the reference's went stale with are not read (is_stale "
    "still must agree, and a valid step's fields keep their values)",
    "refusal-order": "an op with several faults raises the class of the first in §6.1's "
    "order; by default the class of any of them",
    "argument-class": "a malformed argument (a declaration that is not a list, empty or too "
    "wide, a bad width, layer, shape, head count, scale or mode, an id or a position that "
    "is not an integer) is refused with the contract's class; by default with any exception",
}
ARGUMENT_FAULTS = frozenset({
    "declare: not a list", "declare: empty", "declare: too wide", "prepare: bad width",
    "write: bad layer", "write: bad shape", "attend: bad layer", "attend: bad mode",
    "attend: bad heads", "attend: bad shape", "attend: bad scale",
})  # fmt: skip


def broken(op: Op, faults: list[str], expected, got, stale: bool) -> str | None:
    """The rule of `ETIQUETTE` that the cache's outcome `got` breaks where it differs from
    the reference's `expected` in etiquette alone, or None (they agree, or differ in
    behaviour). `faults`: the op's refusals (`Protocol.faults`, before it ran); `stale`:
    whether the reference's last step was stale before the op."""
    (_, want), (_, have) = expected, got
    if type(want) is type(have):
        return None
    if op.verb == "read" and stale and op.args[0] != "is_stale":
        return "stale-step-fields"
    if want is None or not faults:  # a refusal of an op the reference took: behaviour
        return None
    if have is None:  # took an op the reference refused: only K/V that are not floats
        return "write-dtype" if faults == ["write: bad dtype"] else None
    classes = {REFUSALS[fault][0] for fault in faults}
    if type(have).__name__ in classes:
        return "refusal-order"
    if ARGUMENT_FAULTS.intersection(faults) or _malformed(op):
        return "argument-class"
    return "write-dtype" if "write: bad dtype" in faults else None


def _malformed(op: Op) -> bool:
    """Whether an id or a position of a verb or a declaration is not an integer."""
    if op.verb in ("step", "declare"):
        ids = op.args[0]
        return isinstance(ids, tuple) and any(index(seq) is None for seq in ids)
    if op.verb in ("seq_clone", "seq_rm", "rewind", "reload"):
        given = [op.args[0], *(a for a in op.args[1:2] if a is not None)]
        return any(index(value) is None for value in given)
    return False


def annotated(problem: str | None, rule: str | None) -> str | None:
    """`problem` (None: none), naming the etiquette rule it breaks when there is one."""
    if problem is None or rule is None:
        return problem
    return f"{problem} (numbakv's etiquette, held under strict=True: {rule!r}: {ETIQUETTE[rule]})"


def as_floats(reference, op: Op, k: np.ndarray, v: np.ndarray) -> tuple:
    """The reference's (result, error) of a write op of K/V `k`, `v` (its float32 inputs)
    cast to a dtype that is not a float, given their values as float32: what a cache that
    takes them stores."""
    layer, dtype = op.args[0], op.args[3]
    try:
        return reference.write(layer, *(x.astype(dtype).astype(np.float32) for x in (k, v))), None
    except CacheError as error:
        return None, error
