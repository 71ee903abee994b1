"""How fast is the device path's host cell table? Prints figures; asserts nothing.

    python benchmarks/host_table.py            # full run (about a minute on 2 cores)
    python benchmarks/host_table.py --quick    # a few seconds

For each capacity (16 Ki and 1 Mi cells) both tables, `numbakv.cache.table.HostTable` and the
reference `CellTable`, are built alike: one 4 Ki-token sequence (prefills of 256 tokens),
then 256 sequences of `--history` tokens each, interleaved as decoding leaves them (one
token per sequence per step). Then, median host time over `--repeat` repeats of:

    decode (table)  the placement of a 256-token step, one token per sequence: what
                    prepare_step does on the host (find_cells, then claim)
    decode (+check) the same plus what declare_step checks: check_live of each of the 256
                    ids and free_cells
    clone 4Ki       seq_clone of the 4 Ki-token sequence
    rewind 16       rewind of the 4 Ki-token sequence by 16 tokens
    rm 4Ki          seq_rm of the 4 Ki-token sequence

Every repeat starts from the same state: after each timed call the state is restored,
untimed (the step's tokens rewound, the clone removed, the rewound tokens decoded back,
the removed sequence prefilled back: lowest-free placement puts every cell back where it
was). njit functions are warmed up first; their first-call time (compile, or load from
numba's cache) is printed separately.
"""

import argparse
import statistics
import sys
import time

import numpy as np
from report import print_machine

from numbakv.cache.table import HostTable
from numbakv.config import CacheConfig
from numbakv.reference.table import CellTable

KI = 1024
MI = 1024 * KI
N_SEQS = 256
LONG = 4 * KI
MAX_WIDTH = 256
MAX_SEQS = N_SEQS + 4  # the 256, the long one, its clone
REWIND = 16


def header() -> None:
    print("numbakv host cell table benchmark")
    print_machine("numba")


def config(capacity: int) -> CacheConfig:
    return CacheConfig(
        n_layers=1,
        n_kv_heads=1,
        head_dim=4,
        capacity=capacity,
        max_width=MAX_WIDTH,
        max_seqs=MAX_SEQS,
    )


def place(table, seq_ids: np.ndarray) -> None:
    """The host half of prepare_step: find the cells, then claim them."""
    cells = table.find_cells(len(seq_ids))
    if isinstance(table, HostTable):
        table.claim(cells, seq_ids)
    else:
        table.claim(cells, table.positions_of(seq_ids), seq_ids)


def checked_place(table, seq_ids: np.ndarray) -> None:
    """declare_step's checks (each id live, enough free cells), then place."""
    for seq in seq_ids.tolist():
        table.check_live(seq)
    if table.free_cells < len(seq_ids):
        raise RuntimeError("the benchmark ran out of cells")
    place(table, seq_ids)


def prefill(table, seq: int, n: int) -> None:
    for start in range(0, n, MAX_WIDTH):
        place(table, np.full(min(MAX_WIDTH, n - start), seq, dtype=np.int32))


def build(table, history: int) -> tuple[int, np.ndarray]:
    """(the long sequence, the 256 decoding ids): the state every repeat starts from."""
    long = table.seq_new()
    prefill(table, long, LONG)
    seq_ids = np.array([table.seq_new() for _ in range(N_SEQS)], dtype=np.int32)
    for _ in range(history):
        place(table, seq_ids)
    return long, seq_ids


def time_us(run, undo, repeat: int) -> tuple[float, float]:
    """(median, mean) microseconds of run(), with undo() (untimed) after each."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        undo()
    return statistics.median(times) * 1e6, statistics.fmean(times) * 1e6


def clone_id(table, src: int) -> int:
    got = table.seq_clone(src)
    return got[0] if isinstance(got, tuple) else got


def measure(table, history: int, repeat: int) -> dict[str, tuple[float, float]]:
    """(median, mean) microseconds of each operation on `table`, from one state each time."""
    long, seq_ids = build(table, history)

    def rewind_step():
        for seq in seq_ids.tolist():
            table.rewind(seq, table.length(seq) - 1)

    clones = []

    def remove_clone():
        table.seq_rm(clones.pop())

    def refill():
        place(table, np.full(REWIND, long, dtype=np.int32))

    def restore_long():
        assert table.seq_new() == long
        prefill(table, long, LONG)

    return {
        "decode (table)": time_us(lambda: place(table, seq_ids), rewind_step, repeat),
        "decode (+check)": time_us(lambda: checked_place(table, seq_ids), rewind_step, repeat),
        "clone 4Ki": time_us(lambda: clones.append(clone_id(table, long)), remove_clone, repeat),
        "rewind 16": time_us(lambda: table.rewind(long, LONG - REWIND), refill, repeat),
        "rm 4Ki": time_us(lambda: table.seq_rm(long), restore_long, repeat),
    }


def first_call_s() -> float:
    """Seconds for the first use of every njit function (compile, or load from the cache)."""
    start = time.perf_counter()
    table = HostTable(config(MAX_WIDTH))
    a = table.seq_new()
    place(table, np.array([a, a], dtype=np.int32))
    b, _ = table.seq_clone(a)
    table.rewind(a, 1)
    table.seq_rm(b)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--history", type=int, default=40, help="tokens per decoding sequence")
    parser.add_argument("--repeat", type=int, help="repeats per figure (default 101, quick 7)")
    args = parser.parse_args(argv)
    repeat = args.repeat or (7 if args.quick else 101)
    header()
    print(f"  njit first call (compile or cache load): {first_call_s():.2f} s")
    print(
        f"\n{N_SEQS} decoding sequences of {args.history} tokens, one of {LONG} tokens; "
        f"median of {repeat} repeats, microseconds"
    )
    print("(host: median; mean: the host's mean, with any amortised arena compaction in it)")
    columns = ("capacity", "operation", "host", "mean", "reference", "ratio")
    print("\n{:>9}  {:<16} {:>8} {:>8} {:>10} {:>7}".format(*columns))
    for capacity in (16 * KI, MI):
        host = measure(HostTable(config(capacity)), args.history, repeat)
        ref = measure(CellTable(config(capacity)), args.history, max(3, repeat // 4))
        for name, (median, mean) in host.items():
            ref_median = ref[name][0]
            print(
                f"{capacity:>9}  {name:<16} {median:>8.1f} {mean:>8.1f} {ref_median:>10.1f} "
                f"{ref_median / median:>6.1f}x"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
