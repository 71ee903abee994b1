"""The arrows between the parts (docs/architecture.md), read off every module's imports (AST).

Every module of numbakv (the reference and viz included) and of benchmarks belongs to exactly
one part, and a part imports only the parts its rule allows — at the top of a file or inside
a function, directly, through `numbakv`'s lazy names, or through a checkout's
`reference`/`viz` folders. A module no part claims fails the test, so a
new module is bound the day it lands. Beside the arrows: no import cycle between modules
(imports under `if TYPE_CHECKING:` included: a cycle there still says two modules are one
idea, or one sits in the wrong layer), no import of a private (`_name`) module from outside
its package, and numba.cuda imported by one module only. The shared types and checks
(numbakv.core) sit at the bottom; the three wings — reference, device cache, serving —
import them and never each other, so a differential test compares two implementations, not
one.
"""

import ast
from pathlib import Path

import numbakv
import numbakv.cache
import numbakv.reference
import numbakv.viz

CHECKOUT = Path(__file__).resolve().parents[1]
# part -> the modules it holds: a name and every module below it (the longest name wins);
# "package" holds exactly its three modules
PARTS = {
    "package": ("numbakv", "numbakv.__main__", "numbakv._checkout"),
    "core": ("numbakv.core",),
    "reference": ("numbakv.reference",),
    "cache": ("numbakv.cache",),
    "kernels": ("numbakv.cache.kernels",),
    "device_model": ("numbakv.device_model",),
    "serve": ("numbakv.serve",),
    "testing": ("numbakv.testing",),
    "launches": ("numbakv.testing.launches",),
    "trace": ("numbakv.trace",),
    "viz": ("numbakv.viz",),
    "cli": ("numbakv.cli",),
    "integrations": ("numbakv.integrations",),
    "distributed": ("numbakv.distributed",),
    "benchmarks": ("benchmarks",),
}  # fmt: skip
EXACT = ("package",)  # parts whose names are modules, not prefixes
BASE = ("core", "package")  # what every part of numbakv may import
# part -> what of numbakv it may import besides BASE and itself: parts, or modules (a name
# with a dot that is not a part's name), and the outside modules it must never import
TORCH = ("torch", "transformers")  # the transformers extra: imported by integrations only
RULES = {
    "package": (("cli",), TORCH),
    "core": ((), ("numba", "matplotlib", *TORCH)),
    "reference": ((), ("numba", "matplotlib", *TORCH)),
    "cache": (("kernels",), ("matplotlib", *TORCH)),
    "kernels": (("numbakv.cache.cuda", "numbakv.cache.device"), ("matplotlib", *TORCH)),
    "device_model": (("cache", "kernels", "numbakv.serve.model"), ("matplotlib", *TORCH)),
    "serve": ((), ("numba", "matplotlib", *TORCH)),
    "testing": (("reference",), ("numba", "matplotlib", *TORCH)),
    "launches": ((), ("matplotlib", *TORCH)),
    "trace": (("reference",), ("numba", "matplotlib", *TORCH)),
    "viz": (("trace",), ("numba", *TORCH)),
    "cli": (tuple(PARTS), TORCH),
    "integrations": (("serve",), ("numba", "matplotlib")),
    "distributed": (("serve",), ("numba", "matplotlib", "transformers")),
    "benchmarks": (tuple(PARTS), ()),
}
CUDA = "numba.cuda"
CUDA_OWNER = "numbakv.cache.cuda"  # the one module that imports numba.cuda
SIMULATOR = "numba.cuda.simulator"  # numba's simulator: patched below these, and the owner
SIMULATOR_PATCHERS = (CUDA_OWNER, "numbakv.cache.simulator", "numbakv.testing.launches")
LAZY = {"numbakv": numbakv._EXPORTS, "numbakv.cache": numbakv.cache._EXPORTS}
DYNAMIC_IMPORTERS = ("numbakv", "numbakv.cache", "numbakv.cache.kernels")
CHECKOUT_FOLDERS = {"reference": "numbakv.reference", "viz": "numbakv.viz"}


def package_sources() -> dict[str, tuple[str, bool]]:
    """{module name: (source, is a package)} of every module of numbakv, numbakv.reference
    and numbakv.viz, wherever they are (beside numbakv/ in a checkout, inside it installed),
    and of the checkout's benchmarks."""
    roots = {
        "numbakv": Path(numbakv.__file__).parent,
        "numbakv.reference": Path(numbakv.reference.__file__).parent,
        "numbakv.viz": Path(numbakv.viz.__file__).parent,
        "benchmarks": CHECKOUT / "benchmarks",
    }
    sources = {}
    for package, root in roots.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            sources[name] = (path.read_text(), path.name == "__init__.py")
    return sources


