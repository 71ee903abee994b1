"""How many of the planted bugs does `numbakv.testing.check_cache` catch at its defaults, how
fast, and how short is the script it prints? Prints figures; asserts nothing about timing.

    python -m benchmarks.kit_power               # every bug of the four examples, seeds 1-5
    python -m benchmarks.kit_power --quick       # seed None only
    python -m benchmarks.kit_power --cache cow   # one example (repeatable)

The corpus is the planted bugs (`BUGS`) of the four example caches of four layouts:
`examples/paged_cache.py` (vLLM-style block tables, blocks of 4, a partial page copied on
a fork), `examples/slab_cache.py` (a slab per sequence, copied on a fork, doubled when
full), `examples/ring_cache.py` (llama.cpp-style unified cells, placed round a ring) and
`examples/cow_cache.py` (blocks of 16, lazy copy-on-write: a fork shares every page, a
LIFO free list, saved sequences). Each bug runs under `check_cache` with every default
(semantic compare, DEFAULT_CONFIGS, hazards first, 100 workloads of up to 30 ops) at seeds
1-5; the correct caches once each. A cache with `seq_save`/`seq_load` also runs the opt-in
kind "reload" (its hazard and its draws: docs/contract.md §12.2), and one with a block size
is given it as `block_size=` once `check_cache` takes that keyword (the block-aligned
hazard spans); the "run with" column says what each got. Per cache:

    killed      runs that raised Divergence / runs (the kill rate)
    s           median seconds to the Divergence (its shrinking included)
    ops         median ops the kit ran up to the first divergence (hazards and workloads)
    script      median and longest length of the shrunk script

then per bug the first catcher (a hazard, or a random workload), the worst seconds, ops
and script, and the seeds under which it escaped; the same again with the cache's own
`check_invariants` hidden, which is what the kit finds in a cache that has none. The
correct caches' coverage reports end the output.
"""

import argparse
import importlib.util
import inspect
import statistics
import time
from pathlib import Path

from benchmarks.common import print_machine, print_table
from numbakv.testing import KINDS, Divergence, check_cache

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CACHES = {  # name: (file, class, block size to pass check_cache when it takes one)
    "paged": ("paged_cache.py", "PagedCache", None),
    "slab": ("slab_cache.py", "SlabCache", None),
    "ring": ("ring_cache.py", "RingCache", None),
    "cow": ("cow_cache.py", "CowCache", 16),
}
SEEDS = (1, 2, 3, 4, 5)
Result = tuple[bool, float, int, int, str]  # caught, seconds, ops run, script length, by


