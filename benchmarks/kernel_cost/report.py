"""One compiled kernel signature assembled, disassembled and costed (`measure`), its figures
as a flat dict (`figures`: the JSON, and what the test suite's budgets read), and the
plain-text tables (`print_report`)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import print_table
from benchmarks.kernel_cost import machine
from benchmarks.kernel_cost.compile import CompiledKernel
from benchmarks.kernel_cost.sass import LOAD_WIDTHS, KernelCost, Loop, analyse
from benchmarks.kernel_cost.tools import PtxasInfo, assemble, disassemble, find_tool

HOT_OPS = ("FFMA", "FMUL", "FADD", "HFMA2", "HMMA", "SHFL", "BAR", "MUFU", "LDS", "STS")


@dataclass
class Measured:
    """One kernel signature: what compiling, assembling and reading its SASS gave."""

    kernel: CompiledKernel
    ptxas: PtxasInfo | None = None
    cost: KernelCost | None = None
    occupancy: machine.Occupancy | None = None
    error: str | None = None  # lowering, ptxas or nvdisasm failed
    sass_file: Path | None = None  # kept only with `keep`

    @property
    def hot_loop(self) -> Loop | None:
        """The loop the kernel is costed by: most FLOP for prefill, most load bytes else."""
        if self.cost is None:
            return None
        if self.kernel.kind == "prefill":
            return self.cost.hot_flop_loop
        return self.cost.hot_load_loop


def measure_one(
    kernel: CompiledKernel, ptxas: str, nvdisasm: str, folder: Path, keep: bool = False
) -> Measured:
    """Assembles `kernel`'s PTX for sm_90 into `folder`, disassembles and analyses it, and
    works out its occupancy at its block size; failures are kept in `.error`."""
    result = Measured(kernel)
    if kernel.ptx_file is None:
        result.error = f"lowering failed: {kernel.error}"
        return result
    cubin = folder / f"{kernel.name}.{kernel.index}.sm_90.cubin"
    try:
        result.ptxas = assemble(ptxas, kernel.ptx_file, cubin)
        sass = disassemble(nvdisasm, cubin)
    except Exception as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    if keep:
        result.sass_file = cubin.with_suffix(".sass")
        result.sass_file.write_text(sass)
    result.cost = analyse(sass)
    info = result.ptxas
    result.occupancy = machine.occupancy(info.registers, info.shared_bytes, kernel.threads)
    return result


def measure(kernels: Iterable[CompiledKernel], jobs: int = 2, keep: Path | None = None
            ) -> list[Measured]:  # fmt: skip
    """`measure_one` of every kernel, `jobs` ptxas/nvdisasm at a time; cubins (and SASS) go
    to `keep`, else to a temporary folder. Raises ToolMissing without ptxas or nvdisasm."""
    ptxas, nvdisasm = find_tool("ptxas"), find_tool("nvdisasm")
    kernels = list(kernels)
    with tempfile.TemporaryDirectory(prefix="kernel_cost_") as tmp:
        folder = Path(keep) if keep else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(
                pool.map(lambda k: measure_one(k, ptxas, nvdisasm, folder, bool(keep)), kernels)
            )


def loop_figures(loop: Loop | None) -> dict | None:
    """A loop's figures (per iteration; bytes; FLOP), None for no loop."""
    if loop is None:
        return None
    cost = loop.cost
    return {
        "label": loop.label,
        "address": [loop.head_address, loop.tail_address],
        "depth": loop.depth,
        "has_inner_loops": loop.has_inner_loops,
        "instructions": cost.instructions,
        "loads": cost.loads,
        "load_bytes": cost.load_bytes,
        "flop": cost.flop,
        "div64": cost.div64,
        "ops": cost.ops,
        "own_instructions": loop.own.instructions,
        "own_load_bytes": loop.own.load_bytes,
        "own_flop": loop.own.flop,
        "lines": cost.lines,
    }


