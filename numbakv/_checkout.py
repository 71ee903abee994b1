"""A checkout's sibling folders: run from the repository's root, `numbakv.reference` and
`numbakv.viz` are the folders `reference/` and `viz/` beside `numbakv/` (installed, they are
inside it, where the regular finders find them first)."""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

SIBLINGS = ("numbakv.reference", "numbakv.viz")


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
    """Adds the finder once, after the regular ones, in a checkout: no reference/ inside
    `package_dir`, one beside it."""
    root = package_dir.parent
    if any(isinstance(finder, CheckoutSiblings) for finder in sys.meta_path):
        return
    if not (package_dir / "reference").is_dir() and (root / "reference" / "__init__.py").is_file():
        sys.meta_path.append(CheckoutSiblings(root))