def load(file: str):
    spec = importlib.util.spec_from_file_location(file.removesuffix(".py"), EXAMPLES / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def options(cls: type, block_size: int | None) -> dict:
    """check_cache's keywords for `cls` beyond the defaults: the kind "reload" when it saves
    and loads sequences; `block_size` when it has one and check_cache takes it."""
    keywords = {}
    if hasattr(cls, "seq_save") and hasattr(cls, "seq_load"):
        keywords["kinds"] = (*KINDS, "reload")
    if block_size and "block_size" in inspect.signature(check_cache).parameters:
        keywords["block_size"] = block_size
    return keywords


def described(keywords: dict) -> str:
    """The keywords as the "run with" column shows them."""
    words = ['+"reload"' if name == "kinds" else f"{name}={value}"
             for name, value in keywords.items()]  # fmt: skip
    return " ".join(words) or "defaults"


def factory(cls, bugs: frozenset, invariants: bool):
    """The cache of `cls` with `bugs`; without `check_invariants` unless `invariants`."""
    if invariants:
        return lambda config: cls(config, bugs=bugs)
    hidden = type(cls.__name__, (cls,), {"check_invariants": property(_absent)})
    return lambda config: hidden(config, bugs=bugs)


def _absent(self):
    raise AttributeError("check_invariants")


def run(make, seed, keywords: dict) -> Result:
    """(caught, seconds, ops run, shrunk length, what caught it) of one default run."""
    started = time.perf_counter()
    try:
        coverage = check_cache(make, seed=seed, report=True, **keywords)
    except Divergence as error:
        by = str(error).split(":", 1)[0]
        by = by.split(" ", 2)[1] if by.startswith("hazard") else "random workload"
        return True, time.perf_counter() - started, error.coverage.ops, len(error.ops), by
    return False, time.perf_counter() - started, coverage.ops, 0, "-"


def summary(name: str, invariants: bool, n_bugs: int, runs: list[Result], clean: float,
            keywords: dict) -> list[str]:  # fmt: skip
    """One row of the per-cache table."""
    caught = [r for r in runs if r[0]]
    if not caught:
        return [name, "yes" if invariants else "hidden", str(n_bugs), f"0/{len(runs)}",
                "-", "-", "-", f"{clean:.1f}", described(keywords)]  # fmt: skip
    return [
        name, "yes" if invariants else "hidden", str(n_bugs), f"{len(caught)}/{len(runs)}",
        f"{statistics.median(r[1] for r in caught):.2f}",
        f"{statistics.median(r[2] for r in caught):.0f}",
        f"{statistics.median(r[3] for r in caught):.0f} / {max(r[3] for r in caught)}",
        f"{clean:.1f}", described(keywords),
    ]  # fmt: skip


def per_bug(name: str, bug: str, seeds, results: list[Result]) -> list[str]:
    """One row of the per-bug table: the first catcher, the worst seconds, ops and script
    of the runs that caught it, the seeds it escaped under."""
    caught = [r for r in results if r[0]]
    missed = [str(s) for s, r in zip(seeds, results, strict=True) if not r[0]]
    worst = [
        f"{max(r[1] for r in caught):.2f}", str(max(r[2] for r in caught)),
        str(max(r[3] for r in caught)),
    ] if caught else ["-", "-", "-"]  # fmt: skip
    first = sorted({r[4] for r in caught})[0] if caught else "missed"
    return [name, bug, first, *worst, ", ".join(missed) or "-"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="seed None only")
    parser.add_argument("--cache", action="append", choices=sorted(CACHES),
                        help="run only this example (repeatable)")  # fmt: skip
    args = parser.parse_args()
    seeds = (None,) if args.quick else SEEDS
    print_machine("numpy")
    rows, bugs, reports = [], {True: [], False: []}, {}
    for name in args.cache or CACHES:
        file, cls_name, block_size = CACHES[name]
        module = load(file)
        cls = getattr(module, cls_name)
        keywords = options(cls, block_size)
        started = time.perf_counter()
        reports[name] = check_cache(cls, report=True, **keywords)
        clean = time.perf_counter() - started
        for invariants in (True, False):
            runs = []
            for bug in module.BUGS:
                make = factory(cls, frozenset({bug}), invariants)
                results = [run(make, seed, keywords) for seed in seeds]
                runs += results
                bugs[invariants].append(per_bug(name, bug, seeds, results))
            rows.append(summary(name, invariants, len(module.BUGS), runs, clean, keywords))
    print(f"\ncheck_cache at its defaults, seeds {', '.join(map(str, seeds))}:")
    print_table(["cache", "invariants", "bugs", "killed", "s", "ops", "script", "clean s",
                 "run with"], rows)  # fmt: skip
    headers = ["cache", "bug", "caught by", "max s", "max ops", "max script", "missed"]
    for invariants, what in ((True, "on"), (False, "hidden")):
        print(f"\nper bug (invariants {what}): the first catcher, the worst seconds, ops to the "
              "first divergence and shrunk script, the seeds it escaped under")  # fmt: skip
        print_table(headers, bugs[invariants])
    for name, report in reports.items():
        print(f"\ncoverage of the correct {name} cache's run:\n{report}")


if __name__ == "__main__":
    main()
