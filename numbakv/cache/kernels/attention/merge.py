"""`merge_splits`: the decode kernels' partial results of each token combined into its output."""

import math

from numbakv.cache._cuda import cuda
from numbakv.cache.kernels import kernel
from numbakv.cache.kernels.attention.tiles import NEG_BIG, PARTIALS, ZERO, Q

# part_acc, part_m, part_l, width, n_splits, out
MERGE_SPLITS_SIGNATURES = [f"void({PARTIALS}, int32, int32, {Q})"]


@kernel(MERGE_SPLITS_SIGNATURES)
def merge_splits(part_acc, part_m, part_l, width, n_splits, out):
    """out[t, h] = the splits' partials combined: sum e^(m_i-M) acc_i / sum e^(m_i-M) l_i, or 0."""
    # part_acc: [>= width, n_heads, >= n_splits, head_dim]
    # part_m, part_l: [>= width, n_heads, >= n_splits]
    # out: [>= width, n_heads, head_dim]; one item per (t, h, d), d fastest
    n_heads, head_dim = out.shape[1], out.shape[2]
    row = n_heads * head_dim
    for i in range(cuda.grid(1), width * row, cuda.gridsize(1)):
        t = i // row
        h = (i - t * row) // head_dim
        d = i - t * row - h * head_dim
        m_max = NEG_BIG
        for split in range(n_splits):
            if part_l[t, h, split] > ZERO:
                m_max = max(m_max, part_m[t, h, split])
        numerator = ZERO
        denominator = ZERO
        for split in range(n_splits):
            total = part_l[t, h, split]
            if total > ZERO:  # select: an empty split's acc is never read
                weight = math.exp(part_m[t, h, split] - m_max)  # <= 0, finite
                numerator += weight * part_acc[t, h, split, d]
                denominator += weight * total
        out[t, h, d] = numerator / denominator if denominator > ZERO else ZERO
