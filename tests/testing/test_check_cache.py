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
from numbakv.testing import DEFAULT_CONFIGS, Divergence, Op, check_cache, run_script


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


SHORT = 11  # max_ops of the holding runs: workloads of 1 to 11 ops, 6 on average


def test_the_reference_holds_to_itself():
    check_cache(CellCache, max_examples=40, max_ops=SHORT)
    check_cache(CellCache, compare="table", max_examples=10, seed=1, max_ops=SHORT)


def test_the_device_cache_holds_to_the_reference_cell_for_cell():
    check_cache(numbakv.CellCache, compare="table", max_examples=6, max_ops=SHORT)


@pytest.mark.parametrize("broken", [RewindKeepsOne, PaddingNonzero])
def test_a_planted_bug_is_caught_with_a_short_script_that_replays(broken):
    started = time.perf_counter()
    with pytest.raises(Divergence) as caught:
        check_cache(broken, max_examples=200)
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
    config = DEFAULT_CONFIGS[0]
    ops = [Op("seq_new"), Op("step", ((0, 0), 4, 2, 3))]
    with pytest.raises(Divergence, match=r"attend\(0\) token 2 head 0: got \[1\.0"):
        run_script(PaddingNonzero, config, ops)


def test_a_bad_compare_is_refused():
    with pytest.raises(ValueError, match="compare='cells'"):
        check_cache(CellCache, compare="cells")


def test_the_kit_imports_without_hypothesis_and_names_the_extra():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, *args):\n"
        "        if name.split('.')[0] == 'hypothesis':\n"
        "            raise ImportError('no hypothesis here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numbakv.testing as t\n"
        "from numbakv.reference import CellCache\n"
        "t.run_script(CellCache, t.DEFAULT_CONFIGS[0], [t.Op('seq_new')])\n"
        "try:\n"
        "    t.check_cache(CellCache)\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "print('numba' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "numbakv.testing.check_cache needs hypothesis: pip install 'numbakv[testing]'",
        "False",
    ]
