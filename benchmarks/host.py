"""What a step costs the host, in three benchmarks. Prints figures; asserts nothing.

    python -m benchmarks.host table [--quick]   # the host cell table (a minute; quick: seconds)
    python -m benchmarks.host step [--quick]    # a decode step's check + placement (30 s)
    NUMBAKV_DEVICE=sim python -m benchmarks.host cache [--quick]   # CellCache's host work

In table and step every timed call starts from the same state: after each the state is
restored, untimed (lowest-free placement puts every cell back where it was); the njit
functions' first-call time (compile, or load from numba's cache) is printed apart. Timings
on a shared VM drift by 2x over seconds: compare figures of one run, not of two.

table: for 16 Ki and 1 Mi cells, `numbakv.cache.table.HostTable` and the reference's
`CellTable`, built alike (one 4 Ki-token sequence prefilled 256 tokens a step, then 256
sequences of `--history` tokens, one token per sequence a step); median and mean µs over
`--repeat` repeats of:

    decode (table)  the placement of a 256-token step, one token per sequence: what
                    prepare_step does on the host (find_cells, then claim)
    decode (+check) the same plus declare_step's checks (check_live of each id, free_cells)
    clone 4Ki       seq_clone of the 4 Ki-token sequence
    rewind 16       rewind of the 4 Ki-token sequence by 16 tokens
    rm 4Ki          seq_rm of the 4 Ki-token sequence

step: `declare_step`'s check of a 256-token decode step's ids (`check_declaration`) and
`prepare_step`'s placement on the host table, per capacity and fill (CASES: one 4 Ki-token
sequence, 256 sequences of `history` tokens), median µs over `--repeat` repeats taken in
five rounds, the garbage collector off:

    array    check_declaration of the ids as an int32 array, then `HostTable.place` (one
             njit call) into a [4, max_width] int32 buffer, as prepare_step fills its step
             buffer
    list     the same with the ids as a list of Python ints
    before   the step as separate calls: check_live of each id, then find_cells and claim
             (four njit calls; `decode (+check)` of table)

and apart, the check alone (array, list) and `place` alone.

cache: the whole of what `numbakv.CellCache` does on the host for the same step (ids as an
int32 array and as a list) at the same CASES: the lock, the checks, the staging slot, the
placement, the `Step`, the observers' hook. Its device calls (the upload, the preparation
launch, the verbs' kernels) are no-ops while timing, so that the figures are the host's
alone, on the simulator too; a GPU's launch and copy add their own (`python -m
benchmarks.gpu_check` measures them). Median µs of `--repeat` consecutive steps, the cases
taking turns over `--rounds` rounds (the median and the best round); when the sequences
run out of room they are rewound, untimed, to where they started.
"""

import argparse
import contextlib
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np

from benchmarks.common import KI, MI, cells_label, gc_off, print_machine, run_command, timed
from numbakv.cache.table import HostTable
from numbakv.core.calls import check_declaration
from numbakv.core.config import CacheConfig
from numbakv.reference.table import CellTable

N_SEQS, LONG, MAX_WIDTH = 256, 4 * KI, 256
REWIND = 16
# (capacity, tokens per decoding sequence): 4 Ki + 256 * history cells used, 6656 and 524288
CASES = ((16 * KI, 10), (MI, 10), (MI, 2032))


def config(capacity: int, **fields: int) -> CacheConfig:
    """The cache shape of every benchmark here: 260 ids (the 256, the long one, a clone),
    256-token steps, one layer of one KV head of 4."""
    return CacheConfig(
        n_layers=1, n_kv_heads=1, head_dim=4, capacity=capacity, max_width=MAX_WIDTH,
        max_seqs=N_SEQS + 4, **fields,
    )  # fmt: skip


def njit_first_call(first_use: Callable[[], object]) -> None:
    """Prints the seconds of `first_use()`: the njit functions' compile or cache load."""
    start = time.perf_counter()
    first_use()
    print(f"  njit first call (compile or cache load): {time.perf_counter() - start:.2f} s")


# -- table: HostTable against the reference's CellTable --------------------------------------


def place(table: HostTable | CellTable, seq_ids: np.ndarray) -> None:
    """The host half of prepare_step: find the cells, then claim them."""
    cells = table.find_cells(len(seq_ids))
    if isinstance(table, HostTable):
        table.claim(cells, seq_ids)
    else:
        table.claim(cells, table.positions_of(seq_ids), seq_ids)


def checked_place(table: HostTable | CellTable, seq_ids: np.ndarray) -> None:
    """declare_step's checks (each id live, enough free cells), then place."""
    for seq in seq_ids.tolist():
        table.check_live(seq)
    if table.free_cells < len(seq_ids):
        raise RuntimeError("the benchmark ran out of cells")
    place(table, seq_ids)


def prefill(table: HostTable | CellTable, seq: int, n: int) -> None:
    """`n` tokens of `seq`, placed MAX_WIDTH a step."""
    for start in range(0, n, MAX_WIDTH):
        place(table, np.full(min(MAX_WIDTH, n - start), seq, dtype=np.int32))


