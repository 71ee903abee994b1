"""`merge_splits`: the decode kernels' partial results of each token combined into its output."""

import math

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel
from numbakv.cache.kernels.attention.tiles import (
    EMPTY,
    NAN,
    NEG_INF,
    PARTIALS,
    POS_INF,
    ZERO,
    Q,
)
from numbakv.cache.kernels.step_buffer import SCALARS, STEP, WIDTH

# part_acc, part_m, part_l, step, n_splits, out
MERGE_SPLITS_SIGNATURES = [f"void({PARTIALS}, {STEP}, int32, {Q})"]


@kernel(MERGE_SPLITS_SIGNATURES)
def merge_splits(part_acc, part_m, part_l, step, n_splits, out):
    """out[t, h] = the splits' partial means combined: sum w_i acc_i / sum w_i, w_i =
    l_i e^(m_i - M), over the splits that saw a cell (l_i != EMPTY), M their NaN-propagating
    max; 0 when none saw a cell, NaN when M is not finite (as `tiles.write_rows`). The weights are
    normalised before the products, so no sum overflows."""
    # part_acc: [>= width, n_heads, >= n_splits, head_dim]
    # part_m, part_l: [>= width, n_heads, >= n_splits]
    # out: [>= width, n_heads, head_dim]; one item per (t, h, d), d fastest
    n_heads, head_dim = out.shape[1], out.shape[2]
    row = n_heads * head_dim
    width = min(step[SCALARS, WIDTH], np.int32(out.shape[0]), np.int32(part_acc.shape[0]))
    for i in range(cuda.grid(1), width * row, cuda.gridsize(1)):
        t = i // row
        h = (i - t * row) // head_dim
        d = i - t * row - h * head_dim
        m_max = NEG_INF
        denominator = EMPTY
        for split in range(n_splits):
            if part_l[t, h, split] != EMPTY:
                m = part_m[t, h, split]
                if m > m_max or m != m:  # a max that keeps a NaN
                    m_max = m
                denominator = ZERO
        mean = ZERO
        is_finite = NEG_INF < m_max < POS_INF
        if is_finite:
            for split in range(n_splits):
                total = part_l[t, h, split]
                if total != EMPTY:  # e^-inf = 0 for a split whose scores were all -inf
                    denominator += math.exp(part_m[t, h, split] - m_max) * total
            for split in range(n_splits):
                total = part_l[t, h, split]
                if total != EMPTY:  # select: an empty split's acc is never read
                    weight = math.exp(part_m[t, h, split] - m_max) * total / denominator
                    mean += weight * part_acc[t, h, split, d]
        if denominator == EMPTY:
            mean = ZERO
        elif not is_finite:
            mean = NAN
        out[t, h, d] = mean
