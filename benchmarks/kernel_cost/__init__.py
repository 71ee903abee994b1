"""What numbakv's kernels cost on an H200, read from their machine code without a GPU.

    python -m benchmarks.kernel_cost                    # attention, scatter, prepare, merge, masks
    python -m benchmarks.kernel_cost --match write_masks --json cost.json
    python -m benchmarks.kernel_cost --all --jobs 2

Every signature of every selected REGISTRY kernel is lowered to sm_90 PTX with line info in
compile-only subprocesses (`compile`), assembled by ptxas (`-arch=sm_90 -v -lineinfo`:
registers, static shared bytes, spills) and disassembled by `nvdisasm -c -g` (`tools`); the
SASS is read into loops (backward branches) and counts (`sass`). Printed per kernel, one row
per signature (its pools' dtypes):

- resources: registers per thread, static shared bytes per block, spill bytes, resident
  warps (and blocks) per SM at the block size it launches with and what limits them
  (`machine.occupancy`), the kernel's instructions, global loads inside loops by width
  ("128x4 U16x2": four 16-byte and two 2-byte LDG), 64-bit integer divisions in loops;
- the hot loop (`sass.hottest`: the loop holding the most global-load bytes, or for
  prefill the most FLOP): its instructions (warp-instructions per iteration, nested loops
  counted once: "inner" says whether it has any), loads by width, FFMA ... STS counts, and
  its cost: warp-instructions per K/V byte (decode and the rest: instructions / (sum of load
  widths x 32 lanes)) or FLOP per warp-instruction (prefill), with the ceiling that implies
  at 1.0e12 warp-instructions/s, in TB/s or TFLOP/s and as % of the H200's 4.8 TB/s or
  67 TFLOP/s (`machine`).

The figures are static counts for a pinned toolchain (numba-cuda 0.30, NVVM and ptxas
12.9, nvdisasm 13.x): deterministic, so tests/cache/test_kernel_cost.py holds budgets on
them. `--json PATH` writes every figure (and every loop) as JSON. The analysis is
importable: `sass.analyse(text) -> KernelCost`, `compile.compile_kernels(patterns)`,
`report.measure(kernels)`, `report.figures(measured)`.
"""