def table_ops(
    table: HostTable | CellTable, history: int, repeat: int
) -> dict[str, tuple[float, float]]:
    """(median, mean) µs of each operation on `table`, from one state each time."""
    long = table.seq_new()
    prefill(table, long, LONG)
    seq_ids = np.array([table.seq_new() for _ in range(N_SEQS)], dtype=np.int32)
    for _ in range(history):
        place(table, seq_ids)
    clones = []

    def rewind_step():
        for seq in seq_ids.tolist():
            table.rewind(seq, table.length(seq) - 1)

    def clone():
        got = table.seq_clone(long)
        clones.append(got[0] if isinstance(got, tuple) else got)

    def restore_long():
        assert table.seq_new() == long
        prefill(table, long, LONG)

    runs = {  # name: (the timed call, the untimed undo after it)
        "decode (table)": (lambda: place(table, seq_ids), rewind_step),
        "decode (+check)": (lambda: checked_place(table, seq_ids), rewind_step),
        "clone 4Ki": (clone, lambda: table.seq_rm(clones.pop())),
        "rewind 16": (
            lambda: table.rewind(long, LONG - REWIND),
            lambda: place(table, np.full(REWIND, long, dtype=np.int32)),
        ),
        "rm 4Ki": (lambda: table.seq_rm(long), restore_long),
    }
    figures = {}
    for name, (run, undo) in runs.items():
        times = timed(run, repeat, undo)
        figures[name] = (statistics.median(times) * 1e6, statistics.fmean(times) * 1e6)
    return figures


def table_first_use() -> None:
    """The first use of every njit function of the host table."""
    table = HostTable(config(MAX_WIDTH))
    a = table.seq_new()
    place(table, np.array([a, a], dtype=np.int32))
    b, _ = table.seq_clone(a)
    table.rewind(a, 1)
    table.seq_rm(b)


