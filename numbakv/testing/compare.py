"""What "the same as the reference" means after one op (`differences`), for any layout
(`semantic`) or for a cell layout (`table`). NumPy only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from numbakv.testing.protocol import SEMANTIC_FIELDS

if TYPE_CHECKING:  # ops runs the ops and reads this module's rules
    from numbakv.testing.ops import Op

SIDES = ("the reference", "the cache")


def differences(reference, cache, op: Op, expected, got, compare: str,
                tolerance: float) -> str | None:  # fmt: skip
    """The first difference between the reference's (result, error) `expected` and the
    cache's `got` after `op`, as a sentence; None when they agree (attention outputs within
    `tolerance`, relative to max(1, the row's largest |value|))."""
    return outcome_difference(op, expected, got, compare, tolerance) or _state(
        reference, cache, compare
    )


def outcome_difference(op: Op, expected, got, compare: str, tolerance: float) -> str | None:
    """The first difference of the op's outcomes alone: the error class, or the result (a
    step's fields, masks and attention outputs)."""
    (want, want_error), (have, have_error) = expected, got
    if type(want_error) is not type(have_error):
        return f"the reference {_said(want_error)}, the cache {_said(have_error)}"
    return None if want_error is not None else _results(op, want, have, compare, tolerance)


def step_fields(compare: str) -> tuple[str, ...]:
    """The `Step` fields compared under `compare`."""
    return SEMANTIC_FIELDS + (("cells", "read_len") if compare == "table" else ())


def step_difference(step, their_step, compare: str) -> str | None:
    """The first field of `step_fields(compare)` in which the cache's step differs."""
    for field in step_fields(compare):
        a, b = np.asarray(getattr(step, field)), np.asarray(getattr(their_step, field))
        if a.shape != b.shape or not np.array_equal(a, b):
            return f"step.{field} is {b.tolist()}, the reference's {a.tolist()}"
    return None


def _said(error) -> str:
    return "returned" if error is None else f"raised {type(error).__name__}({error})"


def _results(op: Op, want, have, compare: str, tolerance: float) -> str | None:
    if op.verb != "step":
        return None if want == have else f"returned {have!r}, the reference {want!r}"
    (step, outs), (their_step, their_outs) = want, have
    problem = step_difference(step, their_step, compare)
    if problem:
        return problem
    if compare == "table":
        for window in step.windows:
            problem = _mask(window, step, their_step)
            if problem:
                return problem
    n_tokens = step.n_tokens
    for layer, (a, b) in enumerate(zip(outs, their_outs, strict=True)):
        problem = _attention(layer, a, b, tolerance) or _output_form(layer, a, b, n_tokens)
        if problem:
            return problem
    return None


def _mask(window: int, step, their_step) -> str | None:
    """A window's mask: uint8 [width, read_len] on both sides, and equal."""
    masks = step.mask(window), their_step.mask(window)
    for side, mask in zip(SIDES, masks, strict=True):
        mask = np.asarray(mask)
        if mask.dtype != np.uint8 or mask.shape != (step.width, step.read_len):
            return (
                f"{side}'s step.mask({window}) is {mask.dtype} {list(mask.shape)}, not uint8 "
                f"[width, read_len] = {[step.width, step.read_len]}"
            )
    if not np.array_equal(*masks):
        return f"step.mask({window}) differs from the reference's"
    return None


def _output_form(layer: int, want: np.ndarray, have: np.ndarray, n_tokens: int) -> str | None:
    """Both outputs float32, their padding rows (from n_tokens on) exactly 0."""
    for side, out in zip(SIDES, (want, have), strict=True):
        if out.dtype != np.float32:
            return f"{side}'s attend({layer}) returned {out.dtype}, not float32"
        if out[n_tokens:].any():
            return f"{side}'s attend({layer}) gave padding rows [{n_tokens}, ...) that are not 0"
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
    """The live ids, each one's pos, the cells used and free (and the snapshot for a table)."""
    if list(cache.live_seqs) != list(reference.live_seqs):
        return f"live ids {list(cache.live_seqs)}, the reference's {list(reference.live_seqs)}"
    for seq in reference.live_seqs:
        if cache.pos(seq) != reference.pos(seq):
            return f"pos({seq}) = {cache.pos(seq)}, the reference's {reference.pos(seq)}"
    for name in ("used_cells", "free_cells"):
        if getattr(cache, name) != getattr(reference, name):
            return f"{name} = {getattr(cache, name)}, the reference's {getattr(reference, name)}"
    if compare == "table" and cache.snapshot() != reference.snapshot():
        return "the cell table (snapshot) differs from the reference's"
    return None
