"""Every registered kernel compiles to PTX for sm_80 and sm_90, with no float64 in it.

The simulator runs Python that no GPU compiler accepts, so each kernel is also compiled
for real, without a GPU: subprocesses with NUMBAKV_DEVICE=compile (numba without the
simulator; one per core, each a share of the kernels) compile every REGISTRY entry for
every signature, write each PTX to a file and print one JSON object each. Each signature is
typed and lowered to LLVM IR once (for the first cc) and NVVM emits its PTX for every cc
from that IR: numba-cuda 0.30 lowers alike for every cc >= 7.5 (its only cc tests are the
float64 atomic add, cc 6.0, and fastmath tanh, cc 7.5), and the lowering is 80 % of a
compile. Where a ptxas of
the NVVM's release is at hand, every kernel's sm_90 PTX is also assembled (registers,
shared memory, spills), the assemblies run side by side.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import numbakv

CCS = [(8, 0), (9, 0)]
ATTENTION = "numbakv.cache.kernels.attention"
MERGE = f"{ATTENTION}.merge.merge_splits"
# (K kind, V kind) -> the (K pool, V pool) dtypes its kernels compile for (bfloat16 pools
# hold uint16 patterns, quantized pools bytes): every kind as K and as V
POOL_DTYPES = {"float": ("float32", "float16"), "bfloat16": ("uint16",), "q8_0": ("uint8",),
               "q4_0": ("uint8",), "fp8_e4m3": ("uint8",)}  # fmt: skip
PAIRS = [(k, k) for k in POOL_DTYPES]


def suffix(k_kind: str, v_kind: str) -> str:
    short = {"float": "", "bfloat16": "_bf16"}
    return short.get(k_kind, f"_{k_kind}") if k_kind == v_kind else f"_{k_kind}_{v_kind}"


def pool_pairs(k_kind: str, v_kind: str) -> set[tuple[str, str]]:
    k, v = POOL_DTYPES[k_kind], POOL_DTYPES[v_kind]
    return set(zip(k, v * 2, strict=False))


# attention kernel -> the (K pool, V pool) dtypes it compiles for
ATTENTION_POOLS = {
    f"{ATTENTION}.{shape}.attend_{mode}_{shape}{suffix(*pair)}{tail}": pool_pairs(*pair)
    for shape, tail in (("decode", "_d128_h4"), ("prefill", "_d128"))
    for mode in ("masked", "gathered")
    for pair in PAIRS
}
# the kernels of bfloat16 q, out and K/V inputs (uint16 patterns) made at import: one of each
# code path, over float32 pools
BFLOAT16_IO = {
    f"{ATTENTION}.decode.attend_gathered_decode_q_bf16_out_bf16_d128_h4": "uint16",
    f"{ATTENTION}.prefill.attend_gathered_prefill_q_bf16_out_bf16_d128": "uint16",
    f"{MERGE}_out_bf16": "uint16",
}
SCATTERS = {f"scatter_kv{suffix(*pair)}": pool_pairs(*pair) for pair in PAIRS}
# the kernels of element loads (head_dim 40 is not a whole number of 16-byte loads)
NARROW = f"{ATTENTION}.decode.attend_gathered_decode_d40_h4_narrow"
NARROW_PREFILL = f"{ATTENTION}.prefill.attend_gathered_prefill_d40_narrow"
ATTENTION_KERNELS = {*ATTENTION_POOLS, MERGE, *BFLOAT16_IO, NARROW, NARROW_PREFILL}
SMEM_LIMIT = 48 * 1024  # static shared memory per block
DEVICE_MODEL = "numbakv.device_model.kernels"
DEVICE_MODEL_KERNELS = {
    f"{DEVICE_MODEL}.{name}"
    for name in (
        "embed",
        "qkv_rotary",
        "residual_matmul",
        "matmul",
        "add_rows",
        "swiglu",
        "lm_head",
    )
}
KERNELS = {
    *(f"numbakv.cache.kernels.placement.{name}" for name in SCATTERS),
    "numbakv.cache.kernels.placement.scatter_kv_q_bf16",
    "numbakv.cache.kernels.placement.prepare_tokens",
    "numbakv.cache.kernels.verbs.add_owner",
    "numbakv.cache.kernels.verbs.drop_owner",
    "numbakv.cache.kernels.verbs.clear_table",
    "numbakv.cache.kernels.masks.write_masks",
    "numbakv.cache.kernels.seq_cells.copy_prefix",
    "numbakv.cache.kernels.seq_cells.set_length",
    "numbakv.cache.kernels.seq_cells.clear_lengths",
    "numbakv.cache.kernels.rows.gather_rows",
    "numbakv.cache.kernels.rows.scatter_rows",
    *ATTENTION_KERNELS,
    *DEVICE_MODEL_KERNELS,
}

COMPILE_ALL = textwrap.dedent(
    """
    import gc, json, re, sys, time
    from pathlib import Path

    from numba.cuda.compiler import _compile_pyfunc_with_fixup as lower

    from numbakv.cache.cuda import MODE
    from numbakv.cache.kernels import load_all
    import numbakv.device_model.kernels  # registers the device model's kernels

    assert MODE == "compile", MODE
    # lowering makes millions of short-lived objects: collections that skip the imports'
    # objects (freeze) and come less often take ~15 % off the compile, its output the same
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    ccs = [tuple(cc) for cc in json.loads(sys.argv[1])]
    shard, n_shards = int(sys.argv[2]), int(sys.argv[3])  # this process: every n-th kernel
    result = {}
    for name, (fn, signatures, options) in sorted(load_all().items())[shard::n_shards]:
        runs = result[name] = []
        for i, sig in enumerate(signatures):
            start = time.perf_counter()
            try:  # what cuda.compile_ptx does, its lowering shared by the ccs
                library, _ = lower(fn, sig, debug=None, lineinfo=False, device=False,
                                   fastmath=False, cc=ccs[0], opt=None, abi="numba",
                                   abi_info=None, forceinline=False, lto=False, **options)
                error = None
            except Exception as e:  # reported, not raised: one failure hides no other
                error = f"{type(e).__name__}: {e}"
            for cc in ccs:
                run = {"sig": str(sig), "cc": list(cc), "target": None, "f64": [], "error": error,
                       "ptx_file": None}
                ptx = None
                try:
                    ptx = None if error else library.get_asm_str(cc=cc)
                except Exception as e:
                    run["error"] = f"{type(e).__name__}: {e}"
                if ptx is not None:
                    target = re.search(r"^\\.target\\s+(\\w+)", ptx, re.MULTILINE)
                    run["target"] = target and target.group(1)
                    run["f64"] = [ln.strip() for ln in ptx.splitlines() if ".f64" in ln][:5]
                    path = Path(f"{name}.{i}.sm_{cc[0]}{cc[1]}.ptx").resolve()
                    path.write_text(ptx)
                    run["ptx_file"] = str(path)
                run["seconds"] = time.perf_counter() - start  # the first cc's has the lowering
                start = time.perf_counter()
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
    folder = tmp_path_factory.mktemp("ptx")
    n_shards = min(2, os.cpu_count() or 1)  # the kernels split over the cores, each compiled once
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", COMPILE_ALL, json.dumps(CCS), str(shard), str(n_shards)],
            cwd=folder,
            env=env,
            **pipes,
        )
        for shard in range(n_shards)
    ]
    result = {}
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"compile-only run failed:\n{err[-4000:]}"
        result |= json.loads(out.strip().splitlines()[-1])
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


