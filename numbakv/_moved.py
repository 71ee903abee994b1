"""Module paths of numbakv 0.1 that moved in 0.2, and a checkout's sibling folders.

`import numbakv.model` gives the module `numbakv.serve.model` itself (the same object) and
a `DeprecationWarning` naming the new path, attributed to the line that imported it. The
README's changelog lists the paths.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from pathlib import Path

MOVED = {
    "numbakv.model": "numbakv.serve.model",
    "numbakv.sampling": "numbakv.serve.sampling",
    "numbakv.plan": "numbakv.serve.plan",
    "numbakv.scheduler": "numbakv.serve.scheduler",
    "numbakv.executor": "numbakv.serve.executor",
    "numbakv.engine": "numbakv.serve.engine",
    "numbakv.lockstep": "numbakv.serve.lockstep",
    "numbakv.table": "numbakv.cache.table",
    "numbakv.pool": "numbakv.cache.pool",
    "numbakv.step": "numbakv.cache.step",
    "numbakv.device": "numbakv.cache._cuda",
    "numbakv.kernels": "numbakv.cache.kernels",
    "numbakv.kernels.attention": "numbakv.cache.kernels.attention",
    "numbakv.kernels.masks": "numbakv.cache.kernels.masks",
    "numbakv.kernels.placement": "numbakv.cache.kernels.placement",
    "numbakv.kernels.seq_cells": "numbakv.cache.kernels.seq_cells",
    "numbakv.kernels.verbs": "numbakv.cache.kernels.verbs",
}
SIBLINGS = ("numbakv.reference", "numbakv.viz")  # folders beside numbakv/ in a checkout


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds each old path of MOVED and loads it as the module at its new path."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        warnings.warn(
            f"{spec.name} moved to {MOVED[spec.name]}; import it from there "
            "(the old path goes in a later release)",
            DeprecationWarning,
            stacklevel=2,  # warnings skips importlib's frames: this is the importing line
        )
        module = importlib.import_module(MOVED[spec.name])
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module) -> None:
        """Nothing to run; importlib gave the module the old path's spec: give back its own."""
        module.__spec__ = self._specs.pop(module.__name__)


class CheckoutSiblings(importlib.abc.MetaPathFinder):
    """Finds numbakv.reference and numbakv.viz in `root`/reference and `root`/viz."""

    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        if name not in SIBLINGS:
            return None
        folder = self.root / name.removeprefix("numbakv.")
        init = folder / "__init__.py"
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(folder)]
        )


def install(package_dir: Path) -> None:
    """Adds the finders once. The moved paths go first: an old path below a moved package
    (numbakv.kernels.masks) would otherwise be found by the path finder as a second copy
    of the new module. In a checkout (no reference/ inside `package_dir`, one beside it) the
    siblings are found after the regular finders, which an installed numbakv satisfies."""
    if any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, MovedModules())
    root = package_dir.parent
    if not (package_dir / "reference").is_dir() and (root / "reference" / "__init__.py").is_file():
        sys.meta_path.append(CheckoutSiblings(root))