def run_table(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    repeat = args.repeat or (7 if args.quick else 101)
    print("numbakv host cell table benchmark")
    print_machine("numba")
    njit_first_call(table_first_use)
    print(f"\n{N_SEQS} decoding sequences of {args.history} tokens, one of {LONG} tokens; "
          f"median of {repeat} repeats, microseconds")  # fmt: skip
    print("(host: median; mean: the host's mean, with any amortised arena compaction in it)")
    columns = ("capacity", "operation", "host", "mean", "reference", "ratio")
    print("\n{:>9}  {:<16} {:>8} {:>8} {:>10} {:>7}".format(*columns))
    for capacity in (16 * KI, MI):
        host = table_ops(HostTable(config(capacity)), args.history, repeat)
        ref = table_ops(CellTable(config(capacity)), args.history, max(3, repeat // 4))
        for name, (median, mean) in host.items():
            ref_median = ref[name][0]
            print(f"{capacity:>9}  {name:<16} {median:>8.1f} {mean:>8.1f} {ref_median:>10.1f} "
                  f"{ref_median / median:>6.1f}x")  # fmt: skip
    sys.stdout.flush()


# -- step: check_declaration + HostTable.place ----------------------------------------------


class StepBench:
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

    def checked_place(self, seq_ids: np.ndarray | list[int]) -> None:
        """declare_step's check, then prepare_step's placement."""
        self.place(check_declaration(self.table, self.config, seq_ids))

    def rewind(self) -> None:
        """Undoes a step: each sequence back by its one token."""
        for seq in self.id_list:
            self.table.rewind(seq, self.table.length(seq) - 1)

    def measure(self, repeat: int, rounds: int = 5) -> dict[str, float]:
        """Median µs of each figure over `repeat` runs, taken in `rounds` turns (so that a
        machine whose speed drifts, a shared VM, slows every figure alike)."""
        table, cfg, rewind = self.table, self.config, self.rewind
        runs = {  # name: (the timed call, the untimed undo after it)
            "array": (lambda: self.checked_place(self.ids), rewind),
            "list": (lambda: self.checked_place(self.id_list), rewind),
            "before": (lambda: checked_place(table, self.ids), rewind),
            "check array": (lambda: check_declaration(table, cfg, self.ids), None),
            "check list": (lambda: check_declaration(table, cfg, self.id_list), None),
            "place": (lambda: self.place(self.ids), rewind),
        }
        times = {name: [] for name in runs}
        with gc_off():
            for _ in range(rounds):
                for name, (run, undo) in runs.items():
                    times[name] += timed(run, -(-repeat // rounds), undo)
        table.check_invariants()
        return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def step_first_use() -> None:
    bench = StepBench(2 * LONG, 0)
    bench.checked_place(bench.ids[:2])
    checked_place(bench.table, bench.ids)


def run_step(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    repeat = args.repeat or (101 if args.quick else 2001)
    print("numbakv host step benchmark: check_declaration + HostTable.place, 256-token decode")
    print_machine("numba")
    njit_first_call(step_first_use)
    print(f"\nmedian of {repeat} repeats, microseconds")
    columns = ("capacity", "used", "array", "list", "before", "chk arr", "chk list", "place")
    print("\n{:>8} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7}".format(*columns))
    for capacity, history in CASES:
        bench = StepBench(capacity, history)
        f = bench.measure(repeat)
        print(
            f"{cells_label(capacity):>8} {bench.table.used_cells:>7} {f['array']:>7.1f} "
            f"{f['list']:>7.1f} {f['before']:>7.1f} {f['check array']:>8.1f} "
            f"{f['check list']:>8.1f} {f['place']:>7.1f}"
        )
        sys.stdout.flush()


# -- cache: CellCache's declare_step + prepare_step, device calls as no-ops ------------------


@contextlib.contextmanager
def host_only() -> Iterator[None]:
    """The cache's device calls as no-ops (its table and buffers then disagree: time only)."""
    from numbakv.cache import cellcache
    from numbakv.cache.buffers import StepBuffers

    def nothing(*args, **kwargs):
        return None

    targets = [
        (cellcache.placement, "launch_prepare_tokens"),
        (cellcache.verbs, "launch_drop_owner"),
        (cellcache.seq_cells, "launch_set_length"),
        (cellcache, "_to_device"),
        (StepBuffers, "upload"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]
    for owner, name in targets:
        setattr(owner, name, nothing)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def filled_cache(capacity: int, history: int) -> tuple:
    """A cache holding one LONG sequence and N_SEQS sequences of `history` tokens."""
    from numbakv import CellCache

    cache = CellCache(config(capacity, max_seq_len=LONG, initial_cells=capacity))
    long = cache.seq_new()
    for _ in range(LONG // N_SEQS):
        cache.declare_step([long] * N_SEQS)
        cache.prepare_step()
    seqs = [cache.seq_new() for _ in range(N_SEQS)]
    for _ in range(history):
        cache.declare_step(seqs)
        cache.prepare_step()
    return cache, seqs


def steps_us(cache: object, ids: np.ndarray | list[int], seqs: list[int], repeat: int) -> float:
    """Median µs of decode steps taken one after another, as a serving loop does; when the
    sequences near their room, all are rewound to where they started (untimed)."""
    start_pos = [cache.pos(seq) for seq in seqs]
    room = min(cache.free_cells // len(seqs), cache.config.max_seq_len - max(start_pos))
    taken = itertools.count(1)

    def step():
        cache.declare_step(ids)
        cache.prepare_step()

    def rewind_all():
        for seq, pos in zip(seqs, start_pos, strict=True):
            cache.rewind(seq, pos)

    def rewind_near_the_end():
        if next(taken) % max(1, room - 1) == 0:
            rewind_all()

    times = timed(step, repeat, rewind_near_the_end)
    rewind_all()
    return statistics.median(times) * 1e6


def run_cache(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    repeat, rounds = (51, 1) if args.quick else (args.repeat, args.rounds)
    print("numbakv device cache: host µs of declare_step + prepare_step (device calls no-ops)")
    print_machine("numba")
    print(f"median of {repeat} steps per round; the median and the best of {rounds} rounds")
    print("(the cases take turns; a shared VM drifts 2x over seconds)\n")
    print(f"{'capacity':>9} {'used':>8} {'array µs':>14} {'list µs':>14}")
    with host_only():
        caches = [filled_cache(*case) for case in CASES[: 1 if args.quick else 3]]
        figures = [([], []) for _ in caches]
        for cache, seqs in caches:
            steps_us(cache, np.array(seqs, np.int32), seqs, 5)  # warm the njit functions
        with gc_off():
            for _ in range(rounds):
                for (cache, seqs), (as_array, as_list) in zip(caches, figures, strict=True):
                    as_array.append(steps_us(cache, np.array(seqs, np.int32), seqs, repeat))
                    as_list.append(steps_us(cache, list(seqs), seqs, repeat))
    for (cache, _), runs in zip(caches, figures, strict=True):
        cells = [f"{statistics.median(r):6.1f} ({min(r):5.1f})" for r in runs]
        print(
            f"{cells_label(cache.capacity):>9} {cache.used_cells:>8} {cells[0]:>14} {cells[1]:>14}"
        )


def table_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--history", type=int, default=40, help="tokens per decoding sequence")
    parser.add_argument("--repeat", type=int, help="repeats per figure (default 101, quick 7)")


def step_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeat", type=int, help="repeats per figure (default 2001, quick 101)")


def cache_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 16 Ki only")
    parser.add_argument("--repeat", type=int, default=201, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)


COMMANDS = {
    "table": ("HostTable against the reference's CellTable", table_arguments, run_table),
    "step": ("check_declaration + HostTable.place", step_arguments, run_step),
    "cache": ("CellCache's declare_step + prepare_step, host only", cache_arguments, run_cache),
}

if __name__ == "__main__":
    sys.exit(run_command("python -m benchmarks.host", __doc__.splitlines()[0], COMMANDS))
