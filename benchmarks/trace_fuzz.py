"""Damaged and hostile trace files against `load_trace`, many of them: every variant must be
refused with a TraceError, or load as a trace whose every accessor works.

    python -m benchmarks.trace_fuzz                      # 2000 variants of each kind
    python -m benchmarks.trace_fuzz --variants 20000 --seed 1
    python -m benchmarks.trace_fuzz --every-bit          # also flip each bit of the file once

The traces, the kinds of variant and the outcomes are those of tests/viz/trace_variants.py
(whose test runs a few hundred of each kind). Prints, per kind, the variants and their
outcomes (refusals grouped), then every outcome over all kinds (refusals by reason) and
the escapes; exits 1 when there is one.
"""

import argparse
import collections
import time

import numpy as np

from tests.viz.trace_variants import KINDS, Originals, every_bit, run, variants


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", type=int, default=2000, help="random variants per kind")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every-bit", action="store_true", help="also flip every bit once")
    args = parser.parse_args(argv)
    o = Originals.recorded(args.seed)
    rng = np.random.default_rng(args.seed)
    print(f"trace: {o.trace.n_frames} frames, {o.trace.n_steps} steps, {len(o.data)} "
          f"bytes; {args.variants} variants of each of {', '.join(KINDS)}")  # fmt: skip
    kinds = {kind: variants(kind, o, rng, args.variants) for kind in KINDS}
    if args.every_bit:
        kinds["every bit"] = every_bit(o)
    start = time.perf_counter()
    counts = run(kinds, o)
    total = collections.Counter()
    for kind, counter in counts.items():
        total.update(counter)
        groups = collections.Counter()
        for name, n in counter.items():
            groups["refused" if name.startswith("refused") else name] += n
        print(f"\n{kind}: {sum(counter.values())} variants, " + ", ".join(
            f"{n} {name}" for name, n in groups.most_common()))  # fmt: skip
    print(f"\nall kinds, by outcome ({sum(total.values())} variants, "
          f"{time.perf_counter() - start:.1f} s):")  # fmt: skip
    for name, n in total.most_common():
        print(f"{n:8d}  {name}")
    escapes = sum(n for name, n in total.items() if name.startswith("ESCAPE"))
    print(f"\nescapes: {escapes}")
    raise SystemExit(1 if escapes else 0)


if __name__ == "__main__":
    main()
