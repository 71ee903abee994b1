"""`numbakv viz`: the pictures of a trace, zoomed and binned from the command line."""

import argparse
import shutil
from pathlib import Path

from numbakv.cli.args import CHECK, fail, input_file, integer, output_file, span

KINDS = ("all", "cells", "timeline", "metrics", "mask", "locality", "movie")
ONE_STEP = ("cells", "mask")  # pictures of the step --step names: --steps does not apply
MAX_BIN = 1 << 40  # cells per pixel column: past any pool's cells, within an int64
NO_CELLS = ("metrics", "locality")  # pictures of figures per step: --cells and --bin do not
NO_OWNERS = ("mask", "metrics", "locality")  # pictures without owners' colours: no --by
# zlib level of a written PNG: the same pixels as Pillow's default 6 in half the time, the
# file about a fifth larger (`--kind all` of a GPU-sized trace: 0.10 s, 950 KiB)
PNG_LEVEL = 1


def add_command(commands) -> None:
    """Adds the `viz` command to the `numbakv` subcommands."""
    viz = commands.add_parser("viz", help="draw a trace saved by `numbakv demo --trace`")
    viz.add_argument("trace", type=input_file, metavar="TRACE", help="a .npz trace")
    viz.add_argument(
        "-o",
        "--output",
        type=output_file(),
        metavar="FILE",
        required=True,
        help="image to write; its extension picks the format (.png, .pdf, .svg, ...; "
        ".gif for --kind movie)",
    )
    viz.add_argument("--kind", choices=KINDS, default="all", help="which picture (default all)")
    viz.add_argument("--step", type=int, help="recorded step to show (default the last)")
    viz.add_argument(
        "--window", type=integer("--window", 0), help="mask window (default the smallest)"
    )
    viz.add_argument("--cells", type=span, metavar="A:B", help="only cells [A, B)")
    viz.add_argument("--steps", type=span, metavar="A:B", help="only recorded steps [A, B)")
    viz.add_argument(
        "--bin",
        type=integer("--bin", 1, MAX_BIN),
        metavar="N",
        help="cells per pixel column, at most 2^40 (default: what fits; a big pool is drawn "
        "in blocks)",
    )
    viz.add_argument(
        "--dpi", type=integer("--dpi", 10, 600), default=100, help="pixels per inch (10-600)"
    )
    viz.add_argument(
        "--by",
        choices=("request", "seq"),
        help="colour cells by request (default when the trace's annotations name requests) "
        "or by sequence",
    )
    viz.set_defaults(run=run, parser=viz)


def _check_output(path: Path, kind: str) -> str | None:
    """Why `path` cannot hold a `kind` picture, or None."""
    from matplotlib import rcParams
    from matplotlib.backend_bases import FigureCanvasBase

    extension = path.suffix.lower().removeprefix(".")
    found = f"has the extension .{extension}" if extension else "has no extension"
    if kind == "movie":
        return None if extension == "gif" else f"{path} {found}; a movie is written as .gif"
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    if extension not in formats:
        return f"{path} {found}; give one matplotlib writes: .{', .'.join(formats)}"
    if extension == "pgf" and shutil.which(rcParams["pgf.texsystem"]) is None:
        return f"{path}: .pgf needs {rcParams['pgf.texsystem']}, which is not installed"
    return None


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from numbakv.core.errors import TraceError
    from numbakv.trace.frames import load_trace

    for option, value, kinds in (
        ("--steps", args.steps, ONE_STEP),
        ("--cells", args.cells, NO_CELLS),
        ("--bin", args.bin, NO_CELLS),
        ("--by", args.by, NO_OWNERS),
        ("--step", args.step, ("movie",)),
    ):
        if value is not None and args.kind in kinds:
            parser.error(
                f"argument {option}: it does not apply to --kind {args.kind}; drop it, or "
                f"draw another --kind"
            )
    if problem := _check_output(args.output, args.kind):
        parser.error(f"argument -o/--output: {problem}")
    try:
        trace = load_trace(args.trace)
    except TraceError as error:
        return fail(parser, str(error))
    n_steps = trace.n_steps
    if n_steps == 0:
        return fail(parser, f"{args.trace} records no step, so there is nothing to draw")
    step = n_steps - 1 if args.step is None else args.step
    if not -n_steps <= step < n_steps:
        parser.error(
            f"argument --step: {step} is outside the trace's {n_steps} recorded steps; "
            f"give -{n_steps} to {n_steps - 1}"
        )
    windows = trace.config.distinct_windows
    window = windows[0] if args.window is None else args.window
    if window not in windows:
        parser.error(f"argument --window: {window} is not one of the trace's windows {windows}")
    from numbakv.viz.layout import ZoomError

    try:
        return _draw(args, trace, step % n_steps, window)
    except ZoomError as error:  # a range past what this picture of this trace shows
        parser.error(f"argument --{error.what}: {error}")
    except OSError as error:
        return fail(parser, f"cannot write {args.output} ({error.strerror or error}); {CHECK}")


def _draw(args, trace, step: int, window: int) -> int:
    from numbakv.viz import (
        plot_all,
        plot_cells,
        plot_locality,
        plot_mask,
        plot_metrics,
        plot_timeline,
        save_movie,
    )
    from numbakv.viz.progress import Progress

    steps = args.steps
    zoom = {"cells": args.cells, "bin": args.bin, "dpi": args.dpi}
    progress = Progress(f"drawing {args.kind}")
    frame = trace.step_frames[step]
    draw = {
        "all": lambda: plot_all(
            trace, step, window, steps=steps, by=args.by, progress=progress, **zoom
        ),
        "cells": lambda: plot_cells(trace, step, by=args.by, **zoom),
        "timeline": lambda: plot_timeline(
            trace, steps=steps, mark_step=step, by=args.by, progress=progress, **zoom
        ),
        "metrics": lambda: plot_metrics(trace, steps=steps, mark_step=step, dpi=args.dpi),
        "locality": lambda: plot_locality(trace, steps=steps, mark_step=step, dpi=args.dpi),
        "mask": lambda: plot_mask(trace.step(frame), window, **zoom),
    }
    if args.kind == "movie":
        save_movie(trace, args.output, steps=steps, by=args.by, progress=progress, **zoom)
    else:
        png = args.output.suffix.lower() == ".png"
        options = {"pil_kwargs": {"compress_level": PNG_LEVEL}} if png else {}
        draw[args.kind]().savefig(args.output, dpi=args.dpi, **options)
    progress.close()
    print(f"wrote {args.output}")
    return 0
