"""Behaviour by default, etiquette on request (docs/contract.md §12): two caches as outside
engineers write them — one whose stale step still answers its fields, one whose `write`
takes int32 K/V — compute every placement, K/V byte and attention output as the reference
does, so `check_cache` passes them at its defaults and lists the etiquette they did not
follow; `strict=True` fails them naming the rule. A refusal of another class (of another
fault of the op, or any exception for a malformed argument) is etiquette too; a refusal
that changes state, of another class for a dead id, or int32 K/V stored as other values
is behaviour, caught at the defaults. (The reference, and numbakv's device cache, follow
every rule: test_check_cache.py runs them with strict=True.)"""

import numpy as np
import pytest
from example_caches import load_example

from numbakv.core.errors import CapacityError
from numbakv.reference import CellCache
from numbakv.reference.step import Step
from numbakv.testing import DEFAULT_CONFIGS, Divergence, Op, check_cache, run_script
from numbakv.testing.etiquette import ETIQUETTE

slab = load_example("slab_cache.py")
paged = load_example("paged_cache.py")
SMALL = DEFAULT_CONFIGS[1]  # 2 layers (windows 0 and 3), 2 KV heads, 4 ids, 24 cells


class AnsweringStep(slab.SlabStep):
    """A step that says it is stale and still answers every field (no check on reads)."""

    def _get(self, name: str) -> np.ndarray:
        return self._arrays[name].copy()


class StaleStepAnswers(slab.SlabCache):
    """The slab example, its steps answering their fields after a verb staled them."""

    def prepare_step(self, width=None):
        step = super().prepare_step(width)
        step.__class__ = AnsweringStep
        return step


def floats(x):
    """`x` as float32 when it is an integer array (what a lenient cache casts), else as is."""
    x = np.asarray(x)
    return x.astype(np.float32) if x.dtype.kind in "iub" else x


class TakesIntKV(paged.PagedCache):
    """The paged example (blocks of 4), its `write` taking integer K/V as their floats."""

    def write(self, layer, k, v):
        return super().write(layer, floats(k), floats(v))


OUTSIDE = [(StaleStepAnswers, "stale-step-fields"), (TakesIntKV, "write-dtype")]


@pytest.mark.parametrize(("cache", "rule"), OUTSIDE)
def test_an_outside_cache_passes_the_defaults_and_the_report_names_its_etiquette(cache, rule):
    coverage = check_cache(cache, report=True)
    assert set(coverage.etiquette) == {rule} and coverage.etiquette[rule] > 0
    assert coverage.unexplained == []
    line = next(x for x in str(coverage).splitlines() if x.startswith("etiquette not followed"))
    assert f"{rule} {coverage.etiquette[rule]} ops, first Op(" in line and "strict=True" in line


@pytest.mark.parametrize(("cache", "rule"), OUTSIDE)
def test_an_outside_cache_fails_strict_naming_the_rule(cache, rule):
    with pytest.raises(Divergence) as caught:
        check_cache(cache, strict=True, max_examples=0)
    message = str(caught.value)
    assert f"held under strict=True: {rule!r}" in message and ETIQUETTE[rule] in message
    assert message.endswith("run_script(factory, config, ops, strict=True)")
    with pytest.raises(Divergence, match=rule):  # the printed script replays
        run_script(cache, caught.value.config, caught.value.ops, strict=True)
    run_script(cache, caught.value.config, caught.value.ops)


class CapacityFirst(CellCache):
    """Checks the free cells before the width: a too-wide step on a full pool is a
    CapacityError (the contract checks the width first: StepError)."""

    def declare_step(self, seq_ids):
        if isinstance(seq_ids, list) and len(seq_ids) > self.free_cells:
            raise CapacityError(f"{len(seq_ids)} tokens, {self.free_cells} cells free")
        return super().declare_step(seq_ids)


class ValueErrors(CellCache):
    """Refuses a layer out of range with ValueError (a malformed argument)."""

    def write(self, layer, k, v):
        if layer not in range(self.config.n_layers):
            raise ValueError(f"no layer {layer!r}")
        return super().write(layer, k, v)


