"""Every registered kernel compiles to PTX for sm_80 and sm_90, with no float64 in it.

The simulator runs Python that no GPU compiler accepts, so each kernel is also compiled
for real, without a GPU: a subprocess with NUMBAKV_DEVICE=compile (numba without the
simulator) compiles every REGISTRY entry for every signature and prints one JSON object.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import numbakv

CCS = [(8, 0), (9, 0)]
KERNELS = {
    "numbakv.kernels.placement.scatter_kv",
    "numbakv.kernels.placement.place_tokens",
    "numbakv.kernels.verbs.add_owner",
    "numbakv.kernels.verbs.drop_owner",
    "numbakv.kernels.verbs.clear_table",
    "numbakv.kernels.masks.write_mask",
}

COMPILE_ALL = textwrap.dedent(
    """
    import json, re, sys, time

    from numbakv.device import MODE, cuda
    from numbakv.kernels import load_all

    assert MODE == "compile", MODE
    ccs = [tuple(cc) for cc in json.loads(sys.argv[1])]
    result = {}
    for name, (fn, signatures, options) in load_all().items():
        runs = result[name] = []
        for sig in signatures:
            for cc in ccs:
                run = {"sig": str(sig), "cc": list(cc), "target": None, "f64": [], "error": None}
                start = time.perf_counter()
                try:
                    ptx, _ = cuda.compile_ptx(fn, sig, cc=cc, **options)
                except Exception as e:  # reported, not raised: one failure hides no other
                    run["error"] = f"{type(e).__name__}: {e}"
                else:
                    target = re.search(r"^\\.target\\s+(\\w+)", ptx, re.MULTILINE)
                    run["target"] = target and target.group(1)
                    run["f64"] = [ln.strip() for ln in ptx.splitlines() if ".f64" in ln][:5]
                run["seconds"] = time.perf_counter() - start
                runs.append(run)
    print(json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """{kernel name: [{sig, cc, target, f64, error, seconds}, ...]} from a compile-only run."""
    repo_root = Path(numbakv.__file__).resolve().parents[1]
    env = dict(os.environ, NUMBAKV_DEVICE="compile", NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", COMPILE_ALL, json.dumps(CCS)],
        cwd=tmp_path_factory.mktemp("ptx"),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"compile-only run failed:\n{proc.stderr[-4000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, runs in sorted(result.items()):  # shown with -s: the compile time of each kernel
        total = sum(run["seconds"] for run in runs)
        print(f"{name}: {len(runs)} compiles in {total:.2f} s")
    return result


def test_registry_holds_every_kernel(compiled):
    assert set(compiled) == KERNELS
    assert all(compiled.values()), "a kernel registered with no signature"


def test_every_kernel_compiles_for_every_signature(compiled):
    errors = [f"{name} {r['sig']} cc={r['cc']}: {r['error']}" for name, runs in compiled.items()
              for r in runs if r["error"]]  # fmt: skip
    assert not errors, "\n".join(errors)
    for runs in compiled.values():
        n_sigs = len({r["sig"] for r in runs})
        assert len(runs) == n_sigs * len(CCS)


def test_ptx_targets_the_asked_architecture(compiled):
    for name, runs in compiled.items():
        for r in runs:
            major, minor = r["cc"]
            assert r["target"] == f"sm_{major}{minor}", (name, r["sig"], r["target"])


def test_ptx_has_no_float64(compiled):
    f64 = {f"{name} {r['sig']}": r["f64"] for name, runs in compiled.items() for r in runs}
    assert not any(f64.values()), {k: v for k, v in f64.items() if v}


def test_scatter_kv_compiles_every_dtype_pair(compiled):
    sigs = {r["sig"] for r in compiled["numbakv.kernels.placement.scatter_kv"]}
    floats = [re.findall(r"(float\d+)\[", sig) for sig in sigs]  # k, v, k_pool, v_pool
    pairs = {(f[0], f[2]) for f in floats if f[0] == f[1] and f[2] == f[3]}
    assert pairs == {(x, s) for x in ("float32", "float16") for s in ("float32", "float16")}
