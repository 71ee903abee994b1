"""`numbakv.testing.check_cache`: the reference holds to itself, numbakv's device cache holds
to it on the table (the kit runs in CI), a broken cache is caught with a short script that
replays, and the kit imports without hypothesis."""

import subprocess
import sys
import time

import numpy as np
import pytest

import numbakv
from numbakv.reference import CellCache
from numbakv.testing import DEFAULT_CONFIGS, HAZARDS, Divergence, Op, check_cache, run_script


class RewindKeepsOne(CellCache):
    """Planted bug: a rewind into a sequence keeps one position too many."""

    def rewind(self, seq, position):
        if 0 < position < self.pos(seq):
            position += 1
        return super().rewind(seq, position)


class PaddingNonzero(CellCache):
    """Planted bug: padding rows of attend are not zero."""

    def attend(self, layer, q, scale=None, mode="gathered"):
        out = np.array(super().attend(layer, q, scale, mode))
        out[self._step.n_tokens :] += 1.0
        return out


SMALL = DEFAULT_CONFIGS[1]  # 2 layers (windows 0 and 3), 2 KV heads, 4 ids, 24 cells
DEVICE_HAZARDS = ("step-rules", "stale-step-reads", "verb-between-declare-and-prepare")


def test_the_reference_holds_to_itself_and_reaches_every_refusal():
    for compare in ("semantic", "table"):  # numbakv's etiquette too (strict=True)
        coverage = check_cache(CellCache, compare=compare, report=True, strict=compare == "table")
        assert coverage.unexplained == [] and not coverage.etiquette  # all foreseen, all kept
        assert coverage.unreached == []
        assert set(coverage.hazards) == set(HAZARDS)
        assert coverage.longest == max(c.max_seq_len for c in DEFAULT_CONFIGS)
        assert all(len(edges) >= 3 for edges in coverage.windows.values())
        assert coverage.growths > 0 and coverage.workloads == 100


def test_the_device_cache_holds_to_the_reference_cell_for_cell():
    """On the simulator an op costs ~0.2 s: the step protocol's hazards on one config and a
    few workloads (tests/contract holds every verb of both caches to the contract)."""
    check_cache(numbakv.CellCache, compare="table", configs=[SMALL], hazards=DEVICE_HAZARDS,
                max_examples=4, max_ops=8, strict=True)  # fmt: skip


@pytest.mark.parametrize("broken", [RewindKeepsOne, PaddingNonzero])
def test_a_planted_bug_is_caught_with_a_short_script_that_replays(broken):
    started = time.perf_counter()
    with pytest.raises(Divergence) as caught:
        check_cache(broken)
    print(f"{broken.__name__}: caught in {time.perf_counter() - started:.1f} s, "
          f"{len(caught.value.ops)} ops")  # fmt: skip
    error = caught.value
    assert len(error.ops) <= 6
    message = str(error)
    assert "differs from the reference" in message and "ops = [" in message
    ops = eval(message.split("ops = ", 1)[1].split("\nreplay:", 1)[0], {"Op": Op})
    assert ops == error.ops
    with pytest.raises(Divergence):
        run_script(broken, error.config, ops)
    run_script(CellCache, error.config, ops)  # the same script holds on the reference


def test_the_message_names_the_token_and_head():
    config = DEFAULT_CONFIGS[1]
    ops = [Op("seq_new"), Op("step", ((0, 0), 4, 2, 3))]
    with pytest.raises(Divergence, match=r"attend\(0\) token 2 head 0: got \[1\.0"):
        run_script(PaddingNonzero, config, ops)


def test_a_bad_compare_is_refused():
    with pytest.raises(ValueError, match="compare='cells'"):
        check_cache(CellCache, compare="cells")


def test_the_kit_runs_without_hypothesis_and_numba():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, *args):\n"
        "        if name.split('.')[0] in ('hypothesis', 'numba'):\n"
        "            raise ImportError('not here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numbakv.testing as t\n"
        "from numbakv.reference import CellCache\n"
        "print(t.check_cache(CellCache, hazards=['padding-rows'], max_examples=3, "
        "report=True).workloads)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3"]
