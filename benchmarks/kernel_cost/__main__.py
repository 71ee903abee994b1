"""`python -m benchmarks.kernel_cost [--match RE]... [--all] [--json PATH] [--jobs N]
[--keep DIR]`: the kernels' machine-code cost table (the package's docstring)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import print_machine
from benchmarks.kernel_cost import machine
from benchmarks.kernel_cost.compile import DEFAULT_PATTERNS, compile_kernels
from benchmarks.kernel_cost.report import figures, measure, print_report
from benchmarks.kernel_cost.tools import ToolMissing, find_tool, tool_version


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.kernel_cost",
        description="Registers, occupancy and hot-loop cost of numbakv's kernels on sm_90, "
        "read from ptxas and nvdisasm without a GPU.",
    )
    parser.add_argument("--match", action="append", metavar="RE",
                        help="kernels whose registry name matches (re.search; a substring "
                             "works), over the whole registry; repeatable")  # fmt: skip
    parser.add_argument("--all", action="store_true", help="every registered kernel")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every figure here")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="ptxas/nvdisasm run in parallel (compiling: up to 2 processes)",
    )
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep the PTX, cubins and SASS in DIR")  # fmt: skip
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; 1 when a kernel failed to lower, assemble or disassemble, 2
    without ptxas or nvdisasm."""
    args = parse_args(argv)
    patterns = None if args.all and not args.match else (args.match or list(DEFAULT_PATTERNS))
    try:
        ptxas, nvdisasm = find_tool("ptxas"), find_tool("nvdisasm")
    except ToolMissing as e:
        print(f"kernel_cost: {e}", file=sys.stderr)
        return 2
    print("kernel_cost: static cost of numbakv's kernels on sm_90 (H200), from ptxas + nvdisasm")
    print_machine("numba", "numba-cuda")
    print(f"  ptxas    {tool_version(ptxas)}")
    print(f"  nvdisasm {tool_version(nvdisasm)}")
    print(f"  model    {machine.ISSUE_RATE:.1e} warp-instr/s, {machine.HBM_BANDWIDTH / 1e12} TB/s, "
          f"{machine.FP32_FMA_PEAK / 1e12:.0f} TFLOP/s FP32 FMA, {machine.N_SMS} SMs")  # fmt: skip
    print(f"  kernels  {'all' if patterns is None else ' | '.join(patterns)}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kernel_cost_ptx_") as tmp:
        folder = args.keep or Path(tmp)
        compiled = compile_kernels(patterns, folder, jobs=args.jobs)
        lowered = time.perf_counter()
        measured = measure(compiled.kernels, jobs=args.jobs, keep=args.keep)
    done = time.perf_counter()
    hook = "called" if compiled.hook else "absent"
    print(f"  numbakv  {compiled.numbakv_file} (attention.cost_specialisations: {hook})")
    print(f"  compiled {len(compiled.kernels)} signatures of {compiled.registry} registered "
          f"kernels in {lowered - start:.1f} s; ptxas + nvdisasm + analysis "
          f"{done - lowered:.1f} s")  # fmt: skip
    for warning in compiled.warnings:
        print(f"  warning  {warning}")
    rows = [figures(m) for m in measured]
    print_report(rows)
    if args.json:
        model = {name: getattr(machine, name) for name in (
            "ARCH", "ISSUE_RATE", "HBM_BANDWIDTH", "FP32_FMA_PEAK", "N_SMS")}  # fmt: skip
        payload = {"machine": model, "ptxas": tool_version(ptxas),
                   "nvdisasm": tool_version(nvdisasm), "kernels": rows}  # fmt: skip
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"\nwrote {args.json}")
    failed = [f for f in rows if f["error"]]
    if failed:
        print(f"\n{len(failed)} signature(s) failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
