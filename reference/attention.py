"""Attention through cells (docs/contract.md §5) and the solo oracle that knows nothing of cells."""

import numpy as np

from numbakv.core.calls import default_scale

from .storage import to_float32


def softmax_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: np.float32) -> np.ndarray:
    """[n_heads, head_dim] float32: one token's attention over the keys it sees.

    q : [n_heads, head_dim] float32
    k : [n_keys, n_kv_heads, head_dim] float32, v the same; query head h reads
        KV head h // (n_heads // n_kv_heads). No keys gives zeros.

    NaN and inf follow float32 arithmetic (no warnings): a NaN score, or a largest score
    of ±inf, makes the head's whole row NaN; a NaN or inf in V spreads into the
    dimensions it sits in, even at weight 0 (0 · inf is NaN).
    """
    n_heads, head_dim = q.shape
    if len(k) == 0:
        return np.zeros((n_heads, head_dim), dtype=np.float32)
    n_kv_heads = k.shape[1]
    q_grouped = q.reshape(n_kv_heads, n_heads // n_kv_heads, head_dim)  # [kv, group, d]
    with np.errstate(invalid="ignore", over="ignore"):
        scores = q_grouped @ k.transpose(1, 2, 0) * scale  # [kv, group, n_keys]
        weights = np.exp(scores - scores.max(axis=2, keepdims=True))
        weights /= weights.sum(axis=2, keepdims=True)
        out = weights @ v.transpose(1, 0, 2)  # [kv, group, d]
    return out.reshape(n_heads, head_dim).astype(np.float32)


def read_kv(k_pool, v_pool, cells, dtype: str, v_dtype: str | None, scales) -> tuple:
    """The float32 values [n, n_kv_heads, head_dim] of K and V in `cells`."""
    k_scales, v_scales = (None, None) if scales is None else scales
    k = to_float32(k_pool[cells], dtype, k_scales)
    return k, to_float32(v_pool[cells], dtype if v_dtype is None else v_dtype, v_scales)


def attend_cells(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    mask: np.ndarray,
    scale: np.float32,
    dtype: str = "float32",
    v_dtype: str | None = None,
    scales: tuple | None = None,
) -> np.ndarray:
    """[width, n_heads, head_dim] float32: each token attends the cells its mask row allows.

    q       : [width, n_heads, head_dim] float32
    k_pool  : [rows, n_kv_heads, row_width] of format `dtype` (docs/contract.md §4.1)
    v_pool  : the same of format `v_dtype` (default `dtype`)
    mask    : [width, read_len] uint8, 1 = attend
    scales  : fp8's (K scales, V scales), each [n_kv_heads] float32

    Only the attended cells are read, so free or foreign cells may hold anything.
    """
    out = np.zeros(q.shape, dtype=np.float32)
    for t in range(len(mask)):
        cells = np.flatnonzero(mask[t])
        k, v = read_kv(k_pool, v_pool, cells, dtype, v_dtype, scales)
        out[t] = softmax_attend(q[t], k, v, scale)
    return out


def attend_gathered(
    q: np.ndarray,
    k_pool: np.ndarray,
    v_pool: np.ndarray,
    seq_cells: dict[int, np.ndarray],
    seq_ids: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: np.float32,
    dtype: str = "float32",
    v_dtype: str | None = None,
    scales: tuple | None = None,
) -> np.ndarray:
    """[width, n_heads, head_dim] float32: each token attends its own sequence's cells of
    its window, in position order; no [width, read_len] mask.

    q         : [width, n_heads, head_dim] float32
    k_pool    : [rows, n_kv_heads, row_width] of format `dtype`, v_pool of `v_dtype`
                (default `dtype`); scales as in `attend_cells`
    seq_cells : {seq: [pos(seq)] int32}, each sequence of the step's cells in position
                order (`CellTable.cells_of`)
    seq_ids   : [width] int32, sequence of each token, -1 = padding (gives 0)
    positions : [width] int32, position of each token
    window    : 0 = global, W > 0 = the token at p sees positions max(0, p-W+1) .. p

    The same cells as the mask rule of docs/contract.md §3 (owned by the token's sequence,
    position in its window), in another order, so equal to `attend_cells` up to float32
    summation order. Only those cells are read: free or foreign cells may hold anything.
    """
    out = np.zeros(q.shape, dtype=np.float32)
    for t, (seq, p) in enumerate(zip(seq_ids.tolist(), positions.tolist(), strict=True)):
        if seq < 0:
            continue  # padding
        first = max(0, p - window + 1) if window > 0 else 0
        cells = seq_cells[seq][first : p + 1]  # [seen] by position
        k, v = read_kv(k_pool, v_pool, cells, dtype, v_dtype, scales)
        out[t] = softmax_attend(q[t], k, v, scale)
    return out


def solo_attention(
    q: np.ndarray,
    k_hist: np.ndarray,
    v_hist: np.ndarray,
    positions: np.ndarray,
    window: int,
    scale: float | None = None,
) -> np.ndarray:
    """[n, n_heads, head_dim] float32: attention of one sequence over its own history.

    q         : [n, n_heads, head_dim], the queries of n tokens of one sequence
    k_hist    : [length, n_kv_heads, head_dim], the sequence's keys by position; v_hist the same
    positions : [n] int, position of each query token (< length)
    window    : 0 = global, W > 0 = the token at p sees positions max(0, p-W+1) .. p
    scale     : default 1 / sqrt(head_dim)

    No cells, no bitsets, no masks: the oracle that batched attention through cells
    must equal.
    """
    q = np.asarray(q, dtype=np.float32)
    k_hist = np.asarray(k_hist, dtype=np.float32)
    v_hist = np.asarray(v_hist, dtype=np.float32)
    _, n_heads, head_dim = q.shape
    group = n_heads // k_hist.shape[1]
    scale = default_scale(head_dim) if scale is None else np.float32(scale)
    out = np.zeros(q.shape, dtype=np.float32)
    for i, p in enumerate(np.asarray(positions).tolist()):
        first = max(0, p - window + 1) if window > 0 else 0
        for h in range(n_heads):
            keys = k_hist[first : p + 1, h // group]  # [seen, head_dim]
            values = v_hist[first : p + 1, h // group]
            with np.errstate(invalid="ignore", over="ignore"):
                scores = keys @ q[i, h] * scale
                weights = np.exp(scores - scores.max())
                out[i, h] = weights @ values / weights.sum()
    return out
