"""The launch budget's table: one line per measured step, the counts of its parts ("L C A
S": launches, copies, allocations, synchronizations), its streams and its verdict."""

from counting import DeviceCalls
from launch_budget_rules import Measurement, non_mask_launches


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
