"""What the parts of `python -m benchmarks.gpu_check` share: the sizes of a run (a GPU's or
the simulator's), the device and its timers, the clock, and the rows of the summary table."""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.common import timed
from numbakv.core.config import TOLERANCE

ROOT = Path(__file__).resolve().parents[2]  # the checkout
LIMIT_S = 480  # the whole run on a GPU
LONG_CASE_S = 300  # an attention case after the first runs only with this much of LIMIT_S left
# largest |numbakv - solo oracle| accepted in an attention output: numbakv's kernels compute
# in float32 from the stored values whatever the storage dtype
ERR_BOUND = TOLERANCE["float32"]
# columns of the summary table; "model" is benchmarks.kernel_cost's ceiling of the kernel
# that ran (attention), "sdpa rate" torch's GB/s or TFLOP/s on the same data
COLUMNS = ["part", "case", "us", "GB/s", "of copy", "TFLOP/s", "model", "sdpa us", "sdpa rate",
           "sdpa err", "err", "result"]  # fmt: skip
# every storage format, by the order the attention part measures them in
DECODE_FORMATS = ("float16", "bfloat16", "float32", "q8_0", "q4_0", "fp8_e4m3")


@dataclass(frozen=True)
class Shapes:
    """The sizes of a run: a GPU's, or the simulator's tiny ones."""

    # decode attention: (batch, cells each token sees, storage formats); cases after the
    # first run only while LONG_CASE_S seconds of LIMIT_S are left
    cases: tuple[tuple[int, int, tuple[str, ...]], ...]
    masked_formats: tuple[str, ...]  # formats also measured in masked mode (else gathered)
    n_kv_heads: int
    head_dim: int
    groups: tuple[int, ...]  # GQA: query heads per KV head
    chunk: int  # max_width: prefill steps of up to this many tokens
    piece: int  # tokens of one sequence per prefill step, sequences in turn
    repeat: int  # timed launches per attention case
    prefill: tuple[int, int, int]  # sequences, new tokens each (one step), GQA group
    prefill_repeat: int  # timed launches of the prefill step
    copy_bytes: int
    decode_layers: int
    decode_batch: int
    decode_history: int  # positions each sequence holds before the timed steps
    decode_heads: tuple[int, int, int]  # n_kv_heads, n_heads, head_dim
    decode_warmup: int
    decode_steps: int
    model_layers: int  # the device model's decode steps, eager and replayed
    model_dims: tuple[int, int, int, int, int]  # d_model, n_heads, n_kv_heads, head_dim, d_ff
    model_batches: tuple[int, ...]
    model_history: int


GPU_SHAPES = Shapes(
    cases=((64, 4096, DECODE_FORMATS), (16, 32768, ("float16",))), masked_formats=("float16",),
    n_kv_heads=8, head_dim=128, groups=(8, 4), chunk=4096, piece=512, repeat=20,
    prefill=(8, 2048, 4), prefill_repeat=5, copy_bytes=1 << 30, decode_layers=32, decode_batch=64,
    decode_history=256, decode_heads=(8, 32, 64), decode_warmup=5, decode_steps=50,
    model_layers=32, model_dims=(512, 8, 2, 64, 1408), model_batches=(1, 16, 64),
    model_history=32,
)  # fmt: skip
SIM_SHAPES = Shapes(  # head_dim 32: q8_0 and q4_0 take multiples of 32
    cases=((2, 32, DECODE_FORMATS),), masked_formats=("float16",), n_kv_heads=2, head_dim=32,
    groups=(4, 2), chunk=32, piece=8, repeat=1, prefill=(2, 16, 4), prefill_repeat=1,
    copy_bytes=1 << 16, decode_layers=2, decode_batch=2, decode_history=8,
    decode_heads=(2, 4, 16), decode_warmup=1, decode_steps=3, model_layers=2,
    model_dims=(16, 4, 2, 4, 32), model_batches=(1, 2), model_history=3,
)  # fmt: skip


class Device:
    """numba.cuda as numbakv chose it (NUMBAKV_DEVICE, set before numba is imported)."""

    def __init__(self) -> None:
        from numbakv import CellCache
        from numbakv.cache.cuda import IS_SIMULATOR, cuda

        self.cuda, self.is_simulator, self.CellCache = cuda, IS_SIMULATOR, CellCache

    def time_each(self, run: Callable[[], object], stream: object, repeat: int) -> float:
        """Median seconds of one `run()` over `repeat` runs queued back to back on `stream`,
        a CUDA event before and after each. The simulator's events time nothing (-1), so
        there: the wall clock around each run, synchronized."""
        if self.is_simulator:

            def synchronized():
                run()
                stream.synchronize()

            stream.synchronize()
            return float(statistics.median(timed(synchronized, repeat)))
        stream.synchronize()
        events = [(self.cuda.event(), self.cuda.event()) for _ in range(repeat)]
        for start, end in events:
            start.record(stream)
            run()
            end.record(stream)
        events[-1][1].synchronize()
        return float(np.median([start.elapsed_time(end) / 1e3 for start, end in events]))

    def elapsed(self, start: object, end: object, wall: float) -> float:
        """Seconds between two recorded events; `wall` in the simulator."""
        return wall if self.is_simulator else start.elapsed_time(end) / 1e3


@dataclass
class Run:
    """What the parts share: the sizes, the device, the clock, and the table's rows."""

    is_sim: bool
    shapes: Shapes
    started: float = field(default_factory=time.perf_counter)
    rows: list[list[str]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    copy_bandwidth: float | None = None  # bytes per second, from the copy part
    torch: object = "torch: not looked for"  # the module when it has CUDA, else why not
    notes: list[str] = field(default_factory=list)  # printed under the summary table
    _device: Device | None = None

    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = Device()
        return self._device

    def time_left(self) -> float:
        """Seconds left of LIMIT_S."""
        return LIMIT_S - (time.perf_counter() - self.started)

    def add(self, part: str, case: str, result: str = "ok", **cells: str) -> list[str]:
        """One row of the table, returned (`set_cell` fills it in later); cells not given
        print as '-'."""
        values = {"part": part, "case": case, "result": result, **cells}
        row = [_cell(values.get(column, "-")) for column in COLUMNS]
        self.rows.append(row)
        return row

    @staticmethod
    def set_cell(row: list[str], column: str, value: str) -> None:
        """Sets one cell of a row `add` returned."""
        row[COLUMNS.index(column)] = _cell(value)

    @property
    def failed(self) -> list[str]:
        """The parts with a failed row."""
        return sorted({row[0] for row in self.rows if row[-1].startswith("FAIL")})


def _cell(value) -> str:
    """A table cell: one line, single spaces (the table's columns are split at two)."""
    return " ".join(str(value).split())[:90] or "-"
