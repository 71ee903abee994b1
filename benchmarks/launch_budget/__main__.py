"""`python -m benchmarks.launch_budget [--check] [--layers N] [--stream]`: the launch budget's
table, one line per measured step: the counts of its parts ("L C A S": launches, copies,
allocations, synchronizations), its streams and its verdict; then each breach."""

import argparse
import sys

import benchmarks.launch_budget
from benchmarks.launch_budget.bench import build
from benchmarks.launch_budget.rules import CASES, Measurement, non_mask_launches
from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.testing.launches import DeviceCalls, count_device_calls


def table(measurements: list[Measurement]) -> str:
    """One line per step: counts of prepare, of each layer ("a/b" when they differ), of
    mask() and the step's mask launches, the streams used, and whether it is in budget."""
    head = (
        f"{'step':36} {'prepare L C A S':>15}  {'layer L C A S':>15}  {'mask() L C A S':>14}"
        f"  {'masks':>5}  {'streams':>9}  budget"
    )
    lines = [head, "-" * len(head)]
    for m in measurements:
        mask_read = _counts(m.mask_read) if m.mask_read else "-"
        streams = ",".join(m.stream_name(s) for s in m.calls.streams()) or "-"
        breaches = m.breaches()
        verdict = f"{len(breaches)} over" if breaches else "ok"
        lines.append(
            f"{m.case.name:36} {_counts(m.prepare):>15}  {_layer_counts(m.layers):>15}  "
            f"{mask_read:>14}  {m.mask_launches:>5}  {streams:>9}  {verdict}"
        )
    return "\n".join(lines)


def _counts(calls: DeviceCalls) -> str:
    """The "L C A S" of `calls`, launches as "n+Mm" when M of them are mask launches."""
    copies, allocations, syncs = (calls[k] for k in ("copies", "allocations", "synchronizations"))
    return f"{_launch_count(calls)} {copies} {allocations} {syncs}"


def _layer_counts(layers: list[DeviceCalls]) -> str:
    """The "L C A S" of the layers, each their distinct values ("a/b" when they differ)."""
    columns = (
        [_launch_count(c) for c in layers],
        [c["copies"] for c in layers],
        [c["allocations"] for c in layers],
        [c["synchronizations"] for c in layers],
    )
    return " ".join("/".join(str(v) for v in sorted(set(values), key=str)) for values in columns)


def _launch_count(calls: DeviceCalls) -> str:
    plain = non_mask_launches(calls)
    masks = calls["launches"] - plain
    return f"{plain}+{masks}m" if masks else str(plain)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.launch_budget",
        description=benchmarks.launch_budget.__doc__.split("\n\n")[0],
    )
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
