"""Names of numbakv 0.5 that moved or were renamed in 0.6. Each keeps working for this
release with a `DeprecationWarning` naming its new name, and goes in 0.7.

Module paths (`MOVED`): `import numbakv.trace_file` gives the module `numbakv.trace.file`
itself (the same object), the warning attributed to the line that imported it.
Attributes (`renamed`): a property that warns, then reads the new attribute; keywords
(`renamed_keyword`): a decorator that warns, then passes the keyword under its new name.
The README's changelog lists them.
"""

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

MOVED = {
    "numbakv.cache._cuda": "numbakv.cache.cuda",
    "numbakv.cli_viz": "numbakv.cli.viz",
    "numbakv.demo": "numbakv.cli.demo",
    "numbakv.trace_checks": "numbakv.trace.checks",
    "numbakv.trace_file": "numbakv.trace.file",
    "numbakv.trace_scan": "numbakv.trace.scan",
}
REMOVED_IN = "0.7"


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    """The DeprecationWarning of a renamed name, attributed to its user's line."""
    warnings.warn(
        f"{old} is {new} since numbakv 0.6; {old} goes in {REMOVED_IN}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds each old path of MOVED and loads it as the module at its new path."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        # stacklevel 3: this frame, then (warnings skips importlib's) the importing line
        warn(spec.name, MOVED[spec.name], stacklevel=3)
        module = importlib.import_module(MOVED[spec.name])
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """Nothing to run; importlib gave the module the old path's spec: give back its own."""
        module.__spec__ = self._specs.pop(module.__name__)


def install() -> None:
    """Adds the finder once, first: an old path below a moved package would otherwise be
    found by the path finder as a second copy of the new module."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())


def renamed_keyword(old: str, new: str, owner: str):
    """A decorator: calls that pass the keyword `old` warn and pass it as `new`."""

    def decorate(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            if old in kwargs:
                warn(f"{owner}({old}=)", f"{owner}({new}=)")
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call

    return decorate


def renamed(old: str, new: str, owner: str) -> property:
    """A read-only property `old` of class `owner` that warns and returns `self.<new>`."""

    def read(self):
        warn(f"{owner}.{old}", f"{owner}.{new}")
        return getattr(self, new)

    return property(read, doc=f"Deprecated: `{new}`.")
