"""The kernels lowered to sm_90 PTX with line info, without a GPU, as tests/cache/test_ptx.py
does: subprocesses with NUMBAKV_DEVICE=compile (numba without the simulator) import every
kernel module (`numbakv.cache.kernels.load_all()`, and the device model's kernels), call
`numbakv.cache.kernels.attention.cost_specialisations()` when the attention package
defines it (it registers more specialisations, e.g. per head_dim), then lower every
signature of every REGISTRY entry whose name a pattern matches and write its PTX to a file.
The REGISTRY is the only list of kernels. numba's compiler is reached only inside the
subprocess's script, as in test_ptx (numbakv.cache.cuda stays the one module importing it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ATTENTION = "numbakv.cache.kernels.attention"
# what `python -m benchmarks.kernel_cost` reads by default (regular expressions, re.search)
DEFAULT_PATTERNS = (
    rf"^{re.escape(ATTENTION)}\.",  # decode, prefill, merge
    r"^numbakv\.cache\.kernels\.placement\.scatter_kv",
    r"^numbakv\.cache\.kernels\.placement\.prepare_tokens$",
    r"^numbakv\.cache\.kernels\.masks\.write_masks$",
)
COMPILE_TIMEOUT = 1800  # seconds one compile subprocess may take

WORKER = textwrap.dedent(
    """
    import gc, json, re, sys, time
    from pathlib import Path

    from numba.cuda.compiler import _compile_pyfunc_with_fixup as lower

    import numbakv
    from numbakv.cache.cuda import MODE
    from numbakv.cache.kernels import load_all
    from benchmarks.kernel_cost.compile import threads_per_block

    assert MODE == "compile", MODE
    # lowering makes millions of short-lived objects: collections that skip the imports'
    # objects (freeze) and come less often take ~15 % off the compile, its output the same
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    patterns, shard, n_shards = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    warnings = []
    registry = load_all()
    try:
        import numbakv.device_model.kernels  # registers the device model's kernels
    except Exception as e:
        warnings.append(f"numbakv.device_model.kernels: {type(e).__name__}: {e}")
    import numbakv.cache.kernels.attention as attention
    hook = getattr(attention, "cost_specialisations", None)
    if callable(hook):
        hook()  # registers the specialisations the launcher can pick
    names = sorted(n for n in registry
                   if patterns is None or any(re.search(p, n) for p in patterns))
    jobs = [(name, i) for name in names for i in range(len(registry[name][1]))]
    records = []
    for name, i in jobs[shard::n_shards]:
        fn, signatures, options = registry[name]
        sig = signatures[i]
        module = sys.modules[fn.__module__]
        threads, source = threads_per_block(name, module)
        served = getattr(module, "served_bytes", None)  # unique K/V bytes a loop step serves
        record = {"name": name, "index": i, "signature": str(sig), "module": fn.__module__,
                  "threads": threads, "threads_source": source, "ptx_file": None,
                  "error": None, "served_bytes": served(fn.__name__, i) if served else None}
        start = time.perf_counter()
        try:  # what cuda.compile_ptx does, with line info for nvdisasm -g
            library, _ = lower(fn, sig, debug=None, lineinfo=True, device=False,
                               fastmath=False, cc=(9, 0), opt=None, abi="numba",
                               abi_info=None, forceinline=False, lto=False, **options)
            path = Path(f"{name}.{i}.sm_90.ptx").resolve()
            path.write_text(library.get_asm_str(cc=(9, 0)))
            record["ptx_file"] = str(path)
        except Exception as e:  # reported, not raised: one failure hides no other
            record["error"] = f"{type(e).__name__}: {e}"
        record["seconds"] = time.perf_counter() - start
        records.append(record)
    print(json.dumps({"records": records, "selected": len(jobs), "registry": len(registry),
                      "hook": callable(hook), "numbakv": numbakv.__file__,
                      "warnings": warnings}))
    """
)


def threads_per_block(name: str, module: ModuleType) -> tuple[int, str]:
    """(threads per block, where that came from) of registry kernel `name` defined in
    `module`: the module's optional `THREADS_PER_BLOCK` dict {registry name: threads} first;
    else `numbakv.cache.kernels.launch.ATTN_THREADS` for an attention kernel (decode or
    prefill by name, `attention_grid`), else `launch.THREADS` (`launch_dims`: the
    element-wise kernels, the merge included). Imports numbakv's launch module: call it
    where numbakv's device is chosen (the compile subprocess)."""
    override = getattr(module, "THREADS_PER_BLOCK", None) or {}
    if name in override:
        return int(override[name]), f"{module.__name__}.THREADS_PER_BLOCK"
    own = getattr(module, "THREADS", None)  # a kernel module's own block size
    if isinstance(own, int) and kernel_kind(name) in ("decode", "prefill"):
        return own, f"{module.__name__}.THREADS"
    from numbakv.cache.kernels import launch

    if name.startswith(ATTENTION + ".") and kernel_kind(name) in ("decode", "prefill"):
        return launch.ATTN_THREADS, "launch.ATTN_THREADS"
    return launch.THREADS, "launch.THREADS"


def kernel_kind(name: str) -> str:
    """ "decode" or "prefill" when the kernel's own name (after the last dot) says so, else
    "other": decode is costed per byte loaded, prefill per FLOP."""
    short = name.rsplit(".", 1)[-1]
    if "_decode" in short:
        return "decode"
    if "_prefill" in short:
        return "prefill"
    return "other"


