"""`numbakv.testing.CacheUnderTest`: both caches answer it, their steps are `StepLike`, and a
cache missing a verb does not; importing it needs neither numba nor hypothesis."""

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


def test_importing_the_kit_needs_neither_numba_nor_hypothesis(tmp_path):
    code = (
        "import sys, numbakv.testing; "
        "sys.exit(('numba' in sys.modules) + 2 * ('hypothesis' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, f"exit {done.returncode} (1: numba, 2: hypothesis)"
