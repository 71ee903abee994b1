"""benchmarks.kernel_cost's estimate beside each measured attention figure in `python -m
benchmarks.gpu_check`: the kernels the attention part saw launched (by their names, as the
REGISTRY knows them) compiled for sm_90, assembled by ptxas and read from nvdisasm's SASS in
the same run (`compile.compile_kernels`, `report.measure`, `report.figures`), each the ceiling
its hot loop implies at machine.ISSUE_RATE warp-instructions/s: bytes/s for a decode kernel,
FLOP/s for a prefill kernel.

That work runs on daemon threads (its compile subprocesses wait on the CPU while the GPU
measures), a batch per `want`, at most BATCHES at a time; `fill` waits for them at the end of
the part and writes every row's "model" cell, in the row's unit (TB/s for decode rows, TF/s
for the prefill row: a kernel costed in the other unit is converted by the row's FLOP per
K/V byte). Without ptxas or nvdisasm, or when a batch fails, the cell says "n/a" and the
run's notes say why; on the simulator it says "sim" and nothing compiles.
"""

import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gpu_check.run import Run
from numbakv.core.formats import ARRAY_DTYPES

BATCHES = 2  # compile batches at a time, each of up to 2 compile subprocesses
WAIT_S = 240  # seconds `fill` waits for the batches at most (less when the run has less left)
SHORT = {"f": "f", "u": "u", "i": "i"}  # NumPy dtype kind -> kernel_cost's short dtype


def pools_label(fmt: str) -> str:
    """kernel_cost's `pools` of a kernel signature over K and V pools of format `fmt`:
    "f16/f16", "u16/u16" (bfloat16 patterns), "u8/u8" (quantized bytes)."""
    dtype = ARRAY_DTYPES[fmt]
    one = f"{SHORT[dtype.kind]}{8 * dtype.itemsize}"
    return f"{one}/{one}"


def short_name(name: str) -> str:
    """A kernel's name without its module: "attend_gathered_decode_q8_0_d128"."""
    return name.rsplit(".", 1)[-1]


@dataclass
class _Batch:
    """One compile batch: the kernels' registry-name patterns, then their figures or why not."""

    names: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    figures: list[dict] = field(default_factory=list)
    error: str | None = None


@dataclass
class _Pending:
    """A table row waiting for the estimate of the kernel it ran."""

    row: list[str]
    name: str  # kernel name, without module
    pools: str  # kernel_cost's pools label of the signature it ran
    unit: str  # the row's: "TB/s" or "TF/s"
    flop_per_byte: float  # of the row's work: FLOP / K/V bytes the tokens see


