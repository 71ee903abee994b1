"""The `numbakv` command line: `numbakv demo`, `numbakv viz` and `numbakv replay`.

Exit codes: 0 done; 2 a usage error (a bad option value, a missing input, an output in a
folder that does not exist or with an extension matplotlib cannot write, a factory that
cannot be imported), found before the work starts (for `--step` and `--window`, once the
trace is read; for `replay`, a damaged op log); 1 a failure (a damaged trace, the device
disagreeing with the reference, an output that could not be written, a replayed cache
diverging from the reference: then the shrunk op script is printed on stdout). Every error
is one line on stderr naming the bad argument or file.
"""

import argparse
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numbakv

CHECK = "check the folder's permissions and free space"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see `{self.prog} --help`)\n")


def main(argv: list[str] | None = None) -> int:
    """Runs `numbakv ARGS` (default: sys.argv[1:]); returns the exit status, or raises
    SystemExit(2) on a usage error (SystemExit(0) for --help and --version)."""
    parser = Parser(prog="numbakv", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"numbakv {numbakv.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="serve a mixed workload on the device, checked against the reference"
    )
    demo.add_argument("--seed", type=int_at_least(0), default=0, help="weights' seed (default 0)")
    demo.add_argument("--columns", type=int_at_least(1), default=64, help="cells per map line")
    demo.add_argument(
        "--trace", type=trace_output, metavar="FILE.npz", help="save the table per forward"
    )
    demo.set_defaults(run=_demo, parser=demo)
    from numbakv.cli_viz import add_viz  # it uses this module's argument types

    add_viz(commands)
    replay = commands.add_parser(
        "replay", help="replay an op log (numbakv.testing.OpLog) on a cache beside the reference"
    )
    replay.add_argument("oplog", type=trace_input, metavar="LOG",
                        help="a .json op log (OpLog) or a .npz trace of every verb")  # fmt: skip
    replay.add_argument(
        "--against", type=factory_spec, metavar="MODULE:FACTORY", required=True,
        help="the cache under test: a callable taking a CacheConfig, e.g. numbakv:CellCache",
    )  # fmt: skip
    replay.add_argument("--compare", choices=("semantic", "table"), default="semantic",
                        help="what must agree (default semantic; table: cell layouts)")  # fmt: skip
    replay.set_defaults(run=_replay, parser=replay)
    args = parser.parse_args(argv)
    return args.run(args, args.parser)


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= minimum."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}; give {minimum} or more")
        return value

    return parse


def trace_input(text: str) -> Path:
    """An argparse type: an existing file."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no file at {text}; check the path")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the trace file")
    return path


def factory_spec(text: str) -> Callable:
    """An argparse type: MODULE:NAME (NAME may be dotted), imported, a callable."""
    module_name, colon, name = text.partition(":")
    if not (colon and module_name and name):
        raise argparse.ArgumentTypeError(f"{text!r} is not MODULE:FACTORY, e.g. numbakv:CellCache")
    try:
        target = pkgutil.resolve_name(text)
    except AttributeError:
        raise argparse.ArgumentTypeError(f"{module_name} has no attribute {name}") from None
    except Exception as error:  # ImportError, or whatever the module raises on import
        raise argparse.ArgumentTypeError(
            f"cannot import {module_name} ({type(error).__name__}: {error})"
        ) from None
    if not callable(target):
        raise argparse.ArgumentTypeError(f"{text} is not callable; give a factory of caches")
    return target


def new_file(text: str) -> Path:
    """An argparse type: a file path whose folder exists (the file may exist: overwritten)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name in it")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text}: the folder {path.parent} does not exist; create it first"
        )
    return path


def trace_output(text: str) -> Path:
    """An argparse type: a new file ending in .npz (numpy would append .npz otherwise)."""
    path = new_file(text)
    if path.suffix != ".npz":
        raise argparse.ArgumentTypeError(f"{text} does not end in .npz; give e.g. {path.stem}.npz")
    return path


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def fail(parser: argparse.ArgumentParser, message: str) -> int:
    """Prints `message` as the command's one-line failure on stderr; returns exit status 1."""
    print(f"{parser.prog}: {_one_line(message)}", file=sys.stderr)
    return 1


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from numbakv import demo
    from numbakv.serve.lockstep import LockstepError

    trace = None if args.trace is None else str(args.trace)
    try:
        demo.run(seed=args.seed, columns=args.columns, trace_path=trace)
    except LockstepError as error:
        return fail(parser, f"the device path disagrees with the reference: {error}")
    except OSError as error:
        if trace is None:
            raise
        return fail(parser, f"cannot write the trace {trace} ({error.strerror or error}); {CHECK}")
    return 0


def _replay(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import numbakv.trace
    from numbakv.errors import TraceError
    from numbakv.testing.from_trace import trace_ops
    from numbakv.testing.oplog import load_ops
    from numbakv.testing.ops import Divergence
    from numbakv.testing.replay import replay

    try:
        if args.oplog.suffix == ".npz":  # Recorder(cache, every_verb=True)
            trace = numbakv.trace.load_trace(args.oplog)
            config, ops = trace.config, trace_ops(trace)
        else:
            config, ops = load_ops(args.oplog)
    except (ValueError, TraceError) as error:
        parser.error(f"argument LOG: {error}")
    try:
        replay(ops, args.against, config=config, compare=args.compare)
    except Divergence as error:
        print(error)
        return 1
    print(f"{len(ops)} ops replayed: the cache agrees with the reference")
    return 0
