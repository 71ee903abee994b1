"""The host time of a device cache's step: `declare_step` + `prepare_step`, nothing else.

    NUMBAKV_DEVICE=sim python benchmarks/cache_step_host.py           # about a minute
    NUMBAKV_DEVICE=sim python benchmarks/cache_step_host.py --quick

`benchmarks/host_step.py` times the table's share (the id check and `HostTable.place`);
this times the whole of what `numbakv.CellCache` does on the host for a 256-token decode
step (one token per sequence over 256 sequences, ids as an int32 array and as a list):
the lock, the checks, the staging slot, the placement, the `Step`, the observers' hook.
The device calls (the upload, the preparation launch, the verbs' kernels) are replaced by
no-ops while timing, so that the figures are the host's alone, also on the simulator; a
GPU's launch and copy add their own cost (about 6-30 µs per numba launch), which
`benchmarks/gpu_check.py` measures. Median µs over `--repeat` consecutive decode steps
(the three cases take turns over `--rounds` rounds: the median and the best round); when
the sequences run out of room, untimed, they are rewound to where they started.
Prints figures, asserts nothing.
"""

import argparse
import contextlib
import gc
import statistics
import time

import numpy as np
from report import cells_label, print_machine

from numbakv import CacheConfig, CellCache
from numbakv.cache import cellcache
from numbakv.cache.buffers import StepBuffers

KI, MI = 1024, 1024 * 1024
N_SEQS, LONG = 256, 4 * KI
CASES = ((16 * KI, 10), (MI, 10), (MI, 2032))  # (capacity, history): 6656, 524288 used


@contextlib.contextmanager
def host_only():
    """The cache's device calls as no-ops (its table and buffers then disagree: time only)."""

    def nothing(*args, **kwargs):
        return None

    saved = []
    targets = [
        (cellcache.placement, "launch_prepare_tokens"),
        (cellcache.verbs, "launch_drop_owner"),
        (cellcache.seq_cells, "launch_set_length"),
        (cellcache, "_to_device"),
        (StepBuffers, "upload"),
    ]
    for owner, name in targets:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, nothing)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def build(capacity: int, history: int) -> tuple[CellCache, list[int]]:
    """A cache holding one LONG sequence and N_SEQS sequences of `history` tokens."""
    cfg = CacheConfig(
        n_layers=1, n_kv_heads=1, head_dim=4, capacity=capacity, max_width=N_SEQS,
        max_seqs=N_SEQS + 4, max_seq_len=LONG, initial_cells=capacity,
    )  # fmt: skip
    cache = CellCache(cfg)
    long = cache.seq_new()
    for _ in range(LONG // N_SEQS):
        cache.declare_step([long] * N_SEQS)
        cache.prepare_step()
    seqs = [cache.seq_new() for _ in range(N_SEQS)]
    for _ in range(history):
        cache.declare_step(seqs)
        cache.prepare_step()
    return cache, seqs


def median_us(cache: CellCache, ids, seqs: list[int], repeat: int) -> float:
    """Median µs of decode steps taken one after another, as a serving loop does; when the
    sequences near their room, all are rewound to where they started (untimed)."""
    start_pos = [cache.pos(seq) for seq in seqs]
    room = min(cache.free_cells // len(seqs), cache.config.max_seq_len - max(start_pos))
    times = []
    for i in range(repeat):
        if i and i % max(1, room - 1) == 0:
            for seq, pos in zip(seqs, start_pos, strict=True):
                cache.rewind(seq, pos)
        start = time.perf_counter()
        cache.declare_step(ids)
        cache.prepare_step()
        times.append(time.perf_counter() - start)
    for seq, pos in zip(seqs, start_pos, strict=True):
        cache.rewind(seq, pos)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, 16 Ki only")
    parser.add_argument("--repeat", type=int, default=201, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    repeat, rounds = (51, 1) if args.quick else (args.repeat, args.rounds)
    print("numbakv device cache: host µs of declare_step + prepare_step (device calls no-ops)")
    print_machine("numba")
    print(f"median of {repeat} steps per round; the median and the best of {rounds} rounds")
    print("(the cases take turns; a shared VM drifts 2x over seconds)\n")
    print(f"{'capacity':>9} {'used':>8} {'array µs':>14} {'list µs':>14}")
    with host_only():
        caches = [build(capacity, history) for capacity, history in CASES[: 1 if args.quick else 3]]
        figures = [([], []) for _ in caches]
        for cache, seqs in caches:
            median_us(cache, np.array(seqs, np.int32), seqs, 5)  # warm the njit functions
        gc.disable()
        for _ in range(rounds):
            for (cache, seqs), (as_array, as_list) in zip(caches, figures, strict=True):
                as_array.append(median_us(cache, np.array(seqs, np.int32), seqs, repeat))
                as_list.append(median_us(cache, list(seqs), seqs, repeat))
        gc.enable()
    for (cache, _), runs in zip(caches, figures, strict=True):
        cells = [f"{statistics.median(r):6.1f} ({min(r):5.1f})" for r in runs]
        print(
            f"{cells_label(cache.capacity):>9} {cache.used_cells:>8} {cells[0]:>14} {cells[1]:>14}"
        )


if __name__ == "__main__":
    main()