@pytest.mark.parametrize("name", sorted(SCATTERS))
def test_scatter_kv_compiles_every_dtype_pair(compiled, name):
    sigs = {r["sig"] for r in compiled[f"numbakv.cache.kernels.placement.{name}"]}
    dtypes = [re.findall(r"((?:float|uint)\d+)\[", sig) for sig in sigs]  # k, v, pools
    pairs = {(f[0], f[2], f[3]) for f in dtypes if f[0] == f[1]}
    assert pairs == {(x, *pools) for x in ("float32", "float16") for pools in SCATTERS[name]}


def test_bfloat16_inputs_and_outputs_compile_as_uint16_patterns(compiled):
    scatter = compiled["numbakv.cache.kernels.placement.scatter_kv_q_bf16"]
    assert {tuple(re.findall(r"((?:float|uint)\d+)\[", r["sig"])) for r in scatter} == {
        ("uint16", "uint16", "float32", "float32", "float32")  # k, v, pools, kv_scales
    }
    for name, dtype in BFLOAT16_IO.items():
        for r in compiled[name]:
            arrays = re.findall(r"((?:float|uint)\d+)\[", r["sig"])
            assert dtype in (arrays[0], arrays[-1]), (name, r["sig"])  # q, or out (merge)
            assert not r["error"] and not r["f64"], (name, r)


