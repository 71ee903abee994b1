"""Module paths of numbakv 0.1 that moved in 0.2: importing one still works and warns.

`import numbakv.model` gives the module `numbakv.serve.model` itself (the same object), and
a `DeprecationWarning` naming the new path. The README's changelog lists them.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds each old path of MOVED and loads it as the module at its new path."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        warnings.warn(
            f"{spec.name} moved to {MOVED[spec.name]}; import it from there "
            "(the old path goes in a later release)",
            DeprecationWarning,
            stacklevel=3,
        )
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """Nothing to run: the module is the new one, already imported."""


def install() -> None:
    """Adds the finder once, after the regular ones (a moved path has no file of its own)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
