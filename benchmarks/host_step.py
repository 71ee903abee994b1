"""What does a decode step cost the host? Prints figures; asserts nothing.

    python benchmarks/host_step.py            # full run (about half a minute on 2 cores)
    python benchmarks/host_step.py --quick    # a few seconds

The host side of a 256-token decode step (one token per sequence over 256 sequences) is
`declare_step`'s check of the ids (`check_declaration`) and `prepare_step`'s placement on
the host table. For each capacity and fill (one 4 Ki-token sequence, then 256 sequences
decoded to `history` tokens each), median host time over `--repeat` repeats of:

    array    check_declaration of the ids as an int32 array, then `HostTable.place`
             (one njit call) into views of a preallocated [4, max_width] int32 buffer, as
             prepare_step writes its pinned step buffer
    list     the same with the ids as a list of Python ints
    before   the path this replaced: check_live of each id (what check_declaration did),
             then find_cells and claim (four njit calls)

and, apart, the check alone (array, list) and `place` alone. Every repeat starts from the
same state: after each timed call the step's tokens are rewound, untimed (lowest-free
placement puts them back in the same cells). The figures take turns in five rounds; the
garbage collector is off while timing. Timings on a shared VM drift by 2x over seconds:
compare figures of one run, not of two.

The seed design's C++ cell table (`../shared/seeds/001_…`) took 2.9 µs for such a step at
6.6 K cells used and 129 µs at 524 K used (its cost grows with the cells used; this table's
does not); the last column is this table's time over the seed's.
"""

import argparse
import gc
import statistics
import sys
import time

import numpy as np
from host_table import config  # the same cache shape: 260 ids, 256-token steps
from report import cells_label, print_machine

from numbakv.cache.table import HostTable
from numbakv.checks import check_declaration
from numbakv.errors import CapacityError

KI = 1024
MI = 1024 * KI
N_SEQS = 256
LONG = 4 * KI
MAX_WIDTH = 256
# (capacity, tokens per decoding sequence): 4 Ki + 256 * history cells used
CASES = ((16 * KI, 10), (MI, 10), (MI, 2032))  # 6656 and 524288 cells used
SEED_US = {6656: 2.9, 524288: 129.0}  # the seed's C++ table, by cells used


class Bench:
    """A host table at one fill, the step's ids and the step buffer the paths write."""

    def __init__(self, capacity: int, history: int):
        self.config = config(capacity)
        self.table = HostTable(self.config)
        self.buffer = np.zeros((4, MAX_WIDTH), dtype=np.int32)  # the step buffer's rows
        long = self.table.seq_new()
        for _ in range(LONG // MAX_WIDTH):
            self.place(np.full(MAX_WIDTH, long, dtype=np.int32))
        self.ids = np.array([self.table.seq_new() for _ in range(N_SEQS)], dtype=np.int32)
        for _ in range(history):
            self.place(self.ids)
        self.id_list = self.ids.tolist()

    def place(self, seq_ids: np.ndarray) -> None:
        self.table.place(seq_ids, self.buffer)

    def checked_place(self, seq_ids) -> None:
        """declare_step's check, then prepare_step's placement."""
        self.place(check_declaration(self.table, self.config, seq_ids))

    def before(self) -> None:
        """The path place replaced: each id checked alone, then find_cells and claim."""
        table = self.table
        seq_ids = [table.check_live(seq) for seq in self.ids]
        if table.free_cells < len(seq_ids):
            raise CapacityError("the benchmark ran out of cells")
        seq_ids = np.asarray(seq_ids, dtype=np.int32)
        table.claim(table.find_cells(len(seq_ids)), seq_ids)

    def rewind(self) -> None:
        """Undoes a step: each sequence back by its one token."""
        for seq in self.id_list:
            self.table.rewind(seq, self.table.length(seq) - 1)

    def measure(self, repeat: int, rounds: int = 5) -> dict[str, float]:
        """Median microseconds of each figure over `repeat` runs, taken in `rounds` turns
        (so that a machine whose speed drifts, a shared VM, slows every figure alike)."""
        table, cfg = self.table, self.config
        rewind, keep = self.rewind, lambda: None
        runs = {  # name: (the timed call, the untimed undo after it)
            "array": (lambda: self.checked_place(self.ids), rewind),
            "list": (lambda: self.checked_place(self.id_list), rewind),
            "before": (self.before, rewind),
            "check array": (lambda: check_declaration(table, cfg, self.ids), keep),
            "check list": (lambda: check_declaration(table, cfg, self.id_list), keep),
            "place": (lambda: self.place(self.ids), rewind),
        }
        times = {name: [] for name in runs}
        gc.disable()
        try:
            for _ in range(rounds):
                for name, (run, undo) in runs.items():
                    for _ in range(-(-repeat // rounds)):
                        start = time.perf_counter_ns()
                        run()
                        times[name].append(time.perf_counter_ns() - start)
                        undo()
        finally:
            gc.enable()
        table.check_invariants()
        return {name: statistics.median(t) / 1e3 for name, t in times.items()}


def first_call_s() -> float:
    """Seconds for the first use of the step's njit functions (compile, or cache load)."""
    start = time.perf_counter()
    bench = Bench(2 * LONG, 0)
    bench.checked_place(bench.ids[:2])
    bench.before()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeat", type=int, help="repeats per figure (default 2001, quick 101)")
    args = parser.parse_args(argv)
    repeat = args.repeat or (101 if args.quick else 2001)
    print("numbakv host step benchmark: check_declaration + HostTable.place, 256-token decode")
    print_machine("numba")
    print(f"  njit first call (compile or cache load): {first_call_s():.2f} s")
    print(f"\nmedian of {repeat} repeats, microseconds; 'x seed' = array / the seed's C++ time")
    columns = ("capacity", "used", "array", "list", "before", "chk arr", "chk list", "place")
    print("\n{:>8} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7}   x seed".format(*columns))
    for capacity, history in CASES:
        bench = Bench(capacity, history)
        used = bench.table.used_cells
        f = bench.measure(repeat)
        seed = SEED_US[used]
        print(
            f"{cells_label(capacity):>8} {used:>7} {f['array']:>7.1f} {f['list']:>7.1f} "
            f"{f['before']:>7.1f} {f['check array']:>8.1f} {f['check list']:>8.1f} "
            f"{f['place']:>7.1f}   {f['array'] / seed:.2f} (seed {seed} µs)"
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
