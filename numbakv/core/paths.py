"""The file paths a caller names, checked: a file to write (`new_file`) or to read
(`existing_file`), each refused with the error the caller names (the command line's
argparse error, a StateError, a ValueError), naming the path and what to do; a path the
system cannot even look at (a name past the file system's limit, a NUL byte) included."""

from pathlib import Path


def new_file(path, suffix: str | None = None, error: type[Exception] = ValueError) -> Path:
    """`path` as a Path to write: not a folder, in a folder that exists (a file there is
    overwritten), ending in `suffix` when one is given; else `error` saying what to do."""
    path = Path(path)
    if _stat(path, error) is not None and path.is_dir():
        raise error(f"{path} is a folder; give a file name in it")
    if _stat(path.parent, error) is None or not path.parent.is_dir():
        raise error(f"{path}: the folder {path.parent} does not exist; create it first")
    if suffix is not None and path.suffix != suffix:
        raise error(f"{path} does not end in {suffix}; give e.g. {path.stem}{suffix}")
    return path


def existing_file(path, error: type[Exception] = ValueError) -> Path:
    """`path` as a Path to a file that exists, else `error` saying what is there."""
    path = Path(path)
    if _stat(path, error) is None:
        raise error(f"no file at {path}; check the path")
    if path.is_dir():
        raise error(f"{path} is a folder; give the file in it")
    return path


def _stat(path: Path, error: type[Exception]):
    """`path`'s stat, None where nothing is there; `error` where the system cannot even look
    (a name longer than the file system allows, a folder that cannot be searched)."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as problem:  # ValueError: a NUL byte in the name
        name = str(path).replace("\0", "\\0")
        name = name if len(name) <= 80 else f"{name[:77]}..."
        raise error(f"{name}: {getattr(problem, 'strerror', None) or problem}") from None
