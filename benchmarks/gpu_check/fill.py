"""Device caches filled for `python -m benchmarks.gpu_check`: random float16 K/V kept on the
device (RandomKV), written by prefill steps whose sequences' cells interleave into a cache of
any storage format (the cache rounds or quantizes what it stores)."""

import collections

import numpy as np

from benchmarks.gpu_check.run import Run


class RandomKV:
    """K/V rows to write: slices of one random float16 block kept on the device (nothing is
    uploaded per step), remembered per sequence so that the host can rebuild its history."""

    def __init__(self, cuda, n_rows: int, n_kv_heads: int, head_dim: int, seed: int):
        self.rng = np.random.default_rng(seed)
        shape = (n_rows, n_kv_heads, head_dim)
        self.k_h, self.v_h = (
            self.rng.standard_normal(shape, dtype=np.float32).astype(np.float16) for _ in "kv"
        )
        self.k_d, self.v_d = cuda.to_device(self.k_h), cuda.to_device(self.v_h)
        self.rows_of: dict[int, list[np.ndarray]] = {}  # seq -> its block rows by position

    def take(self, seq_ids: np.ndarray) -> tuple:
        """(k, v) device views [len(seq_ids), n_kv_heads, head_dim] for a step's tokens."""
        n = len(seq_ids)
        start = int(self.rng.integers(0, len(self.k_h) - n + 1))
        rows = np.arange(start, start + n)
        for seq in np.unique(seq_ids).tolist():
            self.rows_of.setdefault(seq, []).append(rows[seq_ids == seq])
        return self.k_d[start : start + n], self.v_d[start : start + n]

    def history(self, seq: int) -> tuple[np.ndarray, np.ndarray]:
        """`seq`'s K and V by position as written: [length, n_kv_heads, head_dim] float16."""
        rows = np.concatenate(self.rows_of[seq])
        return self.k_h[rows], self.v_h[rows]


def prefilled_cache(
    run: Run, *, n_layers: int, n_kv_heads: int, head_dim: int, batch: int, max_seq_len: int,
    history: int, seed: int, dtype: str = "float16",
) -> tuple:  # fmt: skip
    """(cache, sequences, K/V, prefill steps taken): a device cache of storage format `dtype`
    (`numbakv.core.formats`) of `batch` sequences of up to `max_seq_len` positions, room for them
    all allocated up front, each sequence prefilled with `history` positions of float16 K/V
    (the same ones for the same seed and shapes, whatever `dtype`)."""
    from numbakv.core.config import CacheConfig

    s = run.shapes
    capacity = max(batch * max_seq_len, s.chunk)
    config = CacheConfig(
        n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, capacity=capacity,
        max_width=max(s.chunk, batch), max_seqs=batch, initial_cells=capacity,
        dtype=dtype, max_seq_len=max_seq_len,
    )  # fmt: skip
    cache = run.device.CellCache(config)
    seqs = [cache.seq_new() for _ in range(batch)]
    kv = RandomKV(run.device.cuda, 2 * config.max_width, n_kv_heads, head_dim, seed=seed)
    n_steps = prefill(cache, seqs, history, kv, s.piece)
    return cache, seqs, kv, n_steps


def prefill(cache: object, seqs: list[int], length: int, kv: RandomKV, piece: int) -> int:
    """Prefill steps of max_width tokens (the last one fewer): `piece` tokens of each
    sequence in turn, round robin, so that their cells interleave, until every sequence holds
    `length` positions; each step's K/V written to every layer. Returns the steps taken."""
    left = dict.fromkeys(seqs, length)
    turns = collections.deque(seqs if length else [])
    n_steps = 0
    while turns:
        parts, room = [], cache.config.max_width
        while turns and room:
            seq = turns.popleft()
            n = min(piece, left[seq], room)
            parts.append(np.full(n, seq, np.int32))
            left[seq] -= n
            room -= n
            if left[seq]:
                turns.append(seq)
        seq_ids = np.concatenate(parts)
        cache.declare_step(seq_ids)
        cache.prepare_step()
        k, v = kv.take(seq_ids)
        for layer in range(cache.config.n_layers):
            cache.write(layer, k, v)
        n_steps += 1
    return n_steps
