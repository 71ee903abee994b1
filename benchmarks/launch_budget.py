"""What one step of the device cache asks of numba.cuda, counted in the CUDA simulator
(`counting.count_device_calls`), against issue 12's launch budget:

    declare_step + prepare_step  <= 1 copy, <= 1 launch, 0 allocations
    mask launches in the step    <= 1 when it has a masked attend or a mask() read, else 0
    each layer (write + attend)  <= 3 launches, 0 copies, 0 allocations, 0 synchronizations,
                                 with K, V and q device arrays and `out=` a device array
    mask() read on a step        0 allocations, <= 1 copy (the mask coming back)
    every launch and copy        on the step's stream, never the legacy default stream

    NUMBAKV_DEVICE=sim python benchmarks/launch_budget.py            # the table
    NUMBAKV_DEVICE=sim python benchmarks/launch_budget.py --check    # exit 1 past the budget

The budget and the steps measured are in launch_budget_rules, the cache they run on in
launch_budget_bench. Rows with host inputs (NumPy K/V/q, no `out=`) are the contrast: the
layer budget holds only for device inputs.
"""

import argparse
import sys

from counting import count_device_calls
from launch_budget_bench import build
from launch_budget_rules import CASES
from launch_budget_table import table

from numbakv.cache.cuda import IS_SIMULATOR, cuda


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when past the budget")
    parser.add_argument("--layers", type=int, default=4, help="layers (even, >= 2)")
    parser.add_argument(
        "--stream", action="store_true", help="pass an explicit cuda.stream() to prepare_step"
    )
    args = parser.parse_args(argv)
    if not IS_SIMULATOR:
        print("launch_budget counts the CUDA simulator's calls: run with NUMBAKV_DEVICE=sim")
        return 2
    bench = build(args.layers)
    made, first = bench.construction, bench.warmup
    print(
        f"cache API: prepare_step(stream=) {'yes' if bench.takes_stream else 'no'}, "
        f"attend(out=) {'yes' if bench.takes_out else 'no'}"
    )
    print(
        f"building the cache: {made['allocations']} allocations, {made['copies']} copies, "
        f"{made['launches']} launches, {made['streams']} streams made"
    )
    print(
        f"first decode attend (warm-up, not in the table): {first['allocations']} allocations "
        "(the split workspace, made once per query head count)"
    )
    stream = None
    if args.stream:
        with count_device_calls():  # so that the counters know it for a made stream
            stream = cuda.stream()
    measurements = [bench.measure(case, stream=stream) for case in CASES]
    print(
        "\nL C A S = launches (n+Mm: M of them mask launches), copies, allocations, "
        f"synchronizations\nlayer = write + attend, each of {args.layers} layers (a/b when they "
        "differ); masks = mask launches in the whole step"
    )
    print(table(measurements))
    broken = [(m, line) for m in measurements for line in m.breaches()]
    if broken:
        print("\npast the budget:")
        for m, line in broken:
            print(f"  {m.case.name}: {line}")
    return 1 if args.check and broken else 0


if __name__ == "__main__":
    sys.exit(main())
