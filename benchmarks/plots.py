"""What drawing every picture of a large trace costs (a 4 000-step x 65 536-cell trace: all of
them within 10 s and 1 GB peak memory is the aim).

    python -m benchmarks.recording large --long --save big.npz
    python -m benchmarks.plots big.npz              # every kind, then `all`
    python -m benchmarks.plots big.npz --kind timeline

Prints the seconds of loading the trace and of drawing and saving each picture (PNG, to a
temporary folder), and the process's peak resident memory (getrusage; loading numpy and
matplotlib is part of it).
"""

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from numbakv.cli import main as cli_main
from numbakv.cli.process import set_up

KINDS = ("cells", "mask", "timeline", "metrics", "locality", "movie", "all")


def draw(trace: str, kind: str, folder: str) -> float:
    """Seconds of `numbakv viz TRACE --kind KIND` (load, draw, save) into `folder`, in a
    process its caller set up as the command sets up its own (`numbakv.cli.process.set_up`)."""
    started = time.perf_counter()
    out = Path(folder) / f"{kind}.{'gif' if kind == 'movie' else 'png'}"
    cli_main(["viz", trace, "--kind", kind, "-o", str(out)])
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a .npz trace (benchmarks.recording large --save)")
    parser.add_argument("--kind", choices=KINDS, action="append", help="default: every kind")
    args = parser.parse_args(argv)
    set_up()  # once, before the first picture's imports, as the command does
    total = 0.0
    with tempfile.TemporaryDirectory() as folder:
        for kind in args.kind or KINDS:
            seconds = draw(args.trace, kind, folder)
            total += seconds
            print(f"{kind:>9}: {seconds:6.2f} s (load, draw, save)", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'total':>9}: {total:6.2f} s; peak resident memory {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
