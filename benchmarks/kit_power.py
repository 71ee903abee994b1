"""How many of the planted bugs does `numbakv.testing.check_cache` catch at its defaults, how
fast, and how short is the script it prints? Prints figures; asserts nothing about timing.

    python -m benchmarks.kit_power            # every bug of the three example caches
    python -m benchmarks.kit_power --quick    # seed None only

The corpus is the planted bugs (`BUGS`) of the three example caches of three layouts:
`examples/paged_cache.py` (vLLM-style block tables, blocks of 4), `examples/slab_cache.py`
(a slab per sequence, copied on a fork, doubled when full) and `examples/ring_cache.py`
(llama.cpp-style unified cells, placed round a ring). Each bug runs under `check_cache`
with every default (semantic compare, DEFAULT_CONFIGS, hazards first, 100 workloads of up
to 30 ops) at seed None and seeds 1-5; the correct caches once each. Per cache:

    killed      runs that raised Divergence / runs
    s           median seconds to the Divergence (shrinking included)
    ops         median ops the kit ran before it (hazard scripts and workloads)
    script      median and longest length of the shrunk script
    by          which hazard (or a random workload) caught it first, per bug

and the same again with the cache's own `check_invariants` hidden, which is what the kit
finds in a cache that has none. The correct caches' coverage report ends the output.
"""

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

from benchmarks.common import print_machine, print_table
from numbakv.testing import Divergence, check_cache

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CACHES = (("paged", "paged_cache.py", "PagedCache"), ("slab", "slab_cache.py", "SlabCache"),
          ("ring", "ring_cache.py", "RingCache"))  # fmt: skip
SEEDS = (None, 1, 2, 3, 4, 5)


def load(file: str):
    spec = importlib.util.spec_from_file_location(file.removesuffix(".py"), EXAMPLES / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def factory(cls, bugs: frozenset, invariants: bool):
    """The cache of `cls` with `bugs`; without `check_invariants` unless `invariants`."""
    if invariants:
        return lambda config: cls(config, bugs=bugs)
    hidden = type(cls.__name__, (cls,), {"check_invariants": property(_absent)})
    return lambda config: hidden(config, bugs=bugs)


def _absent(self):
    raise AttributeError("check_invariants")


def run(make, seed) -> tuple[bool, float, int, int, str]:
    """(caught, seconds, ops run, shrunk length, what caught it) of one default run."""
    started = time.perf_counter()
    try:
        coverage = check_cache(make, seed=seed, report=True)
    except Divergence as error:
        by = str(error).split(":", 1)[0]
        by = by.split(" ", 2)[1] if by.startswith("hazard") else "random workload"
        return True, time.perf_counter() - started, error.coverage.ops, len(error.ops), by
    return False, time.perf_counter() - started, coverage.ops, 0, "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seed None only")
    seeds = (None,) if parser.parse_args().quick else SEEDS
    print_machine("numpy")
    rows, per_bug, reports = [], [], {}
    for name, file, cls_name in CACHES:
        module = load(file)
        cls = getattr(module, cls_name)
        started = time.perf_counter()
        reports[name] = check_cache(lambda config, c=cls: c(config), report=True)
        clean = time.perf_counter() - started
        for invariants in (True, False):
            runs = []
            for bug in module.BUGS:
                results = [run(factory(cls, frozenset({bug}), invariants), s) for s in seeds]
                runs += results
                if invariants:
                    missed = [str(s) for s, r in zip(seeds, results, strict=True) if not r[0]]
                    per_bug.append(
                        [
                            name,
                            bug,
                            sorted({r[4] for r in results})[0],
                            f"{max(r[1] for r in results):.2f}",
                            str(max(r[3] for r in results)),
                            ", ".join(missed) or "-",
                        ]
                    )
            caught = [r for r in runs if r[0]]
            rows.append([
                name, "yes" if invariants else "hidden", str(len(module.BUGS)),
                f"{len(caught)}/{len(runs)}",
                f"{statistics.median(r[1] for r in caught):.2f}" if caught else "-",
                f"{statistics.median(r[2] for r in caught):.0f}" if caught else "-",
                f"{statistics.median(r[3] for r in caught):.0f} / {max(r[3] for r in caught)}"
                if caught else "-",
                f"{clean:.1f}",
            ])  # fmt: skip
    print(f"\ncheck_cache at its defaults, seeds {', '.join(map(str, seeds))}:")
    print_table(["cache", "invariants", "bugs", "killed", "s", "ops", "script", "clean s"], rows)
    print("\nper bug (invariants on): the first catcher, worst seconds and script, seeds missed")
    print_table(["cache", "bug", "caught by", "max s", "max ops", "missed"], per_bug)
    for name, report in reports.items():
        print(f"\ncoverage of the correct {name} cache's default run:\n{report}")


if __name__ == "__main__":
    main()
