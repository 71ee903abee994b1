"""`numbakv replay LOG --against MODULE:FACTORY`: an op log (`numbakv.testing.OpLog`) or a
trace of every verb replayed into a cache beside the reference, shrunk on a difference.

Exit 0: the cache agrees; 1: it diverged (any exception of the cache is a divergence), the
shrunk op script on stdout; 2: a usage error, one line on stderr and never a traceback: a
log that cannot be read or that a replay could not hold (`load_ops`), a factory that cannot
be imported, that raises or that makes no cache (`CacheUnderTest`), or a failure outside
the cache under test.
"""

import argparse
from pathlib import Path

from numbakv.cli.args import factory, input_file
from numbakv.core.values import short_repr

CACHE_VERBS = ("seq_new", "seq_clone", "seq_rm", "rewind", "clear", "declare_step",
               "prepare_step", "write", "attend", "pos")  # fmt: skip
CACHE_STATE = ("live_seqs", "used_cells", "free_cells")


def add_command(commands) -> None:
    """Adds the `replay` command to the `numbakv` subcommands."""
    replay = commands.add_parser(
        "replay", help="replay an op log (numbakv.testing.OpLog) on a cache beside the reference"
    )
    replay.add_argument("oplog", type=log_file, metavar="LOG",
                        help="a .json op log (OpLog) or a .npz trace of every verb")  # fmt: skip
    replay.add_argument(
        "--against", type=named_factory, metavar="MODULE:FACTORY", required=True,
        help="the cache under test: a callable taking a CacheConfig, e.g. numbakv:CellCache",
    )  # fmt: skip
    replay.add_argument("--compare", choices=("semantic", "table"), default="semantic",
                        help="what must agree (default semantic; table: cell layouts)")  # fmt: skip
    replay.set_defaults(run=run, parser=replay)


def log_file(text: str) -> Path:
    """An argparse type: an existing file (a name the system refuses, too long say, too)."""
    try:
        return input_file(text)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot open {text}: {error.strerror}") from None


def named_factory(text: str) -> tuple[str, object]:
    """An argparse type: (text, the factory MODULE:NAME names), for messages that name it."""
    return text, factory(text)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from numbakv.testing.ops import Divergence
    from numbakv.testing.replay import replay

    config, ops = _read(args.oplog, parser)
    name, make = args.against
    built = [_probe(name, make, config, parser)]  # the first run gets the cache probed

    def cache_factory(config):
        return built.pop() if built else make(config)

    try:
        replay(ops, cache_factory, config=config, compare=args.compare)
    except Divergence as error:
        print(error)
        return 1
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # the reference, the kit or a SystemExit of the cache
        parser.error(f"replaying {args.oplog} failed outside the comparison: {_said(error)}")
    print(f"{len(ops)} ops replayed: the cache agrees with the reference")
    return 0


def _read(path: Path, parser: argparse.ArgumentParser):
    """(config, ops) of the log or trace at `path`; a usage error when it is neither."""
    from numbakv.core.errors import TraceError
    from numbakv.testing.from_trace import trace_ops
    from numbakv.testing.oplog_file import check_config_bytes, load_ops
    from numbakv.trace.frames import load_trace

    try:
        if path.suffix != ".npz":
            return load_ops(path)
        trace = load_trace(path)  # Recorder(cache, every_verb=True)
        check_config_bytes(trace.config)
        return trace.config, trace_ops(trace)
    except (ValueError, TraceError) as error:
        message = str(error)
        parser.error(f"argument LOG: {message if str(path) in message else f'{path}: {message}'}")
    except Exception as error:  # whatever else a hostile .npz makes NumPy or zipfile raise
        parser.error(f"argument LOG: {path}: {_said(error)}")


def _probe(name: str, make, config, parser: argparse.ArgumentParser):
    """`make(config)`, checked to be a cache; a usage error naming the factory otherwise."""
    try:
        cache = make(config)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # anything, SystemExit included: one line, exit 2
        parser.error(f"argument --against: {name}(config) {_said(error)}")
    missing = [verb for verb in CACHE_VERBS if not callable(_get(cache, verb))]
    missing += [field for field in CACHE_STATE if _get(cache, field) is _MISSING]
    if missing:
        parser.error(
            f"argument --against: {name}(config) returned {short_repr(cache)} "
            f"({type(cache).__name__}), not a cache: it has no {', '.join(missing)} "
            "(see numbakv.testing.protocol.CacheUnderTest)"
        )
    return cache


_MISSING = object()


def _get(cache, name: str):
    """cache.name, or _MISSING when it has none (a property that raises counts as present)."""
    try:
        return getattr(cache, name, _MISSING)
    except Exception:
        return None


def _said(error: BaseException) -> str:
    return f"raised {type(error).__name__}: {error}"
