"""`numbakv.testing.CacheUnderTest`: both caches answer it, their steps are `StepLike`, and a
cache missing a verb does not; importing it needs neither numba nor hypothesis, and its launch
counter does not need numba."""

import subprocess
import sys

from numbakv.testing import LAYOUT_FIELDS, SEMANTIC_FIELDS, CacheUnderTest, StepLike

from helpers import step_with


def test_both_caches_and_their_steps_answer_the_protocol(cache):
    assert isinstance(cache, CacheUnderTest)
    step = step_with(cache, [cache.seq_new()] * 2, 3)
    assert isinstance(step, StepLike)
    for field in (*SEMANTIC_FIELDS, *LAYOUT_FIELDS):
        assert hasattr(step, field), field


def test_a_cache_without_rewind_does_not():
    class Partial:
        config = None

        def seq_new(self):
            return 0

    assert not isinstance(Partial(), CacheUnderTest)


def test_importing_the_kit_needs_neither_numba_nor_hypothesis_nor_its_launch_counter(tmp_path):
    # numba reads NUMBA_ENABLE_CUDASIM once, when imported: neither the kit nor the counting
    # harness may import it before its user has chosen the simulator
    code = (
        "import sys, numbakv.testing; loaded = set(sys.modules); "
        "import numbakv.testing.launches; "
        "sys.exit(('numba' in loaded) + 2 * ('hypothesis' in loaded) "
        "+ 4 * ('numbakv.testing.launches' in loaded) + 8 * ('numba' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, (
        f"exit {done.returncode} (bits: 1 the kit imports numba, 2 hypothesis, 4 the launch "
        f"counter; 8 the launch counter imports numba)\n{done.stderr.decode()}"
    )
