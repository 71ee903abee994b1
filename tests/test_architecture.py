"""The arrows between the parts (docs/architecture.md), read off every module's imports (AST).

Each rule binds the modules below a package and says what they must never import — at the
top of a file or inside a function, directly, through `numbakv`'s lazy names, through a
moved 0.1 path, or through a checkout's `reference`/`viz` folders. Shared types and checks
sit at the top of `numbakv`; the three wings — reference, device cache, serving — import
them and never each other, so a differential test compares two implementations, not one.
"""

import ast
from pathlib import Path

import numbakv
import numbakv.cache
import numbakv.reference
import numbakv.viz
from numbakv._moved import MOVED

SHARED = (
    "numbakv.errors",
    "numbakv.config",
    "numbakv.snapshot",
    "numbakv.observe",
    "numbakv.checks",
)
ENTRY_POINTS = ("numbakv.trace", "numbakv.viz", "numbakv.demo", "numbakv.cli")
CACHE_OBJECTS = tuple(
    f"numbakv.cache.{name}"
    for name in ("cellcache", "step", "pool", "buffers", "table", "bittree", "arena")
)
# (who, the only numbakv modules it may import, the other modules it must not import)
ALLOWED = (
    ("numbakv.reference", (*SHARED, "numbakv.reference"), ("numba", "matplotlib")),
    ("numbakv.serve", (*SHARED, "numbakv.serve"), ("numba", "matplotlib")),
    *((shared, SHARED, ("numba", "matplotlib")) for shared in SHARED),
)
# (who, what it must not import); a name matches a prefix when equal or below it
FORBIDDEN = (
    ("numbakv.cache", ("numbakv.reference", "numbakv.serve", "numbakv.device_model")),
    ("numbakv.cache", ENTRY_POINTS),
    ("numbakv.device_model", ("numbakv.reference", "numbakv.viz", *ENTRY_POINTS)),
    ("numbakv.testing", ("numba", "numbakv.cache", "numbakv.device_model", "numbakv.serve")),
    ("numbakv.testing", ("matplotlib", *ENTRY_POINTS)),
    ("numbakv.cache.kernels", CACHE_OBJECTS),
    ("numbakv.viz", ("numba", "numbakv.cache", "numbakv.serve", "numbakv.demo", "numbakv.cli")),
    ("numbakv.trace", ("numba", "numbakv.cache", "numbakv.serve", "numbakv.viz")),
)
CUDA_OWNER = "numbakv.cache.cuda"  # the one module that imports numba.cuda
LAZY = {"numbakv": numbakv._EXPORTS, "numbakv.cache": numbakv.cache._EXPORTS}
DYNAMIC_IMPORTERS = ("numbakv", "numbakv.cache", "numbakv._moved", "numbakv.cache.kernels")
CHECKOUT_FOLDERS = {"reference": "numbakv.reference", "viz": "numbakv.viz"}


