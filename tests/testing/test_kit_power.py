"""What makes the kit's verdict trustworthy: every refusal of the contract is one the kit
names and reaches; its draws depend on the seed alone, not on the calling program; any
exception of the cache under test, and a hang, is a Divergence with a script; K/V that no
step wrote is never compared; the coverage report says what a run exercised."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from numbakv.reference import CellCache
from numbakv.testing import (
    DEFAULT_CONFIGS,
    HAZARDS,
    REFUSALS,
    Divergence,
    Op,
    check_cache,
    run_script,  # fmt: skip
)

CONTRACT = Path(__file__).resolve().parents[2] / "docs" / "contract.md"
SMALL = DEFAULT_CONFIGS[1]


def contract_refusals() -> dict[str, str]:
    """The table of docs/contract.md §12.1: {name: error class}."""
    section = CONTRACT.read_text().split("### 12.1", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| `(\w+)` \|", section, flags=re.M))


def test_the_kit_names_every_refusal_of_the_contract_and_reaches_each():
    """The contract's table is the kit's; the hazards alone reach every refusal, and so do
    the random workloads alone (300 of them: a refusal of a valid step's write or attend
    needs a step that is still valid)."""
    assert contract_refusals() == {name: error for name, (error, _) in REFUSALS.items()}
    for hazards, examples in ((True, 0), (False, 300)):
        coverage = check_cache(CellCache, compare="table", hazards=hazards,
                               max_examples=examples, report=True)  # fmt: skip
        assert coverage.unreached == [] and coverage.unexplained == []


CALLER = """
import numpy as np
from numbakv.reference import CellCache
from numbakv.testing import check_cache, Divergence
LABEL, LIMITS = {label!r}, {limits!r}  # the caller's own constants, of no concern to the kit

class Buggy(CellCache):  # a rewind to p > 1 keeps p + 1 positions
    def rewind(self, seq, position):
        if 1 < position < self.pos(seq):
            position += 1
        return super().rewind(seq, position)

print(check_cache(CellCache, hazards=False, max_examples=40, seed={seed}, report=True).verbs)
try:
    check_cache(Buggy, hazards=False, seed={seed})
except Divergence as error:
    print(str(error).split("config =")[0])
"""


@pytest.mark.parametrize("seed", [None, 3])
def test_what_a_run_draws_and_finds_depends_on_the_seed_not_on_the_caller(seed):
    outputs = []
    for label, limits in (("first", (7, 8128, 0.25)), ("another caller", (65, 1 << 40, -3.5))):
        code = CALLER.format(label=label, limits=limits, seed=seed)
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert "random workload" in outputs[0] and "Counter({'step'" in outputs[0]


class RaisesIndexError(CellCache):
    def seq_clone(self, src, upto=None):
        if upto == 0:
            return [][0]  # the way a new cache fails most
        return super().seq_clone(src, upto)


class Hangs(CellCache):
    def rewind(self, seq, position):
        while position == 0:
            pass
        return super().rewind(seq, position)


def test_any_exception_of_the_cache_is_a_divergence_with_its_script_and_frame():
    with pytest.raises(Divergence) as caught:
        check_cache(RaisesIndexError)
    message = str(caught.value)
    assert "the cache raised IndexError(list index out of range) at test_kit_power.py:" in message
    assert "in seq_clone: return [][0]" in message and len(caught.value.ops) <= 3
    assert caught.value.ops[-1] == Op("seq_clone", (0, 0))


def test_a_hang_past_the_op_timeout_is_a_divergence():
    with pytest.raises(Divergence, match=r"OpTimeout\(the op ran past op_timeout=0.2 s\)") as e:
        check_cache(Hangs, configs=[SMALL], hazards=["rewind-to-every-position"],
                    op_timeout=0.2)  # fmt: skip
    assert e.value.ops[-1] == Op("rewind", (0, 0))


def test_a_factory_that_raises_is_a_divergence_naming_it():
    def factory(config):
        raise KeyError("no such layout")

    with pytest.raises(Divergence, match=r"factory\(CacheConfig\(.*raised KeyError"):
        check_cache(factory, configs=[SMALL])


def test_unknown_hazards_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"no hazards \['fork'\]"):
        check_cache(CellCache, hazards=["fork"])


def test_k_v_that_no_step_wrote_is_not_compared():
    """A prepare without writes leaves its cells' K/V undefined: a layout that places the
    step elsewhere reads other bytes there, and still agrees."""

    class Shifted(CellCache):  # the reference's layout, its unwritten K/V garbage
        def prepare_step(self, width=None):
            step = super().prepare_step(width)
            for layer in range(self.config.n_layers):
                for kv in self.pool_kv(layer):
                    kv[step.cells[step.cells >= 0]] = 7.0
            return step

    ops = [Op("seq_new"), Op("declare", ((0, 0),)), Op("prepare", (None,)),
           Op("write", (0, 2, 5)), Op("attend", (0, 2, 2, 1, None, None)),
           Op("step", ((0,), None, 1, 3))]  # fmt: skip
    run_script(Shifted, SMALL, ops)  # layer 1 of cells 0 and 1 was never written

    class SkipsWrites(Shifted):  # claims each write, keeps the garbage
        def write(self, layer, k, v):
            self._written.add(layer)

    with pytest.raises(Divergence, match=r"op 4 .*attend\(0\) token 0"):  # written: compared
        run_script(SkipsWrites, SMALL, ops)


def test_the_report_says_what_the_run_exercised():
    coverage = check_cache(CellCache, configs=[SMALL], max_examples=5, report=True)
    text = str(coverage)
    assert set(coverage.hazards) == set(HAZARDS) and coverage.workloads == 5
    for line in (
        "hazards (scripts): fork-partial-then-append",
        "refusals reached: 27 of 27",
        "windows: W=3: inside, at W, one past W, far past W",
        "stale reads: positions",
    ):
        assert line in text, text
