"""What "the same as the reference" means after one op (`differences`), for any layout
(`semantic`) or for a cell layout (`table`). NumPy only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from numbakv.testing.protocol import SEMANTIC_FIELDS

if TYPE_CHECKING:  # ops runs the ops and reads this module's rules
    from numbakv.testing.ops import Op


def differences(reference, cache, op: Op, expected, got, compare: str,
                tolerance: float) -> str | None:  # fmt: skip
    """The first difference between the reference's (result, error) `expected` and the
    cache's `got` after `op`, as a sentence; None when they agree (attention outputs within
    `tolerance`, relative to max(1, the row's largest |value|))."""
    (want, want_error), (have, have_error) = expected, got
    if type(want_error) is not type(have_error):
        return f"the reference {_said(want_error)}, the cache {_said(have_error)}"
    if want_error is None:
        problem = _results(op, want, have, compare, tolerance)
        if problem:
            return problem
    return _state(reference, cache, compare)


def _said(error) -> str:
    return "returned" if error is None else f"raised {type(error).__name__}({error})"


def _results(op: Op, want, have, compare: str, tolerance: float) -> str | None:
    if op.verb != "step":
        return None if want == have else f"returned {have!r}, the reference {want!r}"
    (step, outs), (their_step, their_outs) = want, have
    fields = SEMANTIC_FIELDS + (("cells", "read_len") if compare == "table" else ())
    for field in fields:
        a, b = np.asarray(getattr(step, field)), np.asarray(getattr(their_step, field))
        if a.shape != b.shape or not np.array_equal(a, b):
            return f"step.{field} is {b.tolist()}, the reference's {a.tolist()}"
    if compare == "table":
        for window in step.windows:
            if not np.array_equal(step.mask(window), their_step.mask(window)):
                return f"step.mask({window}) differs from the reference's"
    for layer, (a, b) in enumerate(zip(outs, their_outs, strict=True)):
        problem = _attention(layer, a, b, tolerance)
        if problem:
            return problem
    return None


def _attention(layer: int, want: np.ndarray, have: np.ndarray, tol: float) -> str | None:
    """The worst token of a layer's attention output, when it is past `tol` (relative to the
    row's largest |value|, at least 1) or NaN/inf where the reference is finite."""
    if want.shape != have.shape:
        return f"attend({layer}) gave shape {have.shape}, the reference {want.shape}"
    scale = np.maximum(np.abs(want).max(axis=-1, keepdims=True), 1)
    error = np.where(np.isfinite(have) | ~np.isfinite(want), np.abs(have - want), np.inf)
    error = np.nan_to_num(error / scale, nan=0.0)
    t, h, d = np.unravel_index(int(np.argmax(error)), error.shape)
    if error[t, h, d] <= tol:
        return None
    return (
        f"attend({layer}) token {t} head {h}: got {have[t, h].tolist()}, the reference "
        f"{want[t, h].tolist()} (element {d}: {have[t, h, d]} vs {want[t, h, d]})"
    )


def _state(reference, cache, compare: str) -> str | None:
    """The live ids, each one's pos and the cells used (and the snapshot for a table)."""
    if list(cache.live_seqs) != list(reference.live_seqs):
        return f"live ids {list(cache.live_seqs)}, the reference's {list(reference.live_seqs)}"
    for seq in reference.live_seqs:
        if cache.pos(seq) != reference.pos(seq):
            return f"pos({seq}) = {cache.pos(seq)}, the reference's {reference.pos(seq)}"
    if cache.used_cells != reference.used_cells:
        return f"used_cells = {cache.used_cells}, the reference's {reference.used_cells}"
    if compare == "table" and cache.snapshot() != reference.snapshot():
        return "the cell table (snapshot) differs from the reference's"
    return None