def is_below(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def is_ours(name: str) -> bool:
    head = name.partition(".")[0]
    return head in ("numbakv", "benchmarks") or head in CHECKOUT_FOLDERS


def part_of(name: str) -> str | None:
    """The part holding module `name` (the longest matching name), or None: unbound."""
    found = [
        (len(prefix), part)
        for part, prefixes in PARTS.items()
        for prefix in prefixes
        if (name == prefix if part in EXACT else is_below(name, prefix))
    ]
    return max(found)[1] if found else None


def resolve(name: str) -> str:
    """What importing `name` loads: a checkout folder as its package, a lazy name of numbakv
    or numbakv.cache as the module that defines it."""
    head, _, rest = name.partition(".")
    if head in CHECKOUT_FOLDERS:
        name = CHECKOUT_FOLDERS[head] + (f".{rest}" if rest else "")
    package, _, attribute = name.rpartition(".")
    return LAZY.get(package, {}).get(attribute, name)


def _imports(name: str, source: str, is_package: bool, modules=None):
    """(imported name, line) of every import in `source`, resolved: `import a.b` gives a.b;
    `from a import b` gives a.b when it is one of `modules` (and a otherwise), or both a and
    a.b when `modules` is None or `a` is not numbakv's; relative imports are anchored."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield resolve(alias.name), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # level 1 is the module's package (a package's own, for __init__)
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            below = [resolve(f"{base}.{alias.name}") for alias in node.names]
            if modules is None or not is_ours(base):
                yield from ((imported, node.lineno) for imported in [resolve(base), *below])
            else:
                found = [imported for imported in below if imported in modules]
                if len(found) < len(below):
                    found.append(resolve(base))
                yield from ((imported, node.lineno) for imported in found)


def imports_of(name: str, source: str, is_package: bool = False) -> set[str]:
    """Every module `source` (of module `name`) imports, resolved (see `_imports`)."""
    return {imported for imported, _ in _imports(name, source, is_package)}


def odd_imports(source: str) -> list[str]:
    """Imports an import statement does not show: import_module/__import__ calls, and the
    attribute numba.cuda."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__"):
                found.append(f"{called}() call")
        is_numba = isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "numba"
        if is_numba and node.attr == "cuda":
            found.append("numba.cuda")
    return found


def allowed(importer_part: str, imported: str) -> bool:
    """Whether a module of `importer_part` may import the numbakv module `imported`."""
    others, _ = RULES[importer_part]
    for rule in (importer_part, *BASE, *others):
        if rule in PARTS and part_of(imported) == rule:
            return True
        if rule not in PARTS and is_below(imported, rule):
            return True
    return False


def is_private_to_another(importer: str, imported: str) -> bool:
    """True when `imported` is or is below a private module (`_name`) whose package
    `importer` is not in: a private module is its package's own."""
    parts = imported.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return not is_below(importer, ".".join(parts[:i]))
    return False


