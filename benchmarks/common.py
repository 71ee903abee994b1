"""What the benchmarks share: the machine header, tables, sizes, the timing loop, and the
`prog COMMAND [options]` of a module that holds several benchmarks."""

import argparse
import contextlib
import gc
import os
import platform
import time
from collections.abc import Callable, Iterator

import numpy as np

KI = 1024
MI = 1024 * KI


def print_machine(*packages: str) -> None:
    """The python, numpy (and `packages`' versions), machine and cpus lines of a header."""
    from importlib.metadata import version

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    print(f"  python   {platform.python_version()} ({platform.python_implementation()})")
    print(f"  numpy    {np.__version__}")
    for package in packages:
        print(f"  {package:<8} {version(package)}")
    print(f"  machine  {platform.platform()}, {platform.machine()}")
    print(f"  cpus     {os.cpu_count()} (usable by this process: {usable})")


def print_table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> None:
    """Prints rows under headers, first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]

    def line(cells) -> str:
        parts = [
            str(x).ljust(w) if i == 0 else str(x).rjust(w)
            for i, (x, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return indent + "  ".join(parts).rstrip()

    print(line(headers))
    print(indent + "  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


def cells_label(n: int) -> str:
    """A number of cells as "16 Ki", "1 Mi", or itself."""
    if n % MI == 0:
        return f"{n // MI} Mi"
    if n % KI == 0:
        return f"{n // KI} Ki"
    return str(n)


def mib(n_bytes: int) -> str:
    """Bytes as MiB, one decimal."""
    return f"{n_bytes / MI:.1f}"


def timed(
    run: Callable[[], object], repeat: int, undo: Callable[[], object] | None = None
) -> list[float]:
    """Seconds (time.perf_counter) of each of `repeat` calls of `run()`, one after another,
    as a list; `undo()`, untimed, after each."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        if undo is not None:
            undo()
    return times


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
    """The garbage collector off inside the block (no collection lands in a timed call)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[..., int | None]]


def run_command(
    prog: str, description: str, commands: dict[str, Command], argv: list[str] | None = None
) -> int:
    """Runs `prog COMMAND [options]`: `commands` is {name: (one line of help, a function
    that adds the command's options to its parser, its run(args, parser))}; returns run's
    exit code (None: 0)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    subparsers = parser.add_subparsers(dest="command", required=True)
    parsers = {}
    for name, (line, add_arguments, _) in commands.items():
        parsers[name] = subparsers.add_parser(name, help=line, description=line)
        add_arguments(parsers[name])
    args = parser.parse_args(argv)
    return commands[args.command][2](args, parsers[args.command]) or 0