def test_attention_kernels_compile_for_every_storage_dtype(compiled):
    for name, expected in ATTENTION_POOLS.items():
        sigs = [r["sig"] for r in compiled[name]]
        pools = {tuple(re.findall(r"((?:float|uint)\d+)\[", sig)[1:3]) for sig in sigs}
        assert pools == expected, (name, pools)
        assert not [r for r in compiled[name] if r["error"] or r["f64"]]


def ptxas_or_skip() -> str:
    """The ptxas cuda.pathfinder finds (the pip one first), or pytest.skip with the reason."""
    try:
        from cuda import pathfinder

        ptxas = pathfinder.find_nvidia_binary_utility("ptxas")
    except Exception as e:  # no cuda-pathfinder, or it raised: nothing to run
        pytest.skip(f"cuda.pathfinder cannot look for ptxas: {type(e).__name__}: {e}")
    if not ptxas:
        pytest.skip("no ptxas found (install numba-cuda[cu12] for a matching one)")
    return ptxas


def ptxas_report(ptxas: str, ptx_file: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [ptxas, "-v", "--gpu-name", "sm_90", ptx_file, "-o", os.devnull],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_kernel_assembles_for_sm90_without_spills(compiled):
    # the attention kernels size every shared and register array for head_dim 128
    # (HEAD_DIM_MAX), so one assembly per signature is the head_dim 128 figure
    ptxas = ptxas_or_skip()
    release = subprocess.run([ptxas, "--version"], capture_output=True, text=True, timeout=60)
    runs = [(name, r) for name in sorted(KERNELS) for r in compiled[name]
            if r["cc"] == [9, 0]]  # fmt: skip
    ptx_version = re.search(r"^\.version\s+(\S+)", Path(runs[0][1]["ptx_file"]).read_text(), re.M)
    first = ptxas_report(ptxas, runs[0][1]["ptx_file"])
    if first.returncode and "Unsupported .version" in first.stderr:
        line = release.stdout.strip().splitlines()[-1] if release.stdout else "?"
        pytest.skip(
            f"{ptxas} ({line}) rejects PTX .version {ptx_version and ptx_version.group(1)}: "
            "pair NVVM with a ptxas of its release (NUMBA_NOTES)"
        )
    problems = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        reports = list(pool.map(lambda run: ptxas_report(ptxas, run[1]["ptx_file"]), runs))
    for (name, r), proc in zip(runs, reports, strict=True):
        if proc.returncode:
            problems.append(f"{name} {r['sig']}: ptxas failed: {proc.stderr[-2000:]}")
            continue
        report = proc.stdout + proc.stderr
        registers = re.findall(r"Used (\d+) registers", report)
        smem = [int(x) for x in re.findall(r"(\d+) bytes smem", report)] or [0]
        spills = re.findall(r"(\d+) bytes spill (stores|loads)", report)
        pool = re.findall(r"((?:float|uint)\d+)\[", r["sig"])[1:2]  # q, then k_pool
        label = name.rsplit(".", 1)[1] + (f" [{pool[0]} pool]" if name in ATTENTION_POOLS else "")
        print(f"{label} sm_90: {','.join(registers)} registers, {max(smem)} bytes smem, "
              f"spills {spills}")  # fmt: skip
        if not registers or not spills:
            problems.append(f"{name} {r['sig']}: no register or spill figures in:\n{report}")
        if "0 bytes spill stores" not in report or "0 bytes spill loads" not in report:
            problems.append(f"{name} {r['sig']}: spills:\n{report}")
        if any(int(n) for n, _ in spills):
            problems.append(f"{name} {r['sig']}: spills {spills}")
        if max(smem) > SMEM_LIMIT:
            problems.append(f"{name} {r['sig']}: {max(smem)} bytes of shared memory")
    assert not problems, "\n".join(problems)