def package_sources() -> dict[str, tuple[str, bool]]:
    """{module name: (source, is a package)} of every module of numbakv, numbakv.reference
    and numbakv.viz, wherever they are (beside numbakv/ in a checkout, inside it installed)."""
    roots = {
        "numbakv": Path(numbakv.__file__).parent,
        "numbakv.reference": Path(numbakv.reference.__file__).parent,
        "numbakv.viz": Path(numbakv.viz.__file__).parent,
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


def resolve(name: str) -> str:
    """What importing `name` loads: a checkout folder as its package, a moved path as its new
    one, a lazy name of numbakv or numbakv.cache as the module that defines it."""
    head, _, rest = name.partition(".")
    if head in CHECKOUT_FOLDERS:
        name = CHECKOUT_FOLDERS[head] + (f".{rest}" if rest else "")
    for old, new in MOVED.items():
        if is_below(name, old):
            name = new + name[len(old) :]
    package, _, attribute = name.rpartition(".")
    return LAZY.get(package, {}).get(attribute, name)


def imports_of(name: str, source: str, is_package: bool = False) -> set[str]:
    """Every module `source` (of module `name`) imports, resolved: `import a.b` gives a.b;
    `from a import b` gives a and a.b (b may be a module); relative imports are anchored."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # level 1 is the module's package (a package's own, for __init__)
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {resolve(imported) for imported in found}


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


def violations(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """'importer -> imported' for every forbidden arrow."""
    found = []
    for name, (source, is_package) in sorted(sources.items()):
        imported = sorted(imports_of(name, source, is_package))
        for who, allowed, forbidden in ALLOWED:
            if is_below(name, who):
                found += [f"{name} -> {i}" for i in imported
                          if (is_below(i, "numbakv") and not any(is_below(i, a) for a in allowed))
                          or any(is_below(i, f) for f in forbidden)]  # fmt: skip
        for who, forbidden in FORBIDDEN:
            if is_below(name, who):
                found += [f"{name} -> {i}" for i in imported
                          if any(is_below(i, f) for f in forbidden)]  # fmt: skip
        odd = odd_imports(source)
        if name != CUDA_OWNER:
            found += [f"{name} -> {i} (only {CUDA_OWNER} imports numba.cuda)"
                      for i in [*imported, *odd] if is_below(i, "numba.cuda")]  # fmt: skip
        if name not in DYNAMIC_IMPORTERS:
            found += [f"{name} -> {call}" for call in odd if call.endswith("call")]
    return found


def test_no_forbidden_arrow():
    assert violations(package_sources()) == []


def test_every_rule_binds_some_module():
    names = package_sources()
    for who, *_ in (*ALLOWED, *FORBIDDEN):
        assert any(is_below(name, who) for name in names), f"no module under {who}"
    assert CUDA_OWNER in names
    assert set(DYNAMIC_IMPORTERS) <= set(names)


def test_a_forbidden_import_is_caught():
    # the checker itself, on made-up modules: one forbidden arrow of each kind
    leaks = {
        "numbakv.reference.leak": "from numbakv.cache import HostTable\n",
        "numbakv.reference.lazy": "from numbakv import CellCache\n",
        "numbakv.reference.moved": "from numbakv.table import HostTable\n",
        "numbakv.reference.trace": "from numbakv.trace import Recorder\n",
        "numbakv.cache.leak": "def f():\n    from ..reference import step\n",
        "numbakv.cache.folder": "from reference.step import window_mask\n",
        "numbakv.serve.leak": "import numba\n",
        "numbakv.serve.lazy": "def f():\n    import numbakv\n    return numbakv.Model\n"
        "from numbakv import CellCache\n",
        "numbakv.viz.leak": "from numba import njit\n",
        "numbakv.cache.kernels.leak": "from numbakv.cache import CellCache\n",
        "numbakv.cache.cuda_leak": "from numba import cuda\n",
        "numbakv.cache.cuda_attribute": "import numba\nnumba.cuda.jit\n",
        "numbakv.cache.dynamic": "import importlib\nimportlib.import_module('numbakv.serve')\n",
    }
    sources = package_sources()
    leaks["numbakv.errors"] = sources["numbakv.errors"][0] + "from numbakv.serve import model\n"
    found = violations(sources | {name: (code, False) for name, code in leaks.items()})
    assert {line.split(" -> ")[0] for line in found} == set(leaks)
    assert "numbakv.reference.lazy -> numbakv.cache.cellcache" in found
    assert "numbakv.reference.moved -> numbakv.cache.table" in found
    assert "numbakv.cache.folder -> numbakv.reference.step" in found
    assert "numbakv.cache.kernels.leak -> numbakv.cache.cellcache" in found


def test_imports_resolve():
    assert "numbakv.reference.step" in imports_of(
        "numbakv.reference.cache", "from .step import Step"
    )
    assert "numbakv.reference.step" in imports_of("numbakv.reference", "from .step import S", True)
    assert "numbakv.serve" in imports_of("numbakv.cache.table", "from ..serve import model")
    assert resolve("numbakv.Engine") == "numbakv.serve.engine"
    assert resolve("numbakv.kernels.masks") == "numbakv.cache.kernels.masks"
    assert resolve("viz.plots") == "numbakv.viz.plots"


def test_no_module_is_over_400_lines():
    # the project's rule: one module per idea, none over 400 lines
    checkout = Path(__file__).resolve().parents[1]
    folders = [checkout / name for name in ("numbakv", "reference", "viz", "benchmarks")]
    assert all(folder.is_dir() for folder in folders), folders
    lines = {
        path.relative_to(checkout).as_posix(): len(path.read_text().splitlines())
        for folder in folders
        for path in folder.rglob("*.py")
    }
    assert len(lines) > len(folders)
    too_long = [f"{path} ({n} lines)" for path, n in sorted(lines.items()) if n > 400]
    assert not too_long, "over 400 lines: " + ", ".join(too_long)
