"""One command for a GPU: numbakv's device checks and figures in one table, in <= 8 minutes.

    python benchmarks/gpu_check.py          # on a GPU (NUMBAKV_DEVICE=gpu)
    python benchmarks/gpu_check.py --sim    # tiny shapes on numba's CUDA simulator, seconds

It installs nothing. It prints the versions it finds first (numba, numba-cuda, torch and
CuPy may differ from the pins), and a part whose dependency is missing says so and is
skipped. One part that fails prints its error and the others still run; the exit code is 1
when any part failed. The parts, in the order they run:

    copy          a device-to-device copy of 1 GiB on one stream, CUDA events: the bandwidth
                  the attention is held to (bytes read + bytes written per second)
    attention     decode attention, one token per sequence, at batch 64 x 4k and 16 x 32k
                  cells, GQA 8 and 4 (8 KV heads, head_dim 128, float16 K/V), gathered and
                  masked: the median time of a launch (CUDA events on the step's stream),
                  the K/V bytes the tokens see / that time, and that / the copy's bandwidth;
                  torch's scaled_dot_product_attention on the same K/V where torch has CUDA;
                  every output checked against numbakv.reference's solo oracle
    decode step   one decode step through 32 layers with device inputs and no model
                  (declare_step, prepare_step, then write + attend per layer): the host's
                  wall clock until the last launch returns, CUDA events over the step, and
                  the wall clock to a synchronize
    model graphs  decode steps of a 32-layer device-resident model (`DeviceModel`) at batch
                  1, 16 and 64: µs per step (declare, prepare, stage, launches, logits
                  back) eager and replayed from one captured step (a CUDA graph), whose
                  logits must equal the eager ones bit for bit
    launch budget benchmarks/launch_budget.py --check, on the simulator, where it exists
    device tests  pytest tests/cache tests/contract with NUMBAKV_DEVICE=gpu, in the time left

--sim runs the same code with tiny shapes on the simulator, without pytest and torch; the
test suite runs it (tests/test_gpu_check.py), so that this script cannot rot. Each part is
in a gpu_check_*.py module beside this one; what they share is in gpu_check_run.
"""

import argparse
import os
import sys
import time
import traceback

from gpu_check_attention import part_attention, part_copy
from gpu_check_commands import part_device_tests, part_launch_budget
from gpu_check_decode import part_decode_step
from gpu_check_model import part_model_graphs
from gpu_check_run import COLUMNS, GPU_SHAPES, LIMIT_S, ROOT, SIM_SHAPES, TOLERANCE, Run
from gpu_check_versions import part_versions
from report import print_table

sys.path.insert(0, str(ROOT))  # this checkout's numbakv, installed or not

PARTS = {
    "versions": part_versions,
    "copy": part_copy,
    "attention": part_attention,
    "decode step": part_decode_step,
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    print(f"  us: median of {run.shapes.repeat} launches (attention), of "
          f"{run.shapes.decode_steps} steps (decode step, model graphs); GB/s: K/V bytes "
          "the tokens see / time (copy: read + written); of copy: that / the copy's GB/s; "
          "masked: the step's mask written once before the timed launches; err: max "
          f"|numbakv - solo oracle| (<= {TOLERANCE}); sdpa err: max |torch (q in float16) - "
          "numbakv|")  # fmt: skip
    failed = run.failed
    print(f"  result: {'FAILED: ' + ', '.join(failed) if failed else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
