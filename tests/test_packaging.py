"""The package's shape: import boundaries, the error hierarchy, the console script."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import numbakv
from numbakv.core import errors


@pytest.mark.parametrize(
    "module",
    [
        "numbakv",
        "numbakv.core.errors",
        "numbakv.core.config",
        "numbakv.reference",
        "numbakv.trace",
        "numbakv.viz",
        "numbakv.cache",
        "numbakv.cache.device",
        "numbakv.serve",
        "numbakv.serve.model",
        "numbakv.serve.tokenizer",
        "numbakv.serve.sampling",
        "numbakv.serve.plan",
        "numbakv.serve.scheduler",
        "numbakv.serve.executor",
        "numbakv.serve.protocol",
        "numbakv.serve.engine",
        "numbakv.serve.lockstep",
        "numbakv.testing",
    ],
)
def test_import_does_not_import_numba(module, tmp_path):
    code = f"import sys, {module}; sys.exit(int('numba' in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, f"importing {module} imported numba\n{done.stderr}"


def test_the_host_table_imports_numba_but_not_numba_cuda(tmp_path):
    code = (
        "import sys, numbakv.cache.table; "
        "sys.exit(2 * ('numba' not in sys.modules) + ('numba.cuda' in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, (
        f"exit {done.returncode} (2: no numba, 1: numba.cuda)\n{done.stderr}"
    )


def test_the_device_cache_imports_without_a_device_context(tmp_path):
    # compile mode has numba.cuda but no GPU: a module that touched the driver at import
    # (a stream, a context) would raise CudaSupportError here, and on a GPU would create
    # device 0's context before the user chose a device
    code = "import numbakv.cache.cellcache, numbakv.cache.streams; print('ok')"
    env = {**os.environ, "NUMBAKV_DEVICE": "compile"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize(
    "old",
    [
        *("numbakv.model", "numbakv.executor", "numbakv.table", "numbakv.kernels.masks"),  # 0.1
        *("numbakv.trace_file", "numbakv.trace_scan", "numbakv.cli_viz", "numbakv.demo"),  # 0.5
        *(f"numbakv.{name}" for name in ("checks", "config", "config_formats", "tensors")),  # 0.14
        *(f"numbakv.{name}" for name in ("dlpack", "state", "errors", "formats", "_deprecated")),
    ],
)
def test_old_paths_are_gone(old, tmp_path):
    code = f"import {old}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, done.stderr


def test_renamed_attributes_and_keywords_are_gone():
    from numbakv.core.snapshot import Snapshot
    from numbakv.device_model import kernels
    from numbakv.serve.model import Model
    from numbakv.serve.requests import Completion, TokenEvent

    assert not any(hasattr(cls, "request") for cls in (TokenEvent, Completion))
    assert not hasattr(Snapshot, "live_ids") and not hasattr(kernels, "ROWS")
    assert "rows" not in Model.forward.__code__.co_varnames


REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    not (REPO_ROOT / "pyproject.toml").is_file(), reason="the tests are not in a checkout"
)
def test_the_repository_root_imports_its_own_package():
    # from a checkout's root, numbakv/ shadows any installed numbakv; its reference/ and
    # viz/ siblings must then be numbakv.reference and numbakv.viz (README, "From a checkout")
    code = (  # without an editable install's finder, which would find them on its own
        "import json, sys; "
        "sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in type(f).__name__]; "
        "import numbakv.reference, numbakv.viz; "
        "print(json.dumps([numbakv.__file__, numbakv.reference.__file__, numbakv.viz.__file__]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    files = [Path(f) for f in json.loads(done.stdout)]
    assert files == [
        REPO_ROOT / "numbakv" / "__init__.py",
        REPO_ROOT / "reference" / "__init__.py",
        REPO_ROOT / "viz" / "__init__.py",
    ]


WINGS_APART = textwrap.dedent(
    """
    import json, sys
    import numbakv.{first}
    {load}
    below = lambda m, p: m == p or m.startswith(p + ".")
    print(json.dumps(sorted(m for m in sys.modules if any(below(m, p) for p in {others!r}))))
    """
)


@pytest.mark.parametrize(
    ("first", "load", "others"),
    [
        ("cache.cellcache", "numbakv.cache.kernels.load_all()", ("numbakv.reference",)),
        ("reference", "", ("numbakv.cache", "numbakv.serve", "numba")),
        ("serve.engine", "import numbakv.serve.lockstep", ("numbakv.cache", "numbakv.reference")),
    ],
    ids=["cache", "reference", "serve"],
)
def test_a_wing_loads_without_the_others(first, load, others, tmp_path):
    code = WINGS_APART.format(first=first, load=load, others=others)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_error_hierarchy():
    assert issubclass(errors.ConfigError, errors.CacheError)
    assert issubclass(errors.SequenceError, errors.CacheError)
    assert issubclass(errors.CapacityError, errors.CacheError)
    assert issubclass(errors.AllocationError, errors.CapacityError)
    assert issubclass(errors.StepError, errors.CacheError)
    assert issubclass(errors.BindingError, errors.CacheError)
    assert issubclass(errors.CacheError, Exception)


def test_lazy_exports_resolve():
    from numbakv.core.config import CacheConfig

    assert numbakv.CacheConfig is CacheConfig
    assert numbakv.StepError is errors.StepError
    assert set(numbakv.__all__) <= set(dir(numbakv))
    for name in numbakv.__all__:
        assert getattr(numbakv, name).__name__ == name
    with pytest.raises(AttributeError):
        numbakv.NoSuchName  # noqa: B018


def test_each_public_name_has_one_path():
    import numbakv.cache
    import numbakv.reference
    import numbakv.testing
    import numbakv.trace

    # numbakv's names resolve through the module that defines each
    for name, module in numbakv._EXPORTS.items():
        assert getattr(getattr(numbakv, name), "__module__", module) == module, name
    # a subpackage names its own objects only: none is also one of numbakv's names
    assert not hasattr(numbakv.reference, "CacheConfig") and not hasattr(numbakv.trace, "Recorder")
    for package in (numbakv.reference, numbakv.trace, numbakv.cache, numbakv.testing):
        for name in package.__all__:
            assert getattr(package, name) is not getattr(numbakv, name, None), (package, name)


def test_reference_docstrings_run():
    import doctest

    import numbakv.reference.cache

    result = doctest.testmod(numbakv.reference.cache)
    assert result.attempted > 0 and result.failed == 0


def test_every_package_of_the_checkout_is_installed():
    """pyproject's package list names every folder of Python modules under numbakv/,
    reference/ and viz/: an editable install finds a forgotten one, a wheel does not."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[1]
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"numbakv": root / "numbakv", "numbakv.reference": root / "reference",
               "numbakv.viz": root / "viz"}  # fmt: skip
    found = set()
    for package, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            parts = init.parent.relative_to(folder).parts
            found.add(".".join((package, *parts)))
    assert found == set(setup["packages"])
