"""What "the same as the reference" means after one op (`differences`), for any layout
(`semantic`) or for a cell layout (`table`). NumPy only."""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np

from numbakv.core.errors import CacheError
from numbakv.testing.op import Op
from numbakv.testing.protocol import SEMANTIC_FIELDS

SIDES = ("the reference", "the cache")


def differences(reference, cache, op: Op, expected, got, compare: str, tolerance: float,
                n_tokens: int | None = None, undefined=None) -> str | None:  # fmt: skip
    """The first difference between the reference's (result, error) `expected` and the
    cache's `got` after `op`, as a sentence; None when they agree (attention outputs within
    `tolerance`, relative to max(1, the row's largest |value|); an attend op's padding rows
    from `n_tokens` on exactly 0; `undefined`: {layer: [width] bool}, the rows that read a
    cell no step wrote in that layer, whose outputs are not compared)."""
    return outcome_difference(op, expected, got, compare, tolerance, n_tokens, undefined) or _state(
        reference, cache, compare
    )


def outcome_difference(op: Op, expected, got, compare: str, tolerance: float,
                       n_tokens: int | None = None, undefined=None) -> str | None:  # fmt: skip
    """The first difference of the op's outcomes alone: the error class, or the result (a
    step's fields, masks and attention outputs; a read field; an attend's output)."""
    (want, want_error), (have, have_error) = expected, got
    if type(want_error) is not type(have_error):
        return f"the reference {said(want_error)}, the cache {said(have_error)}"
    if want_error is not None:
        return None
    return _results(op, want, have, compare, tolerance, n_tokens, undefined or {})


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


def said(error) -> str:
    """What an outcome was, as words: "returned", or "raised Class(message)" and, for an
    exception that is not a CacheError, where (the last frame of its traceback)."""
    if error is None:
        return "returned"
    text = f"raised {type(error).__name__}({error})"
    frames = traceback.extract_tb(error.__traceback__) if not isinstance(error, CacheError) else ()
    if frames:
        frame = frames[-1]
        text += f" at {Path(frame.filename).name}:{frame.lineno} in {frame.name}: {frame.line}"
    return text


def _results(op: Op, want, have, compare: str, tolerance: float, n_tokens,
             undefined: dict) -> str | None:  # fmt: skip
    if op.verb == "attend":
        skip = undefined.get(op.args[0])
        return _attention(op.args[0], want, have, tolerance, skip) or _output_form(
            op.args[0], want, have, n_tokens
        )
    if op.verb == "read":
        return _read(op, want, have)
    if op.verb == "prepare":
        return _step_result(want, have, compare)
    if op.verb == "save":
        return _saved(want, have)
    if op.verb != "step":
        return None if want == have else f"returned {have!r}, the reference {want!r}"
    (step, outs), (their_step, their_outs) = want, have
    problem = _step_result(step, their_step, compare)
    if problem:
        return problem
    n_tokens = step.n_tokens
    for layer, (a, b) in enumerate(zip(outs, their_outs, strict=True)):
        problem = _attention(layer, a, b, tolerance, undefined.get(layer)) or _output_form(
            layer, a, b, n_tokens
        )
        if problem:
            return problem
    return None


def _saved(state, theirs) -> str | None:
    """A saved state: the same start and positions, where the cache's state says them (its
    K/V are held to the reference's where a load of it is attended)."""
    for field in ("start", "positions"):
        if hasattr(theirs, field):
            a, b = np.asarray(getattr(state, field)), np.asarray(getattr(theirs, field))
            if a.shape != b.shape or not np.array_equal(a, b):
                return f"the saved state's {field} is {b.tolist()}, the reference's {a.tolist()}"
    return None


def _step_result(step, their_step, compare: str) -> str | None:
    """A prepared step's fields and (table) every window's mask."""
    problem = step_difference(step, their_step, compare)
    if problem or compare != "table":
        return problem
    for window in step.windows:
        problem = _mask(window, step, their_step)
        if problem:
            return problem
    return None


def _read(op: Op, want, have) -> str | None:
    """A read field: the same shape and values (a mask also uint8)."""
    field = "step." + (f"mask({op.args[1]})" if op.args[0] == "mask" else op.args[0])
    if want is None or have is None:
        return None if want is have else f"{field} is {have!r}, the reference's {want!r}"
    have = np.asarray(have)
    if op.args[0] == "mask" and have.dtype != np.uint8:
        return f"{field} is {have.dtype}, not uint8"
    if want.shape != have.shape or not np.array_equal(want, have):
        return f"{field} is {have.tolist()}, the reference's {want.tolist()}"
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


def _attention(layer: int, want: np.ndarray, have: np.ndarray, tol: float,
               skip: np.ndarray | None = None) -> str | None:  # fmt: skip
    """The worst token of a layer's attention output, when it is past `tol` (relative to the
    row's largest |value|, at least 1) or NaN/inf where the reference is finite; the rows
    of `skip` ([width] bool) not compared."""
    if want.shape != have.shape:
        return f"attend({layer}) gave shape {have.shape}, the reference {want.shape}"
    scale = np.maximum(np.abs(want).max(axis=-1, keepdims=True), 1)
    error = np.where(np.isfinite(have) | ~np.isfinite(want), np.abs(have - want), np.inf)
    error = np.nan_to_num(error / scale, nan=0.0)
    if skip is not None:
        error[skip] = 0
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