TOO_WIDE = [Op("seq_new"), Op("step", ((0,) * 25, None, 1, 0)), Op("step", ((0,) * 5, None, 1, 1))]
BAD_LAYER = [Op("seq_new"), Op("step", ((0, 0), None, 1, 0)), Op("write", (2, 2, 3)),
             Op("write", (1.5, 2, 3)), Op("step", ((0,), None, 1, 4))]  # fmt: skip


@pytest.mark.parametrize(
    ("cache", "ops", "rule"),
    [(CapacityFirst, TOO_WIDE, "refusal-order"), (ValueErrors, BAD_LAYER, "argument-class")],
)
def test_the_class_of_a_refusal_is_etiquette_among_its_faults(cache, ops, rule):
    for compare in ("semantic", "table"):
        run_script(cache, SMALL, ops, compare)
        with pytest.raises(Divergence, match=f"strict=True: {rule!r}") as caught:
            run_script(cache, SMALL, ops, compare, strict=True)
        assert caught.value.index == (1 if cache is CapacityFirst else 2)


class IndexErrorStep(Step):
    """A reference step whose fields raise IndexError once stale."""

    def _check(self) -> None:
        if self.is_stale:
            raise IndexError("stale")


class StaleFieldsAsIndexError(CellCache):
    """A stale step's fields raise IndexError (the contract: StepError)."""

    def prepare_step(self, width=None):
        step = super().prepare_step(width)
        step.__class__ = IndexErrorStep
        return step


def test_a_stale_step_may_answer_or_raise_anything_by_default():
    ops = [Op("seq_new"), Op("step", ((0, 0), None, 1, 1)), Op("rewind", (0, 1)),
           Op("read", ("positions",)), Op("read", ("is_stale",)),
           Op("write", (0, 2, 3))]  # fmt: skip
    for cache, compare, complaint in (
        (StaleStepAnswers, "semantic", "gives step.positions without raising"),
        (StaleFieldsAsIndexError, "semantic", "raised IndexError, not StepError"),
        (StaleFieldsAsIndexError, "table", "raised IndexError, not StepError"),
    ):
        run_script(cache, SMALL, ops, compare)
        with pytest.raises(Divergence, match="'stale-step-fields'") as caught:
            run_script(cache, SMALL, ops, compare, strict=True)
        assert complaint in str(caught.value) and caught.value.index == 2


class DeadIdKeyError(CellCache):
    """seq_rm of an id that is not live raises KeyError (a runtime catches SequenceError)."""

    def seq_rm(self, seq):
        if seq not in self.live_seqs:
            raise KeyError(seq)
        return super().seq_rm(seq)


class RefusalOpens(ValueErrors):
    """Its ValueError for a bad layer comes after it opened a sequence."""

    def write(self, layer, k, v):
        if layer not in range(self.config.n_layers):
            self.seq_new()
        return super().write(layer, k, v)


class IntsAsZeros(CellCache):
    """Takes integer K/V, and stores zeros."""

    def write(self, layer, k, v):
        k, v = (floats(x) * (np.asarray(x).dtype.kind == "f") for x in (k, v))
        return super().write(layer, k, v)


INT_WRITE = [Op("seq_new"), Op("declare", ((0, 0, 0),)), Op("prepare", (None,)),
             Op("write", (0, 3, 5, "int32")), Op("attend", (0, 3, 2, 1, None, None))]  # fmt: skip


@pytest.mark.parametrize(
    ("cache", "ops", "compare", "complaint"),
    [
        (DeadIdKeyError, [Op("seq_new"), Op("seq_rm", (2,))], "semantic",
         "the reference raised SequenceError"),
        (RefusalOpens, BAD_LAYER, "semantic", "live ids changed, though it refused the op"),
        (IntsAsZeros, INT_WRITE, "semantic", "attend(0) token 0"),
        (IntsAsZeros, INT_WRITE[:4], "table", "pool_kv(0) K differs"),
    ],
)  # fmt: skip
def test_behaviour_is_held_at_the_defaults(cache, ops, compare, complaint):
    with pytest.raises(Divergence) as caught:
        run_script(cache, SMALL, ops, compare)
    assert complaint in str(caught.value) and "strict=True" not in str(caught.value)
