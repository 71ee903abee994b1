"""NUMBAKV_DEVICE picks the device once, before numba is imported."""

import json
import os
import subprocess
import sys

import pytest

from numbakv.cache.device import gpu_count

HAS_GPU = gpu_count() > 0


def run(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBAKV_", "NUMBA_"))}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=environ, capture_output=True, text=True
    )


INFO = "import json, numbakv; print(json.dumps(numbakv.device_info()))"


def test_auto_picks_gpu_or_simulator(tmp_path):
    done = run(INFO, tmp_path)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["mode"] == ("gpu" if HAS_GPU else "sim")


def test_sim_and_compile(tmp_path):
    code = INFO + "; import numba; print(numba.config.ENABLE_CUDASIM)"
    sim = run(code, tmp_path, NUMBAKV_DEVICE="sim")
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout.splitlines()[0])["name"] == "numba CUDA simulator"
    assert sim.stdout.splitlines()[1] == "1"
    compile_only = run(code, tmp_path, NUMBAKV_DEVICE="compile")
    assert compile_only.returncode == 0, compile_only.stderr
    assert json.loads(compile_only.stdout.splitlines()[0])["mode"] == "compile"
    assert compile_only.stdout.splitlines()[1] == "0"


@pytest.mark.parametrize("value", ["tpu", "GPU0"])
def test_unknown_mode_is_refused(tmp_path, value):
    done = run(INFO, tmp_path, NUMBAKV_DEVICE=value)
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and "NUMBAKV_DEVICE" in done.stderr


def test_gpu_mode(tmp_path):
    done = run(INFO, tmp_path, NUMBAKV_DEVICE="gpu")
    if HAS_GPU:
        assert done.returncode == 0 and json.loads(done.stdout)["mode"] == "gpu"
    else:
        assert done.returncode != 0
        assert "reports no GPU" in done.stderr


def test_numba_imported_first_must_agree(tmp_path):
    code = "import numba; import numbakv; numbakv.device_info()"
    done = run(code, tmp_path, NUMBAKV_DEVICE="sim", NUMBA_ENABLE_CUDASIM="0")
    assert done.returncode != 0 and "contradicts" in done.stderr
    agreed = run(code, tmp_path, NUMBAKV_DEVICE="sim", NUMBA_ENABLE_CUDASIM="1")
    assert agreed.returncode == 0, agreed.stderr


def test_importing_numbakv_imports_no_numba_until_used(tmp_path):
    code = "import sys, numbakv; assert 'numba' not in sys.modules; numbakv.CellCache; print('ok')"
    done = run(code, tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_rank_takes_its_gpu_and_one_device_ignores_it(tmp_path):
    """`use_device(LOCAL_RANK)`: the rank's GPU (modulo those it sees) on a GPU; the
    simulator's one device otherwise."""
    code = (
        "import numbakv\nfrom numbakv.cache.cuda import cuda, use_device, MODE\n"
        "use_device(5)\nprint(MODE, cuda.get_current_device().id if MODE == 'gpu' else -1)"
    )
    done = run(code, tmp_path)
    assert done.returncode == 0, done.stderr
    mode, device = done.stdout.split()
    expect = 5 % gpu_count() if HAS_GPU else -1
    assert (mode, int(device)) == ("gpu" if HAS_GPU else "sim", expect)
