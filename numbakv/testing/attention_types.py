"""What `check_attention` hands a kernel and gives back: the batch of each layout, one case,
the result (`numbakv.testing.attention` builds and checks them)."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CellsInputs:
    """One batch for a cell-layout kernel. Token t of sequence s = seq_ids[t] at position
    p = positions[t] attends the cells seq_cells[s, max(0, p - window + 1) : p + 1]
    (all of seq_cells[s, : p + 1] for window 0), the cells mask[t] marks.

    q         : [n_tokens, n_heads, head_dim] float32
    k_pool    : [n_cells, n_kv_heads, head_dim] float32 or float16 (quantized: uint8
                [n_cells, n_kv_heads, row_width]); v_pool the same
    seq_cells : [n_seqs, max_len] int32, the cell of each position; -1 from seq_lens[s] on
                (the pool's last cell is always free, so -1 reads NaN in NumPy)
    seq_lens  : [n_seqs] int32
    seq_ids   : [n_tokens] int32, -1 for a padded row (its output must be 0)
    positions : [n_tokens] int32, -1 for a padded row
    mask      : [n_tokens, n_cells] uint8, 1 = attend, window applied; all 0 for padding
    window    : 0 = global, W > 0 = W keys; scale: the softmax scale
    """

    q: np.ndarray
    k_pool: np.ndarray
    v_pool: np.ndarray
    seq_cells: np.ndarray
    seq_lens: np.ndarray
    seq_ids: np.ndarray
    positions: np.ndarray
    mask: np.ndarray
    window: int
    scale: float


@dataclass(frozen=True)
class PagedInputs:
    """One batch for a paged (vLLM / FlashInfer) kernel. Sequence s owns the queries
    q[qo_indptr[s] : qo_indptr[s + 1]], the last positions of its seq_lens[s] keys (decode:
    one), and the pages kv_indices[kv_indptr[s] : kv_indptr[s + 1]] = the first ones of
    block_table[s]. Key position i lies at page i // block_size, slot i % block_size.

    q                : [n_tokens, n_heads, head_dim] float32
    k_cache          : [n_pages, block_size, n_kv_heads, head_dim] float32 or float16
                       (quantized: uint8 [..., n_kv_heads, row_width]);
                       v_cache the same
    block_table      : [n_seqs, max_blocks] int32; past a sequence's blocks an unused page
    seq_lens         : [n_seqs] int32, keys of each sequence
    kv_indptr        : [n_seqs + 1] int32
    kv_indices       : [nnz_pages] int32
    kv_last_page_len : [n_seqs] int32, 1..block_size
    qo_indptr        : [n_seqs + 1] int32
    positions        : [n_tokens] int32, each query's position (seq_lens[s] - n_q + i)
    window           : 0 = global, W > 0 = W keys (FlashInfer's window_left = W - 1)
    scale, block_size: the softmax scale, the page size
    """

    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray
    block_table: np.ndarray
    seq_lens: np.ndarray
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    kv_last_page_len: np.ndarray
    qo_indptr: np.ndarray
    positions: np.ndarray
    window: int
    scale: float
    block_size: int


@dataclass(frozen=True)
class AttentionCase:
    """One workload: the inputs, the oracle's [n_tokens, n_heads, head_dim] float32 output,
    the absolute tolerance, each token's [n_tokens] int32 sequence and position (-1 for
    padding), and a description naming the case."""

    index: int
    inputs: CellsInputs | PagedInputs
    expected: np.ndarray
    tolerance: float
    seq_ids: np.ndarray
    positions: np.ndarray
    label: str


@dataclass(frozen=True)
class AttentionCheckResult:
    """What a passing `check_attention` ran: cases, tokens, and the worst error seen (absolute,
    and as a fraction of its case's tolerance) with the case it came from."""

    layout: str
    cases: int
    tokens: int
    worst_error: float
    worst_ratio: float
    worst_case: str
