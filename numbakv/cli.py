"""The `numbakv` command line: `numbakv demo` and `numbakv viz`."""

import argparse
import sys

KINDS = ("all", "cells", "timeline", "metrics", "mask")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="numbakv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="serve a mixed workload on the device, checked against the reference"
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the model's weights (default 0)")
    demo.add_argument("--columns", type=int, default=64, help="cells per line of the map")
    demo.add_argument("--trace", metavar="FILE", help="save the table after every forward (.npz)")
    viz = commands.add_parser("viz", help="draw a trace saved by `numbakv demo --trace`")
    viz.add_argument("trace", metavar="TRACE", help="a .npz trace")
    viz.add_argument("-o", "--output", metavar="FILE", required=True, help="image to write (.png)")
    viz.add_argument("--kind", choices=KINDS, default="all", help="which picture (default all)")
    viz.add_argument("--step", type=int, default=-1, help="recorded step to show (default last)")
    viz.add_argument("--window", type=int, help="mask window (default the smallest)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return _viz(args, parser)


def _demo(args) -> int:
    from numbakv import demo
    from numbakv.serve.lockstep import LockstepError

    try:
        demo.run(seed=args.seed, columns=args.columns, trace_path=args.trace)
    except LockstepError as error:
        print(
            f"numbakv demo: the device path disagrees with the reference: {error}", file=sys.stderr
        )
        return 1
    return 0


def _viz(args, parser: argparse.ArgumentParser) -> int:
    from numbakv.errors import CacheError
    from numbakv.trace import load_trace
    from numbakv.viz import plot_all, plot_cells, plot_mask, plot_metrics, plot_timeline

    try:
        trace = load_trace(args.trace)
        n_steps = len(trace.step_frames)
        if not -n_steps <= args.step < n_steps:
            parser.error(f"--step {args.step}: the trace has {n_steps} recorded steps")
        window = trace.config.distinct_windows[0] if args.window is None else args.window
        if window not in trace.config.distinct_windows:
            windows = trace.config.distinct_windows
            parser.error(f"--window {window}: the trace's windows are {windows}")
        frame = trace.step_frames[args.step]
        draw = {
            "all": lambda: plot_all(trace, args.step, window),
            "cells": lambda: plot_cells(trace.snapshot(frame)),
            "timeline": lambda: plot_timeline(trace, mark_step=args.step % n_steps),
            "metrics": lambda: plot_metrics(trace, mark_step=args.step % n_steps),
            "mask": lambda: plot_mask(trace.step(frame), window),
        }[args.kind]
        draw().savefig(args.output, dpi=100)
    except CacheError as error:
        parser.exit(1, f"numbakv viz: {error}\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