_DTYPE = re.compile(r"\b(float|uint|int)(\d+)\[")
_SHORT = {"float": "f", "uint": "u", "int": "i"}
# the arguments that are pools (array positions in the signature), by the kernel's name
POOL_ARRAYS = {"attend_": (1, 3), "scatter_kv": (2, 4)}


def array_dtypes(signature: str) -> list[str]:
    """The dtypes of the array arguments of a numba signature string, in order, short:
    "f32", "f16", "u16", "u8", "i32"."""
    return [f"{_SHORT[kind]}{bits}" for kind, bits in _DTYPE.findall(signature)]


def pool_dtypes(name: str, signature: str) -> str:
    """The K/V pools' dtypes of an attention kernel's signature ("f16/f16") or a scatter's,
    after the dtype of the K it stores ("f32->f16/f16"); for the others every distinct array
    dtype in order: "i32,u64"."""
    dtypes = array_dtypes(signature)
    short = name.rsplit(".", 1)[-1]
    for prefix, (lo, hi) in POOL_ARRAYS.items():
        if short.startswith(prefix) and len(dtypes) >= hi:
            pools = "/".join(dtypes[lo:hi])
            return f"{dtypes[0]}->{pools}" if prefix == "scatter_kv" else pools
    return ",".join(dict.fromkeys(dtypes)) or "-"


@dataclass(frozen=True)
class CompiledKernel:
    """One signature of one registry kernel, lowered (or not) to a PTX file."""

    name: str  # registry name
    index: int  # which of its signatures
    signature: str
    module: str
    threads: int  # per block, at launch (`threads_per_block`)
    threads_source: str
    ptx_file: Path | None  # None when lowering failed
    error: str | None
    seconds: float  # lowering and PTX
    # the distinct K/V bytes one step of the hot loop serves, where the kernel's module says
    # (`served_bytes(kernel name, signature index)`): lanes that load the same row are not
    # counted twice; None: the loop's global-load bytes are the measure
    served_bytes: int | None = None

    @property
    def kind(self) -> str:
        """ "decode", "prefill" or "other" (`kernel_kind`)."""
        return kernel_kind(self.name)

    @property
    def pools(self) -> str:
        """The pools' dtypes (`pool_dtypes`)."""
        return pool_dtypes(self.name, self.signature)


@dataclass(frozen=True)
class Compiled:
    """What the compile subprocesses did."""

    kernels: list[CompiledKernel]  # by name, then signature
    selected: int  # signatures the patterns selected
    registry: int  # kernels in the REGISTRY (after the hook)
    hook: bool  # whether `cost_specialisations()` was there and called
    numbakv_file: str  # numbakv/__init__.py the subprocesses imported
    warnings: list[str]


def repo_roots() -> list[str]:
    """The folders numbakv and benchmarks are imported from here, numbakv's first (a
    checkout's benchmarks beside an installed numbakv must not bring the checkout's)."""
    import benchmarks
    import numbakv

    roots = [Path(m.__file__).resolve().parents[1] for m in (numbakv, benchmarks)]
    return [str(r) for r in dict.fromkeys(roots)]


def compile_kernels(
    patterns: Sequence[str] | None = DEFAULT_PATTERNS, folder: Path | None = None, jobs: int = 2
) -> Compiled:
    """Lowers every signature of every REGISTRY kernel whose name matches one of `patterns`
    (regular expressions, re.search; None: every kernel) to sm_90 PTX with line info, in
    min(2, jobs) subprocesses; the PTX files go to `folder` (default: the current one).
    Raises RuntimeError when a subprocess fails, or imports another numbakv than this one."""
    import numbakv

    folder = Path(folder or ".").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    roots = repo_roots()
    env = dict(os.environ, NUMBAKV_DEVICE="compile", NUMBA_ENABLE_CUDASIM="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, env.get("PYTHONPATH")]))
    n_shards = max(1, min(2, jobs, os.cpu_count() or 1))
    spec = json.dumps(None if patterns is None else list(patterns))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, spec, str(shard), str(n_shards)],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for shard in range(n_shards)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=COMPILE_TIMEOUT)
        if proc.returncode:
            raise RuntimeError(f"compile subprocess failed:\n{err[-4000:]}")
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    here = str(Path(numbakv.__file__).resolve())
    there = str(Path(outputs[0]["numbakv"]).resolve())
    if there != here:
        raise RuntimeError(f"the compile subprocess imported {there}, not {here}")
    kernels = [
        CompiledKernel(
            name=r["name"],
            index=r["index"],
            signature=r["signature"],
            module=r["module"],
            threads=r["threads"],
            threads_source=r["threads_source"],
            ptx_file=Path(r["ptx_file"]) if r["ptx_file"] else None,
            error=r["error"],
            seconds=r["seconds"],
            served_bytes=r.get("served_bytes"),
        )
        for out in outputs
        for r in out["records"]
    ]
    kernels.sort(key=lambda k: (k.name, k.index))
    return Compiled(kernels, outputs[0]["selected"], outputs[0]["registry"],
                    outputs[0]["hook"], there, outputs[0]["warnings"])  # fmt: skip
