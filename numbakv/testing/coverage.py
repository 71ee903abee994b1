"""`Coverage`: what a `check_cache` run exercised — the hazards, the verbs, the refusals of
docs/contract.md §6.1 reached (`refusals.REFUSALS`), each window's edge, the longest
sequence, the pool's growths, the reads of stale steps — so that a user sees what their
configs left untouched. `check_cache(..., report=True)` returns it; `str()` is the report.
NumPy only.
"""

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from numbakv.core.config import CacheConfig
from numbakv.testing.op import Op
from numbakv.testing.refusals import REFUSALS, TABLE_ONLY
from numbakv.testing.workloads import OPTIONAL_KINDS

EDGES = ("inside", "at W", "one past W", "far past W")  # a token's history p + 1 against W


@dataclass
class Coverage:
    """What a run exercised, summed over its hazard scripts and workloads.

    compare     : the run's compare ("semantic" runs reach no refusal of a layout field)
    hazards     : Counter, scripts run per hazard name (`hazards.HAZARDS`)
    verbs       : Counter, ops run per verb
    refusals    : Counter, refusals reached per name (`refusals.REFUSALS`)
    unexplained : list of str, refusals (or acceptances) of the reference that the kit's
                  `Protocol` did not foresee: empty unless the kit and the contract part
    windows     : {window: set of `EDGES`} a step's token reached: its history p + 1 inside
                  the window, equal to it, one past, further
    longest     : the most positions a sequence held
    growths     : the reference pool's growths, summed over runs
    stale_reads : Counter, reads of a stale step's field per field
    etiquette   : Counter, ops per rule of numbakv's etiquette (`etiquette.ETIQUETTE`) the
                  cache did not follow, which the run admitted (strict=False); `first`:
                  {rule: the first such op, with its config}
    workloads   : random workloads run; ops: ops run in all; seconds: the run's time
    """

    compare: str = "semantic"
    hazards: Counter = field(default_factory=Counter)
    verbs: Counter = field(default_factory=Counter)
    refusals: Counter = field(default_factory=Counter)
    unexplained: list = field(default_factory=list)
    windows: dict = field(default_factory=dict)
    longest: int = 0
    growths: int = 0
    stale_reads: Counter = field(default_factory=Counter)
    etiquette: Counter = field(default_factory=Counter)
    first: dict = field(default_factory=dict)
    workloads: int = 0
    ops: int = 0
    seconds: float = 0.0

    def watch(self, config: CacheConfig) -> "Watch":
        """An observer of one run (`Runner(watch=...)`) that counts into this coverage."""
        for window in set(config.windows) - {0}:
            self.windows.setdefault(window, set())
        return Watch(self, config)

    @property
    def reachable(self) -> list[str]:
        """The refusals of `REFUSALS` a run of this compare can reach: an optional kind's
        ("reload: ...") only when the run drew that kind."""
        return [
            name for name in REFUSALS
            if (self.compare == "table" or name not in TABLE_ONLY)
            and (name.split(":")[0] not in OPTIONAL_KINDS or self.verbs[name.split(":")[0]])
        ]  # fmt: skip

    @property
    def unreached(self) -> list[str]:
        """The reachable refusals no op reached."""
        return [name for name in self.reachable if not self.refusals[name]]

    def __str__(self) -> str:
        hazards = ", ".join(f"{name} {n}" for name, n in self.hazards.items()) or "none"
        reached = {w: ", ".join(e for e in EDGES if e in edges) or "none"
                   for w, edges in sorted(self.windows.items())}  # fmt: skip
        windows = "; ".join(f"W={w}: {edges}" for w, edges in reached.items()) or "none"
        stale = ", ".join(f"{f} {n}" for f, n in self.stale_reads.items()) or "none"
        lines = [
            f"{self.ops} ops in {self.seconds:.1f} s: {sum(self.hazards.values())} hazard "
            f"scripts, {self.workloads} random workloads",
            f"hazards (scripts): {hazards}",
            "verbs: " + ", ".join(f"{verb} {n}" for verb, n in self.verbs.most_common()),
            f"refusals reached: {len(self.reachable) - len(self.unreached)} of "
            f"{len(self.reachable)}"
            + (f"; never: {', '.join(self.unreached)}" if self.unreached else ""),
            f"windows: {windows}",
            f"longest sequence: {self.longest} positions; pool growths: {self.growths}",
            f"stale reads: {stale}",
        ]
        if self.etiquette:
            lines.append("etiquette not followed (strict=True fails on it; docs/contract.md §12): "
                         + "; ".join(f"{rule} {n} ops, first {self.first[rule]}"
                                     for rule, n in self.etiquette.items()))  # fmt: skip
        else:
            lines.append("etiquette not followed: none")
        if self.unexplained:
            lines.append(f"unexplained by the kit: {len(self.unexplained)}, first "
                         f"{self.unexplained[0]}")  # fmt: skip
        return "\n".join(lines)


class Watch:
    """Counts one run into a `Coverage`: called by the `Runner` after each op (and at each
    etiquette rule broken), it checks that the reference refused as the runner foretold
    (`Protocol.faults`)."""

    def __init__(self, coverage: Coverage, config: CacheConfig):
        self.coverage, self.config = coverage, config
        self.growths = 0

    def note(self, rule: str, op: Op) -> None:
        """The cache did not follow etiquette `rule` at `op` (admitted: not strict)."""
        self.coverage.etiquette[rule] += 1
        self.coverage.first.setdefault(rule, f"{op!r} on {self.config!r}")

    def after(self, runner, op: Op, expected, got) -> None:
        coverage, (result, error) = self.coverage, expected
        name = runner.faults[0] if runner.faults else None
        coverage.ops += 1
        coverage.verbs[op.verb] += 1
        actual = None if error is None else type(error).__name__
        if (name and REFUSALS[name][0]) != actual:
            coverage.unexplained.append(f"{op!r}: foreseen {name}, the reference {actual}")
        if error is not None:
            coverage.refusals[name] += 1 if name else 0
            if name == "read: stale step":
                coverage.stale_reads[op.args[0]] += 1
            return
        reference = runner.reference
        if op.verb in ("step", "prepare", "seq_clone", "rewind"):
            held = [reference.pos(seq) for seq in reference.live_seqs]
            coverage.longest = max(coverage.longest, *held, 0)
        if op.verb in ("step", "prepare"):
            self._windows((result[0] if op.verb == "step" else result).positions)
        coverage.growths += reference.growth_count - self.growths
        self.growths = reference.growth_count

    def _windows(self, positions: np.ndarray) -> None:
        histories = positions[positions >= 0] + 1
        for window, edges in self.coverage.windows.items():
            for past in np.unique(np.clip(histories - window, -1, 2)).tolist():
                edges.add(EDGES[past + 1])
