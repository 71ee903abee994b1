"""One reference `attend` at 65 536 cells: gathered against masked.

gathered: each token's own cells in position order; masked: the step's [width x read_len]
mask. The cache: a 512-token system prompt cloned into `--seqs` requests, each prefilled
to `--prompt` tokens (K/V left as allocated: only the step's rows are written). The timed
step: one decode token of every request but the last, and a prefill chunk of the last
filling width 256. Per window (0 = global, and 512), the median over `--repeat` attends of
gathered, of masked with the mask already computed, and of the first masked attend of a
step (which computes the window's mask).
"""

import argparse
import functools
import statistics

import numpy as np

from benchmarks.common import timed
from numbakv import CacheConfig
from numbakv.reference import CellCache

SYSTEM, WIDTH = 512, 256


def filled_cache(n_seqs: int, prompt: int) -> tuple[CellCache, list[int]]:
    """A cache holding the system prompt and `n_seqs` clones of it prefilled to `prompt`."""
    config = CacheConfig(n_layers=2, n_kv_heads=2, head_dim=64, windows=(0, 512),
                         capacity=65536, max_width=WIDTH, max_seqs=128, max_seq_len=4096,
                         initial_cells=65536, dtype="float16")  # fmt: skip
    cache = CellCache(config)
    system = cache.seq_new()
    prefill(cache, [system] * SYSTEM)
    requests = [cache.seq_clone(system) for _ in range(n_seqs)]
    prefill(cache, [seq for seq in requests for _ in range(prompt - SYSTEM)])
    return cache, requests


def prefill(cache: CellCache, ids: list[int]) -> None:
    """`ids` in steps of WIDTH tokens, no K/V written."""
    for start in range(0, len(ids), WIDTH):
        cache.declare_step(ids[start : start + WIDTH])
        cache.prepare_step()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seqs", type=int, default=120)
    parser.add_argument("--prompt", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="--seqs 12 --repeat 3")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.quick:
        args.seqs, args.repeat = 12, 3
    cache, requests = filled_cache(args.seqs, args.prompt)
    rng = np.random.default_rng(0)
    cfg = cache.config
    ids = requests[:-1] + [requests[-1]] * (WIDTH - len(requests) + 1)
    kv = rng.standard_normal((WIDTH, cfg.n_kv_heads, cfg.head_dim), dtype=np.float32)
    q = rng.standard_normal((WIDTH, 4 * cfg.n_kv_heads, cfg.head_dim), dtype=np.float32)
    print(f"read_len {cache.read_len} + a step of width {WIDTH} ({len(requests) - 1} decodes, "
          f"a prefill chunk of {ids.count(requests[-1])}), {len(requests)} requests, "
          f"n_heads {q.shape[1]}, n_kv_heads {cfg.n_kv_heads}, head_dim {cfg.head_dim}, "
          f"{cfg.dtype}")  # fmt: skip

    def new_step():
        cache.declare_step(ids)
        cache.prepare_step()
        for layer in range(cfg.n_layers):
            cache.write(layer, kv, kv)

    def median_ms(attend) -> float:
        return 1e3 * statistics.median(timed(attend, args.repeat))

    for layer, window in enumerate(cfg.windows):
        new_step()
        gathered, masked = (
            functools.partial(cache.attend, layer, q, mode=mode) for mode in ("gathered", "masked")
        )
        gathered_ms = median_ms(gathered)
        first = []
        for _ in range(args.repeat):
            new_step()  # untimed: a fresh step, whose masks are not computed yet
            first += timed(masked, 1)
        first_ms = 1e3 * statistics.median(first)
        cached_ms = median_ms(masked)
        for seq in requests:  # undo the timed steps' tokens
            cache.rewind(seq, args.prompt)
        print(f"window {window:>3}: gathered {gathered_ms:7.1f} ms | masked {cached_ms:7.1f} ms "
              f"with the mask computed, {first_ms:7.1f} ms computing it")  # fmt: skip
    return 0
