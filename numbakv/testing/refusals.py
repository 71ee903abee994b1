"""The refusals of docs/contract.md §6.1 by name (`REFUSALS`), and `Protocol`: what the
reference will refuse an op for, told before it runs from the step protocol's state (the
pending declaration, the valid step, the layers written) and the table's (live ids, pos,
free cells). `check_cache` counts the refusals its workloads reach (`Coverage`), and a test
holds every refusal of the contract to being reached. NumPy only.

The names are the kit's; the rows are the contract's, in its order of checks.
"""

from __future__ import annotations

import operator
from collections import Counter

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.testing.op import Op

MODES = ("gathered", "masked")  # the attention modes of docs/contract.md §5

REFUSALS = {  # name: (error class, what is refused)
    "declare: not a list": ("StepError", "declare_step of something not a list of ids"),
    "declare: id not live": ("SequenceError", "declare_step of an id that is not live"),
    "declare: empty": ("StepError", "declare_step([])"),
    "declare: too wide": ("StepError", "more than max_width tokens"),
    "declare: too few free cells": ("CapacityError", "more tokens than free cells"),
    "declare: past max_seq_len": ("CapacityError", "a sequence past max_seq_len"),
    "prepare: nothing declared": ("StepError", "prepare_step with no pending declaration"),
    "prepare: bad width": ("StepError", "a width below the declared count, past max_width, "
                                        "or not an integer"),
    "seq_new: every id live": ("CapacityError", "seq_new with max_seqs ids live"),
    "seq_clone: src not live": ("SequenceError", "seq_clone of an id that is not live"),
    "seq_clone: upto out of range": ("SequenceError", "upto outside [0, pos(src)]"),
    "seq_clone: every id live": ("CapacityError", "seq_clone with max_seqs ids live"),
    "seq_rm: not live": ("SequenceError", "seq_rm of an id that is not live"),
    "rewind: not live": ("SequenceError", "rewind of an id that is not live"),
    "rewind: position out of range": ("SequenceError", "position outside [0, pos(seq)]"),
    "write: no valid step": ("StepError", "write with no step, or a stale one"),
    "write: bad layer": ("StepError", "a layer outside [0, n_layers)"),
    "write: bad dtype": ("StepError", "K or V not of a real float dtype"),
    "write: bad shape": ("StepError", "K or V not [width, n_kv_heads, head_dim]"),
    "attend: no valid step": ("StepError", "attend with no step, or a stale one"),
    "attend: bad layer": ("StepError", "a layer outside [0, n_layers)"),
    "attend: bad mode": ("StepError", "a mode other than gathered or masked"),
    "attend: before write": ("StepError", "attend(layer) before write(layer) in the step"),
    "attend: bad heads": ("StepError", "q heads not a positive multiple of n_kv_heads"),
    "attend: bad shape": ("StepError", "q not [width, n_heads, head_dim]"),
    "attend: bad scale": ("StepError", "a scale that is not a finite positive real"),
    "reload: not live": ("SequenceError", "seq_save of an id that is not live"),
    "reload: start out of range": ("SequenceError", "start outside [0, pos(seq)]"),
    "reload: every id live": ("CapacityError", "seq_load with max_seqs ids live"),
    "reload: too few free cells": ("CapacityError", "a state of more positions than free cells"),
    "read: stale step": ("StepError", "a field of a stale step"),
    "read: no such window": ("StepError", "step.mask(window) of a window not in the config"),
}  # fmt: skip
TABLE_ONLY = ("read: no such window",)  # masks are a layout field: compare="table" reads them
# drop a declaration, stale the step
TABLE_CHANGES = ("seq_clone", "seq_rm", "rewind", "clear", "reload", "load")


def index(value) -> int | None:
    """`value` as the contract's integer (operator.index, bools refused), or None."""
    if isinstance(value, bool | np.bool_):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


