"""`python -m benchmarks.gpu_check [--sim] [--skip PART]`: every part in turn, then the summary
table (see the package's docstring)."""

import argparse
import os
import sys
import time
import traceback

import benchmarks.gpu_check
from benchmarks.common import print_table
from benchmarks.gpu_check.attention import part_attention, part_copy
from benchmarks.gpu_check.commands import part_device_tests, part_launch_budget
from benchmarks.gpu_check.decode import part_decode_step
from benchmarks.gpu_check.inputs import part_inputs
from benchmarks.gpu_check.model import part_model_graphs
from benchmarks.gpu_check.run import COLUMNS, ERR_BOUND, GPU_SHAPES, LIMIT_S, SIM_SHAPES, Run
from benchmarks.gpu_check.saved import part_saved
from benchmarks.gpu_check.versions import part_versions

PARTS = {
    "versions": part_versions,
    "copy": part_copy,
    "attention": part_attention,
    "decode step": part_decode_step,
    "inputs": part_inputs,
    "saved": part_saved,
    "model graphs": part_model_graphs,
    "launch budget": part_launch_budget,
    "device tests": part_device_tests,
}


def run_part(run: Run, name: str) -> None:
    """Runs one part; an error is printed and becomes a FAIL row, and the next part runs."""
    print(f"\n== {name}", flush=True)
    started = time.perf_counter()
    try:
        PARTS[name](run)
    except Exception as error:
        traceback.print_exc(file=sys.stdout)  # in order with the rest
        run.add(name, "-", result=f"FAIL: {type(error).__name__}: {error}")
    run.seconds[name] = time.perf_counter() - started
    print(f"   {name}: {run.seconds[name]:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=benchmarks.gpu_check.__doc__.splitlines()[0],
    )
    parser.add_argument("--sim", action="store_true", help="tiny shapes on the simulator")
    parser.add_argument("--skip", action="append", default=[], choices=list(PARTS)[1:],
                        help="leave a part out (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):  # progress shows as it happens, in order
        sys.stdout.reconfigure(line_buffering=True)
    mode, asked = ("sim" if args.sim else "gpu"), os.environ.get("NUMBAKV_DEVICE")
    os.environ["NUMBAKV_DEVICE"] = mode  # before numba is imported
    run = Run(is_sim=args.sim, shapes=SIM_SHAPES if args.sim else GPU_SHAPES)
    print(f"numbakv gpu check ({'simulator, tiny shapes' if args.sim else 'GPU'})")
    if asked not in (None, mode):
        print(f"  NUMBAKV_DEVICE={asked} in the environment; this run uses {mode} (--sim picks)")
    for name in PARTS:
        if name in args.skip:
            run.add(name, "-", result="skipped: --skip")
        else:
            run_part(run, name)
    print("\n== summary")
    print_table(COLUMNS, run.rows)
    spent = ", ".join(f"{name} {s:.1f}" for name, s in run.seconds.items())
    total = time.perf_counter() - run.started
    print(f"  seconds: {spent}; total {total:.1f} (limit {LIMIT_S} on a GPU)")
    print(f"  us: median of {run.shapes.repeat} launches (attention decode), of "
          f"{run.shapes.prefill_repeat} (prefill), of {run.shapes.decode_steps} steps (decode "
          "step, model graphs); GB/s: K/V bytes the tokens see in the row's storage format "
          "(formats.head_bytes: scales included) / time (copy: read + written); of copy: that "
          "/ the copy's GB/s; TFLOP/s: 4 x head_dim x n_heads x cells each token sees, summed, "
          "/ time; model: benchmarks.kernel_cost's ceiling of the kernel the plan picked (its "
          "hot loop's warp-instructions at 1.0e12/s; a prefill kernel's FLOP/s in a decode "
          "row as bytes/s through the row's FLOP per byte); masked: the step's mask written "
          f"once before the timed launches; err: max |numbakv - solo oracle over the K/V as "
          f"stored| (<= {ERR_BOUND}); sdpa: torch's scaled_dot_product_attention on dense "
          "float16 / bfloat16 copies (q rounded to them), its rate over the same bytes or "
          "FLOP; sdpa err: max |torch - numbakv|")  # fmt: skip
    for note in run.notes:
        print(f"  {note}")
    failed = run.failed
    print(f"  result: {'FAILED: ' + ', '.join(failed) if failed else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
