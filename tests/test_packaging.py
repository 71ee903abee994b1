"""The package's shape: import boundaries, the error hierarchy, the console script."""

import subprocess
import sys

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
        "numbakv.model",
        "numbakv.sampling",
        "numbakv.plan",
        "numbakv.scheduler",
        "numbakv.executor",
        "numbakv.engine",
        "numbakv.lockstep",
    ],
)
def test_import_does_not_import_numba(module, tmp_path):
    code = f"import sys, {module}; sys.exit(int('numba' in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, f"importing {module} imported numba\n{done.stderr}"


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