def figures(m: Measured) -> dict:
    """Every figure of one kernel signature as plain JSON values (units in the names'
    docs: bytes, warp-instructions, FLOP, bytes/s, FLOP/s). Absent figures are None."""
    k = m.kernel
    out: dict = {
        "name": k.name, "index": k.index, "signature": k.signature, "kind": k.kind,
        "pools": k.pools, "threads": k.threads, "threads_source": k.threads_source,
        "error": m.error, "compile_seconds": round(k.seconds, 3),
    }  # fmt: skip
    if m.ptxas is None or m.cost is None or m.occupancy is None:
        return out
    p, c, occ = m.ptxas, m.cost, m.occupancy
    hot = m.hot_loop
    out |= {
        "registers": p.registers,
        "shared_bytes": p.shared_bytes,
        "spill_store_bytes": p.spill_store_bytes,
        "spill_load_bytes": p.spill_load_bytes,
        "spill_bytes": p.spill_bytes,
        "stack_bytes": p.stack_bytes,
        "blocks_per_sm": occ.blocks,
        "warps_per_sm": occ.warps,
        "occupancy": occ.fraction,
        "limited_by": list(occ.limited_by),
        "instructions": c.kernel.instructions,
        "loads": c.kernel.loads,
        "loop_loads": c.in_loops.loads,
        "div64": c.kernel.div64,
        "div64_in_loops": c.in_loops.div64,
        "loops": len(c.loops),
        "subroutines": c.subroutines,
        "hot_loop": loop_figures(hot),
        "hot_loads_below_128": None,
        "hot_readonly_loads_below_128": None,  # K/V rows: ld.global.nc narrower than 128 bits
        "instructions_per_byte": None,
        "bandwidth_ceiling": None,  # bytes/s
        "bandwidth_fraction": None,  # of machine.HBM_BANDWIDTH
        "flop_per_instruction": None,
        "flop_ceiling": None,  # FLOP/s
        "flop_fraction": None,  # of machine.FP32_FMA_PEAK
        "all_loops": [loop_figures(lp) for lp in c.loops],
    }
    if hot is not None:
        out["hot_loads_below_128"] = sum(n for w, n in hot.cost.loads.items() if w != "128")
        out["hot_readonly_loads_below_128"] = sum(
            n for w, n in hot.cost.readonly_loads.items() if w != "128"
        )
        served = k.served_bytes or hot.cost.load_bytes
        out["served_bytes"] = served
        if k.kind != "prefill" and served:
            per_byte = hot.cost.instructions / served
            out["instructions_per_byte"] = per_byte
            out["bandwidth_ceiling"] = machine.bandwidth_ceiling(per_byte)
            out["bandwidth_fraction"] = out["bandwidth_ceiling"] / machine.HBM_BANDWIDTH
        if k.kind == "prefill" and hot.cost.flop:
            per_instr = hot.cost.flop / hot.cost.instructions
            out["flop_per_instruction"] = per_instr
            out["flop_ceiling"] = machine.flop_ceiling(per_instr)
            out["flop_fraction"] = out["flop_ceiling"] / machine.FP32_FMA_PEAK
    return out


def loads_label(loads: dict[str, int]) -> str:
    """Loads by width, widest first: "128x4 U16x2"; "-" for none."""
    order = list(LOAD_WIDTHS)[::-1]
    parts = [f"{w}x{loads[w]}" for w in order if loads.get(w)]
    return " ".join(parts) or "-"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def resource_row(f: dict) -> list[str]:
    """pools, regs, shared, spills, occupancy, loop loads and divisions of one signature."""
    if "registers" not in f:
        return [f["pools"], "error", *["-"] * 7]
    return [
        f["pools"], str(f["registers"]), str(f["shared_bytes"]), str(f["spill_bytes"]),
        f"{f['warps_per_sm']} ({f['blocks_per_sm']} blk)", "/".join(f["limited_by"]),
        str(f["instructions"]), loads_label(f["loop_loads"]), str(f["div64_in_loops"]),
    ]  # fmt: skip


def hot_row(f: dict) -> list[str]:
    """The hot loop of one signature: body, loads, counted ops and the cost it implies."""
    hot = f.get("hot_loop")
    if hot is None:
        return [f["pools"], "-", "-", "-", *["-"] * len(HOT_OPS), "-", "-", "-"]
    if f["kind"] == "prefill":
        cost, ceiling = _num(f["flop_per_instruction"]), f["flop_ceiling"]
        ceiling_label = "-" if ceiling is None else f"{ceiling / 1e12:.2f} TF/s"
        pct = f["flop_fraction"]
    else:
        cost, ceiling = _num(f["instructions_per_byte"], 3), f["bandwidth_ceiling"]
        ceiling_label = "-" if ceiling is None else f"{ceiling / 1e12:.2f} TB/s"
        pct = f["bandwidth_fraction"]
    return [
        f["pools"], str(hot["instructions"]), "yes" if hot["has_inner_loops"] else "no",
        loads_label(hot["loads"]), *(str(hot["ops"][op]) for op in HOT_OPS), cost,
        ceiling_label, "-" if pct is None else f"{100 * pct:.1f}",
    ]  # fmt: skip


RESOURCE_HEADERS = ["pools", "regs", "smem B", "spill B", "warps/SM", "limit", "instrs",
                    "loads in loops", "div64 in loops"]  # fmt: skip


def hot_headers(kind: str) -> list[str]:
    """Headers of the hot-loop table of a kernel of `kind`."""
    if kind == "prefill":
        cost = ["FLOP/instr", "ceiling", f"% {machine.FP32_FMA_PEAK / 1e12:.0f} TF"]
    else:
        cost = ["instr/B", "ceiling", f"% {machine.HBM_BANDWIDTH / 1e12:.1f} TB/s"]
    return ["pools", "hot instrs", "inner", "hot loads", *HOT_OPS, *cost]


def print_report(rows: list[dict]) -> None:
    """Per kernel: a resources table and a hot-loop table, one row per signature."""
    by_name: dict[str, list[dict]] = {}
    for f in rows:
        by_name.setdefault(f["name"], []).append(f)
    for name, group in by_name.items():
        first = group[0]
        print(f"\n{name}  [{first['kind']}, {first['threads']} threads per block "
              f"({first['threads_source']})]")  # fmt: skip
        print_table(RESOURCE_HEADERS, [resource_row(f) for f in group])
        print()
        print_table(hot_headers(first["kind"]), [hot_row(f) for f in group])
        for f in group:
            if f.get("error"):
                print(f"  ! {f['pools']}: {f['error'].splitlines()[0][:300]}")