class Protocol:
    """The reference's step-protocol state, kept from the outcomes of the ops it ran:
    `pending` (the declared ids or None), `width` of the valid step (None: no valid step),
    `written` (the layers written in it), `prepared` (whether a step was ever prepared)."""

    def __init__(self, config: CacheConfig):
        self.config = config
        self.pending: list | None = None
        self.width: int | None = None
        self.written: set[int] = set()
        self.prepared = False  # whether any step was prepared (a read reads the last)

    def faults(self, op: Op, reference) -> list[str]:
        """Every refusal of `REFUSALS` that `op` earns, in the contract's order of checks:
        the first is the one the reference will raise (none: it will accept the op), the
        later ones those a cache that checks in another order may raise (`etiquette`).
        `reference` as it is before the op. A check that needs an earlier one to pass (the
        positions of an id that is not live) is left out; an op whose arguments the kit
        cannot read (a hand-written script's) has none foretold."""
        try:
            return self._faults(op, reference)
        except (TypeError, ValueError, OverflowError):
            return []

    def _faults(self, op: Op, reference) -> list[str]:
        verb, args = op.verb, op.args
        if verb == "step":
            ids, width = args[:2]
            return self._declare(ids, reference) or self._width(width, len(ids))
        if verb == "declare":
            return self._declare(args[0], reference)
        if verb == "prepare":
            if self.pending is None:
                return ["prepare: nothing declared"]
            return self._width(args[0], len(self.pending))
        if verb in ("write", "attend"):
            return self._kv(verb, args)
        if verb == "read":
            return self._read(args)
        return self._table(verb, args, reference)

    def after(self, op: Op, refused: str | None, result) -> None:
        """Keeps the state after `op`, which the reference refused as `refused` or not."""
        verb = op.verb
        if refused is not None:
            if verb == "step" and refused.startswith("prepare"):  # declared, then refused
                self.pending, self.width, self.written = list(op.args[0]), None, set()
            return
        if verb in TABLE_CHANGES or verb == "declare":
            self.pending = list(op.args[0]) if verb == "declare" else None
            self.width, self.written = None, set()
        elif verb in ("prepare", "step"):
            step = result if verb == "prepare" else result[0]
            self.pending, self.width, self.prepared = None, step.width, True
            self.written = set(range(self.config.n_layers)) if verb == "step" else set()
        elif verb == "write":
            self.written.add(index(op.args[0]))

    def _declare(self, ids, reference) -> list[str]:
        if not isinstance(ids, tuple | list | range):
            return ["declare: not a list"]
        live, faults = set(reference.live_seqs), []
        counts = Counter(index(seq) for seq in ids)
        if any(seq not in live for seq in counts):
            faults.append("declare: id not live")
        if not ids:
            faults.append("declare: empty")
        if len(ids) > self.config.max_width:
            faults.append("declare: too wide")
        if len(ids) > reference.free_cells:
            faults.append("declare: too few free cells")
        if any(reference.pos(seq) + n > self.config.max_seq_len
               for seq, n in counts.items() if seq in live):  # fmt: skip
            faults.append("declare: past max_seq_len")
        return faults

    def _width(self, width, n: int) -> list[str]:
        if width is None:
            return []
        width = index(width)
        return [] if width is not None and n <= width <= self.config.max_width else [
            "prepare: bad width"
        ]  # fmt: skip

    def _kv(self, verb: str, args: tuple) -> list[str]:
        config, layer, faults = self.config, index(args[0]), []
        if self.width is None:
            faults.append(f"{verb}: no valid step")
        if layer is None or not 0 <= layer < config.n_layers:
            faults.append(f"{verb}: bad layer")
        if verb == "write":
            dtype = args[3] if len(args) > 3 else "float32"
            if np.dtype(dtype).kind != "f":
                faults.append("write: bad dtype")
            if self.width is not None and args[1] != self.width:
                faults.append("write: bad shape")
            return faults
        rows, n_heads, _, scale, mode = args[1:]
        if mode is not None and mode not in MODES:
            faults.append("attend: bad mode")
        if self.width is not None and "attend: bad layer" not in faults and (
            layer not in self.written
        ):  # fmt: skip
            faults.append("attend: before write")
        if n_heads < 1 or n_heads % config.n_kv_heads:
            faults.append("attend: bad heads")
        if self.width is not None and rows != self.width:
            faults.append("attend: bad shape")
        with np.errstate(over="ignore"):  # a scale past float32's range is not finite
            good = scale is None or (
                type(scale) in (int, float) and np.isfinite(np.float32(scale)) and scale > 0
            )
        if not good:
            faults.append("attend: bad scale")
        return faults

    def _read(self, args: tuple) -> list[str]:
        field, *window = args
        if field == "is_stale" or not self.prepared:  # no step: a read gives None
            return []
        faults = [] if self.width is not None else ["read: stale step"]
        if field == "mask" and window[0] not in self.config.distinct_windows:
            faults.append("read: no such window")
        return faults

    def _table(self, verb: str, args: tuple, reference) -> list[str]:
        live, full = set(reference.live_seqs), len(reference.live_seqs) == self.config.max_seqs
        if verb == "seq_new":
            return ["seq_new: every id live"] if full else []
        if verb not in ("seq_clone", "seq_rm", "rewind", "reload"):  # clear; an op log's
            return []  # save and load, which the kit does not foretell
        seq, faults = index(args[0]), []
        if seq not in live:
            faults.append(f"{verb}: {'src ' if verb == 'seq_clone' else ''}not live")
        position = None if len(args) < 2 or args[1] is None else index(args[1])
        if len(args) > 1 and args[1] is not None and (
            position is None or position < 0 or (seq in live and position > reference.pos(seq))
        ):  # fmt: skip
            name = {"seq_clone": "upto", "reload": "start"}.get(verb, "position")
            faults.append(f"{verb}: {name} out of range")
        if verb in ("seq_clone", "reload") and full:
            faults.append(f"{verb}: every id live")
        if verb == "reload" and not faults and (
            reference.pos(seq) - position > reference.free_cells
        ):  # fmt: skip
            faults.append("reload: too few free cells")
        return faults
