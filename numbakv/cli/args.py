"""What the commands share: the one-line usage error and failure, and the argparse types,
each a thin adapter over the checks of `numbakv.core.calls` (their message, as argparse's)."""

import argparse
import pkgutil
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from numbakv.core.errors import ConfigError
from numbakv.core.paths import existing_file, new_file
from numbakv.core.values import at_most, int_at_least

CHECK = "check the folder's permissions and free space"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} --help`)\n")


def one_line(message: str) -> str:
    return " ".join(str(message).split())


def fail(parser: argparse.ArgumentParser, message: str) -> int:
    """Prints `message` as the command's one-line failure on stderr; returns exit status 1."""
    print(f"{parser.prog}: {one_line(message)}", file=sys.stderr)
    return 1


def integer(name: str, minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: the option `name`'s integer in [minimum, maximum]; argparse names
    the option, so the message starts at the value."""

    def parse(text: str) -> int:
        try:
            value = int_at_least(name, int(text), minimum)
            return value if maximum is None else at_most(name, value, maximum)
        except ValueError:  # int() of what is not an integer
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error).removeprefix(f"{name}=")) from None

    return parse


def input_file(text: str) -> Path:
    """An argparse type: an existing file."""
    return existing_file(text, argparse.ArgumentTypeError)


def output_file(suffix: str | None = None) -> Callable[[str], Path]:
    """An argparse type: a file to write, in a folder that exists, ending in `suffix`."""
    return lambda text: new_file(text, suffix, argparse.ArgumentTypeError)


def factory(text: str) -> Callable:
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


def span(text: str) -> tuple[int, int | None]:
    """An argparse type for --cells and --steps: "A:B" (0 <= A < B), "A:" (to the end) or
    ":B", as (A, B or None)."""
    match = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", text)
    if not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a range; give A:B, A: or :B")
    lo, hi = int(match[1] or 0), int(match[2]) if match[2] else None
    if hi is not None and hi <= lo:
        raise argparse.ArgumentTypeError(f"{text!r} is empty; give A:B with A < B")
    return lo, hi
