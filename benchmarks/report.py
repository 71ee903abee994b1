"""What the benchmarks share: the reference benchmarks' model shape and windows, and what
they print (the machine, tables, sizes)."""

import os
import platform

import numpy as np

KI = 1024
MI = 1024 * KI
N_KV_HEADS = 2  # the reference benchmarks' model
N_HEADS = 8
HEAD_DIM = 64


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
    if n % MI == 0:
        return f"{n // MI} Mi"
    if n % KI == 0:
        return f"{n // KI} Ki"
    return str(n)


def mib(n_bytes: int) -> str:
    return f"{n_bytes / MI:.1f}"


def windows_for(n_layers: int, window: int) -> tuple[int, ...]:
    """All global (window 0), or `window` on every second layer (on the only one if one)."""
    if window == 0:
        return (0,) * n_layers
    if n_layers == 1:
        return (window,)
    return tuple(window if layer % 2 else 0 for layer in range(n_layers))
