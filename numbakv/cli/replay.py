"""`numbakv replay LOG --against MODULE:FACTORY`: an op log (`numbakv.testing.OpLog`) or a
trace of every verb replayed into a cache beside the reference, shrunk on a difference."""

import argparse

from numbakv.cli.args import factory, input_file


def add_command(commands) -> None:
    """Adds the `replay` command to the `numbakv` subcommands."""
    replay = commands.add_parser(
        "replay", help="replay an op log (numbakv.testing.OpLog) on a cache beside the reference"
    )
    replay.add_argument("oplog", type=input_file, metavar="LOG",
                        help="a .json op log (OpLog) or a .npz trace of every verb")  # fmt: skip
    replay.add_argument(
        "--against", type=factory, metavar="MODULE:FACTORY", required=True,
        help="the cache under test: a callable taking a CacheConfig, e.g. numbakv:CellCache",
    )  # fmt: skip
    replay.add_argument("--compare", choices=("semantic", "table"), default="semantic",
                        help="what must agree (default semantic; table: cell layouts)")  # fmt: skip
    replay.set_defaults(run=run, parser=replay)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from numbakv.errors import TraceError
    from numbakv.testing.from_trace import trace_ops
    from numbakv.testing.oplog import load_ops
    from numbakv.testing.ops import Divergence
    from numbakv.testing.replay import replay
    from numbakv.trace import load_trace

    try:
        if args.oplog.suffix == ".npz":  # Recorder(cache, every_verb=True)
            trace = load_trace(args.oplog)
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
