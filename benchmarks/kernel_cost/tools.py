"""ptxas and nvdisasm: found by cuda.pathfinder (the pip wheels first), run, their output read.

ptxas comes with numba-cuda's cu12 extra (nvidia-cuda-nvcc-cu12, the release of its NVVM);
nvdisasm with nvidia-cuda-nvdisasm (the test extra). A CUDA 13 nvdisasm reads CUDA 12.9
sm_90 cubins: it warns that it switches to the "Old format" and disables its dataflow
analysis, which changes nothing of the instructions it prints.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.kernel_cost.machine import ARCH

TIMEOUT = 600  # seconds one ptxas or nvdisasm may take


class ToolMissing(RuntimeError):
    """ptxas or nvdisasm is not installed (or cuda.pathfinder cannot look for it)."""


def find_tool(name: str) -> str:
    """The path of CUDA binary utility `name` ("ptxas", "nvdisasm") that cuda.pathfinder
    finds; raises ToolMissing with the reason when there is none."""
    try:
        from cuda import pathfinder

        path = pathfinder.find_nvidia_binary_utility(name)
    except Exception as e:  # no cuda-pathfinder, or it raised
        raise ToolMissing(f"cuda.pathfinder cannot look for {name}: {type(e).__name__}: {e}") from e
    if not path:
        hint = {"ptxas": "numba-cuda[cu12]", "nvdisasm": "nvidia-cuda-nvdisasm"}.get(name, name)
        raise ToolMissing(f"no {name} found (pip install {hint}, the test extra)")
    return str(path)


def tool_version(path: str) -> str:
    """The release line of `path --version` ("Cuda compilation tools, release 12.9, ...")."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    lines = [ln for ln in out.stdout.splitlines() if "release" in ln]
    return lines[-1].strip() if lines else out.stdout.strip().splitlines()[-1:][0]


@dataclass(frozen=True)
class PtxasInfo:
    """What `ptxas -v` reports of one kernel (bytes; registers per thread)."""

    registers: int
    shared_bytes: int  # static shared memory per block
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int  # local memory stack frame per thread
    barriers: int  # named barriers used
    report: str  # the whole -v output

    @property
    def spill_bytes(self) -> int:
        """Spill stores + spill loads."""
        return self.spill_store_bytes + self.spill_load_bytes


def parse_ptxas(report: str) -> PtxasInfo:
    """Reads `ptxas -v` output of a one-kernel PTX; raises ValueError without a register
    count in it."""

    def figure(pattern: str) -> int:
        found = [int(x) for x in re.findall(pattern, report)]
        return max(found, default=0)

    registers = re.findall(r"Used (\d+) registers", report)
    if not registers:
        raise ValueError(f"no register count in ptxas output:\n{report}")
    return PtxasInfo(
        registers=int(registers[-1]),
        shared_bytes=figure(r"(\d+) bytes smem"),
        spill_store_bytes=figure(r"(\d+) bytes spill stores"),
        spill_load_bytes=figure(r"(\d+) bytes spill loads"),
        stack_bytes=figure(r"(\d+) bytes stack frame"),
        barriers=figure(r"used (\d+) barriers"),
        report=report,
    )


def assemble(ptxas: str, ptx_file: Path, cubin: Path) -> PtxasInfo:
    """`ptxas -arch=sm_90 -v -lineinfo ptx_file -o cubin`; raises RuntimeError when it fails."""
    proc = subprocess.run(
        [ptxas, f"-arch={ARCH}", "-v", "-lineinfo", str(ptx_file), "-o", str(cubin)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    if proc.returncode:
        raise RuntimeError(f"ptxas failed on {ptx_file}:\n{proc.stderr[-4000:]}")
    return parse_ptxas(proc.stdout + proc.stderr)


def disassemble(nvdisasm: str, cubin: Path) -> str:
    """`nvdisasm -c -g cubin`: the SASS of the cubin's code with source lines; raises
    RuntimeError when it fails."""
    proc = subprocess.run(
        [nvdisasm, "-c", "-g", str(cubin)], capture_output=True, text=True, timeout=TIMEOUT
    )
    if proc.returncode:
        raise RuntimeError(f"nvdisasm failed on {cubin}:\n{proc.stderr[-4000:]}")
    return proc.stdout
