"""The kit's power, held: every planted bug of the three example caches (block tables, slabs,
a ring of cells: `examples/`) is caught by `check_cache` at its defaults, by a named hazard
(so under every seed alike: hazards run before the seeded workloads and do not depend on
the seed), with a script of at most 6 ops that replays; the correct caches pass the whole
default run. `python -m benchmarks.kit_power` measures the same under seeds None and 1-5,
with and without each cache's own `check_invariants`."""

import pytest
from example_caches import load_example

from numbakv.reference import CellCache
from numbakv.testing import Divergence, Op, check_cache, run_script

CACHES = {"paged": ("paged_cache.py", "PagedCache"), "slab": ("slab_cache.py", "SlabCache"),
          "ring": ("ring_cache.py", "RingCache")}  # fmt: skip


MODULES = {name: load_example(file) for name, (file, _) in CACHES.items()}
PLANTED = [(name, bug) for name, module in MODULES.items() for bug in module.BUGS]


def cache_class(name: str):
    return getattr(MODULES[name], CACHES[name][1])


def test_the_corpus_has_eight_bugs_or_more_per_layout():
    assert all(len(module.BUGS) >= 8 for module in MODULES.values())


@pytest.mark.parametrize("name", CACHES)
def test_the_correct_cache_passes_the_default_run(name):
    coverage = check_cache(cache_class(name), report=True)
    assert coverage.unexplained == [] and coverage.unreached == []


@pytest.mark.parametrize(("name", "bug"), PLANTED)
def test_each_planted_bug_is_caught_by_a_hazard_with_a_short_script(name, bug):
    cls = cache_class(name)

    def factory(config):
        return cls(config, bugs=frozenset({bug}))

    with pytest.raises(Divergence) as caught:
        check_cache(factory)
    error, message = caught.value, str(caught.value)
    assert message.startswith("hazard '"), message.splitlines()[0]
    assert len(error.ops) <= 6, message
    ops = eval(message.split("ops = ", 1)[1].split("\nreplay:", 1)[0], {"Op": Op})
    assert ops == error.ops
    with pytest.raises(Divergence):
        run_script(factory, error.config, ops)
    run_script(cls, error.config, ops)  # the same script holds without the bug
    run_script(CellCache, error.config, ops)