class Estimates:
    """kernel_cost's ceilings of the kernels a run launched, computed on the side."""

    def __init__(self, run: Run):
        self.reason = "sim" if run.is_sim else _tools_missing()
        self._batches: dict[str, _Batch] = {}  # kernel name -> the batch that costs it
        self._slots = threading.Semaphore(BATCHES)
        self._pending: list[_Pending] = []
        if self.reason not in (None, "sim"):
            print(f"  model: n/a, {self.reason}")

    def want(self, names: list[str]) -> None:
        """Starts costing the kernels `names` (without module) not asked for yet."""
        new = [n for n in dict.fromkeys(names) if n not in self._batches]
        if self.reason is not None or not new:
            return
        batch = _Batch(new)
        for name in new:
            self._batches[name] = batch
        threading.Thread(target=self._cost, args=(batch,), daemon=True).start()

    def attach(self, row: list[str], name: str, fmt: str, unit: str, flop_per_byte: float
               ) -> None:  # fmt: skip
        """Gives `row` the estimate of kernel `name` over pools of `fmt` when `fill` runs
        (now, "sim" on the simulator). unit: the row's, "TB/s" or "TF/s"."""
        if self.reason == "sim":
            Run.set_cell(row, "model", "sim")
            return
        self._pending.append(_Pending(row, name, pools_label(fmt), unit, flop_per_byte))
        Run.set_cell(row, "model", "pending")

    def fill(self, run: Run) -> None:
        """Waits for the batches (at most WAIT_S s, less when the run has less left) and
        writes every attached row's "model" cell; what could not be had is "n/a", why in
        the run's notes."""
        if not self._pending:
            return
        deadline = time.perf_counter() + max(10.0, min(WAIT_S, run.time_left() - 120))
        waiting = {id(b): b for b in self._batches.values() if not b.done.is_set()}
        if waiting and self.reason is None:
            print(f"  model: waiting for kernel_cost ({len(waiting)} batch(es))", flush=True)
        reasons = []
        for p in self._pending:
            value, why = self._estimate(p, deadline)
            Run.set_cell(p.row, "model", value)
            if why and why not in reasons:
                reasons.append(why)
        self._pending = []
        run.notes.extend(f"model n/a: {why}" for why in reasons)

    def _estimate(self, p: _Pending, deadline: float) -> tuple[str, str | None]:
        """(the cell, why it is n/a or None) of one row."""
        if self.reason is not None:
            return "n/a", self.reason
        batch = self._batches.get(p.name)
        if batch is None:
            return "n/a", f"{p.name} was never asked for"
        if not batch.done.wait(max(0.0, deadline - time.perf_counter())):
            return "n/a", f"kernel_cost not done within the wait ({', '.join(batch.names)})"
        if batch.error:
            return "n/a", batch.error
        found = [f for f in batch.figures
                 if short_name(f["name"]) == p.name and f["pools"] == p.pools]  # fmt: skip
        if not found:
            return "n/a", f"kernel_cost has no {p.name} over {p.pools} pools"
        figure = found[0]
        if figure.get("error"):
            return "n/a", f"{p.name} ({p.pools}): {figure['error'].splitlines()[0][:200]}"
        return model_cell(figure, p.unit, p.flop_per_byte)

    def _cost(self, batch: _Batch) -> None:
        """Compiles, assembles and reads the batch's kernels; any failure kept as its error."""
        from benchmarks.kernel_cost.compile import compile_kernels
        from benchmarks.kernel_cost.report import figures, measure

        patterns = [rf"\.{re.escape(name)}$" for name in batch.names]
        with self._slots:
            try:
                with tempfile.TemporaryDirectory(prefix="gpu_check_cost_") as folder:
                    compiled = compile_kernels(patterns, Path(folder), jobs=2)
                    batch.figures = [figures(m) for m in measure(compiled.kernels, jobs=4)]
            except Exception as error:  # the estimate is beside the figures, never in their way
                batch.error = f"kernel_cost failed: {type(error).__name__}: {error}"[:300]
            finally:
                batch.done.set()


def model_cell(figure: dict, unit: str, flop_per_byte: float) -> tuple[str, str | None]:
    """(the "model" cell in `unit`, why it is n/a or None) from kernel_cost's figures of one
    kernel signature: its bandwidth ceiling (decode kernels, bytes/s) or FLOP ceiling
    (prefill kernels, FLOP/s), the other unit through the row's FLOP per K/V byte."""
    bandwidth, flop = figure.get("bandwidth_ceiling"), figure.get("flop_ceiling")
    if bandwidth is None and flop is None:
        return "n/a", f"{short_name(figure['name'])}: no hot loop with loads or multiply-adds"
    if bandwidth is not None:
        rate = bandwidth if unit == "TB/s" else bandwidth * flop_per_byte
        own = f"{bandwidth / 1e12:.2f} TB/s"
    else:
        rate = flop if unit == "TF/s" else flop / flop_per_byte
        own = f"{flop / 1e12:.2f} TF/s"
    cell = f"{rate / 1e12:.2f} {unit}"
    return (cell if own == cell else f"{cell} (kernel: {own})"), None


def _tools_missing() -> str | None:
    """Why kernel_cost cannot run here (ptxas or nvdisasm missing), or None."""
    from benchmarks.kernel_cost.tools import ToolMissing, find_tool

    try:
        find_tool("ptxas")
        find_tool("nvdisasm")
    except ToolMissing as error:
        return str(error)
    return None


def attention_flop(n_heads: int, head_dim: int, visible_cells: int) -> int:
    """FLOP of attention over `visible_cells` (summed over tokens and KV heads' groups): 4 x
    head_dim x n_heads per visible cell, 2 for q·k and 2 for p·v per multiply-add."""
    return 4 * head_dim * n_heads * visible_cells
