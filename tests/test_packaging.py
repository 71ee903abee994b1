"""The package's shape: import boundaries, the error hierarchy, the console script."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import numbakv
from numbakv import errors


@pytest.mark.parametrize(
    "module",
    [
        "numbakv",
        "numbakv.errors",
        "numbakv.config",
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


MOVED = textwrap.dedent(
    """
    import json, sys, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numbakv.trace_file, numbakv.trace.file
        from numbakv.trace_scan import replay_codes
        from numbakv.cli_viz import add_command
        import numbakv.demo
    import numbakv.cli.demo, numbakv.cli.viz, numbakv.trace.scan
    print(json.dumps({
        "same": numbakv.trace_file is numbakv.trace.file
        and replay_codes is numbakv.trace.scan.replay_codes
        and add_command is numbakv.cli.viz.add_command
        and sys.modules["numbakv.demo"] is numbakv.cli.demo
        and numbakv.trace.file.__spec__.name == "numbakv.trace.file",
        "warnings": [str(w.message) for w in caught if w.category is DeprecationWarning],
        "lines": [w.lineno for w in caught if w.category is DeprecationWarning],
    }))
    """
)


def test_moved_modules_still_import_and_warn(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", MOVED], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["same"]
    assert result["warnings"] == [
        f"numbakv.{old} is numbakv.{new} since numbakv 0.6; numbakv.{old} goes in 0.7"
        for old, new in [
            ("trace_file", "trace.file"),
            ("trace_scan", "trace.scan"),
            ("cli_viz", "cli.viz"),
            ("demo", "cli.demo"),
        ]
    ]
    assert result["lines"] == [5, 6, 7, 8]  # each warning names the line that imported


@pytest.mark.parametrize(
    "old", ["numbakv.model", "numbakv.executor", "numbakv.table", "numbakv.kernels.masks"]
)
def test_the_paths_of_0_1_are_gone(old, tmp_path):
    code = f"import {old}"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr, done.stderr


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
    from numbakv.config import CacheConfig

    assert numbakv.CacheConfig is CacheConfig
    assert numbakv.StepError is errors.StepError
    assert set(numbakv.__all__) <= set(dir(numbakv))
    for name in numbakv.__all__:
        assert getattr(numbakv, name).__name__ == name
    with pytest.raises(AttributeError):
        numbakv.NoSuchName  # noqa: B018


def test_reference_shares_the_config_class():
    import numbakv.reference

    assert numbakv.reference.CacheConfig is numbakv.CacheConfig


def test_reference_docstrings_run():
    import doctest

    import numbakv.reference.cache

    result = doctest.testmod(numbakv.reference.cache)
    assert result.attempted > 0 and result.failed == 0


def test_renamed_attributes_and_keywords_still_work_and_warn():
    import numpy as np

    from numbakv.reference import CellCache
    from numbakv.serve.model import Model, ModelConfig
    from numbakv.serve.requests import Completion, RequestMetrics, TokenEvent

    event = TokenEvent(3, 0, 7, np.zeros(2, np.float32), None)
    done = Completion(4, [1], [[2]], ["length"], RequestMetrics(None, None, 1, 1))
    model = Model.from_seed(ModelConfig(d_model=8, n_heads=2, n_kv_heads=1, head_dim=4,
                                        d_ff=8, windows=(0,)), 0)  # fmt: skip
    cache = CellCache(model.config.cache_config(capacity=8, max_width=4, max_seqs=1))
    cache.declare_step([cache.seq_new()] * 2)
    step = cache.prepare_step()
    snapshot = cache.snapshot()
    with pytest.warns(DeprecationWarning, match=r"TokenEvent\.request is TokenEvent\.request_id"):
        assert event.request == event.request_id == 3
    with pytest.warns(DeprecationWarning, match=r"Completion\.request is Completion\.request_id"):
        assert done.request == done.request_id == 4
    with pytest.warns(DeprecationWarning, match=r"Snapshot\.live_ids is Snapshot\.live_seqs"):
        assert snapshot.live_ids.tolist() == snapshot.live_seqs.tolist() == [0]
    with pytest.warns(DeprecationWarning, match=r"Model\.forward\(rows=\) is Model\.forward\("):
        old = model.forward(cache, step, [1, 2], rows=[1])
    cache.rewind(0, 0)
    cache.declare_step([0, 0])
    step = cache.prepare_step()
    np.testing.assert_array_equal(old, model.forward(cache, step, [1, 2], logits_at=[1]))


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