def violations(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """'importer -> imported (why)' for every forbidden arrow, and 'module: unbound' for
    every module no part holds."""
    found = []
    for name, (source, is_package) in sorted(sources.items()):
        part = part_of(name)
        if part is None:
            found.append(f"{name}: unbound (no part of tests/test_architecture.py holds it)")
            continue
        imported = sorted({i for i, _ in _imports(name, source, is_package, sources)})
        outside = RULES[part][1]
        for i in imported:
            if is_ours(i) and not allowed(part, i):
                found.append(f"{name} -> {i} (a {part} module)")
            if any(is_below(i, f) for f in outside):
                found.append(f"{name} -> {i} (a {part} module never imports it)")
            if is_private_to_another(name, i):
                found.append(f"{name} -> {i} (private to its package)")
        odd = odd_imports(source)
        for i in [*imported, *odd]:
            patcher = any(is_below(name, p) for p in SIMULATOR_PATCHERS)
            cuda_owner = patcher if is_below(i, SIMULATOR) else name == CUDA_OWNER
            if is_below(i, CUDA) and not cuda_owner:
                found.append(f"{name} -> {i} (only {CUDA_OWNER} imports numba.cuda)")
        if name not in DYNAMIC_IMPORTERS:
            found += [f"{name} -> {call}" for call in odd if call.endswith("call")]
    return found


def import_cycles(sources: dict[str, tuple[str, bool]]) -> list[list[str]]:
    """The groups of modules that import each other, each sorted (strongly connected
    components of the graph of every import, inside functions and under TYPE_CHECKING too)."""
    graph = {
        name: {
            imported
            for imported, _ in _imports(name, source, is_package, sources)
            if imported in sources and imported != name
        }
        for name, (source, is_package) in sources.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return cycles


def test_no_forbidden_arrow_and_every_module_bound():
    assert violations(package_sources()) == []


def test_no_import_cycle():
    assert import_cycles(package_sources()) == []


def test_every_part_holds_some_module():
    names = package_sources()
    for part, prefixes in PARTS.items():
        assert any(part_of(name) == part for name in names), f"no module in part {part}"
        assert all(any(is_below(n, p) for n in names) for p in prefixes), prefixes
    assert CUDA_OWNER in names and set(SIMULATOR_PATCHERS) <= set(names)
    assert set(DYNAMIC_IMPORTERS) <= set(names)


def test_a_forbidden_import_is_caught():
    # the checker itself, on made-up modules: one forbidden arrow of each kind
    leaks = {
        "numbakv.reference.leak": "from numbakv.cache import HostTable\n",
        "numbakv.reference.lazy": "from numbakv import CellCache\n",
        "numbakv.reference.trace": "from numbakv.trace import Recorder\n",
        "numbakv.cache.leak": "def f():\n    from ..reference import step\n",
        "numbakv.cache.folder": "from reference.step import window_mask\n",
        "numbakv.serve.leak": "import numba\n",
        "numbakv.serve.lazy": "def f():\n    import numbakv\n    return numbakv.Model\n"
        "from numbakv import CellCache\n",
        "numbakv.viz.leak": "from numba import njit\n",
        "numbakv.trace.leak": "from numbakv.viz import plot_cells\n",
        "numbakv.testing.leak": "from numbakv.testing.launches import count_device_calls\n",
        "numbakv.cache.kernels.leak": "from numbakv.cache.cellcache import CellCache\n",
        "numbakv.cache.cuda_leak": "from numba import cuda\n",
        "numbakv.cache.cuda_attribute": "import numba\nnumba.cuda.jit\n",
        "numbakv.cache.simulated": "from numba.cuda.simulator import kernel\n",
        "numbakv.cache.dynamic": "import importlib\nimportlib.import_module('numbakv.serve')\n",
        "numbakv.device_model.private": "from numbakv.serve._helpers import real\n",
        "benchmarks.private": "from numbakv._checkout import install\n",
        "numbakv.stray": "import numpy\n",
        "benchmarks.stray.deep": "import numbakv.viz\n",  # bound: below benchmarks
    }
    sources = package_sources()
    leaks["numbakv.core.errors"] = (
        sources["numbakv.core.errors"][0] + "from numbakv.serve import model\n"
    )
    found = violations(sources | {name: (code, False) for name, code in leaks.items()})
    expected = set(leaks) - {"benchmarks.stray.deep"}
    assert {line.split(" -> ")[0].split(":")[0] for line in found} == expected
    assert "numbakv.reference.lazy -> numbakv.cache.cellcache (a reference module)" in found
    assert "numbakv.cache.folder -> numbakv.reference.step (a cache module)" in found
    assert "numbakv.cache.kernels.leak -> numbakv.cache.cellcache (a kernels module)" in found
    assert (
        "numbakv.device_model.private -> numbakv.serve._helpers (private to its package)" in found
    )
    assert "benchmarks.private -> numbakv._checkout (private to its package)" in found
    assert "numbakv.stray: unbound (no part of tests/test_architecture.py holds it)" in found


def test_a_planted_cycle_is_caught():
    sources = package_sources()
    planted = {
        "numbakv.serve.ping": ("from numbakv.serve import pong\n", False),
        "numbakv.serve.pong": ("def f():\n    from numbakv.serve.ping import g\n", False),
        "numbakv.viz.typed": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from numbakv.viz.plots import plot_cells\n", False),
        "numbakv.viz.plots": (sources["numbakv.viz.plots"][0] + "import numbakv.viz.typed\n",
                              False),
    }  # fmt: skip
    cycles = import_cycles(sources | planted)  # the second through a TYPE_CHECKING import
    assert sorted(cycles) == [["numbakv.serve.ping", "numbakv.serve.pong"],
                              ["numbakv.viz.plots", "numbakv.viz.typed"]]  # fmt: skip


def test_a_private_module_belongs_to_its_package():
    assert is_private_to_another("numbakv.device_model.model", "numbakv.serve._guards")
    assert not is_private_to_another("numbakv.serve.engine", "numbakv.serve._guards")
    assert not is_private_to_another("numbakv.serve.engine", "numbakv._checkout")
    assert is_private_to_another("benchmarks.common", "numbakv._checkout")
    assert not is_private_to_another("numbakv.cache.cellcache", "numbakv.cache.kernels.__init__")


def test_imports_resolve():
    assert "numbakv.reference.step" in imports_of(
        "numbakv.reference.cache", "from .step import Step"
    )
    assert "numbakv.reference.step" in imports_of("numbakv.reference", "from .step import S", True)
    assert "numbakv.serve" in imports_of("numbakv.cache.table", "from ..serve import model")
    assert resolve("numbakv.Engine") == "numbakv.serve.engine"
    assert resolve("viz.plots") == "numbakv.viz.plots"
    assert part_of("numbakv.cache.kernels.masks") == "kernels"
    assert part_of("numbakv.cache.cellcache") == "cache"
    assert part_of("numbakv") == "package" and part_of("numbakv.nothing") is None


def test_no_module_is_over_400_lines():
    # the project's rule: one module per idea, none over 400 lines
    folders = [CHECKOUT / name for name in ("numbakv", "reference", "viz", "benchmarks")]
    assert all(folder.is_dir() for folder in folders), folders
    lines = {
        path.relative_to(CHECKOUT).as_posix(): len(path.read_text().splitlines())
        for folder in folders
        for path in folder.rglob("*.py")
    }
    assert len(lines) > len(folders)
    too_long = [f"{path} ({n} lines)" for path, n in sorted(lines.items()) if n > 400]
    assert not too_long, "over 400 lines: " + ", ".join(too_long)
