"""`merge_splits`: the decode kernels' partial results of each token combined into its output
(`merge_kernel(out_kind)`: float32 or float16 out, or bfloat16 patterns)."""

import math

import numpy as np

from numbakv.cache.cuda import cuda
from numbakv.cache.kernels import kernel, quant, storage, wide
from numbakv.cache.kernels.attention.tiles import (
    EMPTY,
    NAN,
    NEG_INF,
    PARTIALS,
    POS_INF,
    ZERO,
    io_signature,
)
from numbakv.cache.kernels.placement import io_name
from numbakv.cache.kernels.step_buffer import SCALARS, STEP, WIDTH


def merge_signatures(out_kind: str) -> list[str]:
    """part_acc, part_m, part_l, step, n_splits, out."""
    return [f"void({PARTIALS}, {STEP}, int32, {io_signature(out_kind)})"]


def make_merge(out_kind: str):
    """The merge of an out of `out_kind` (`storage.IO_KINDS`; a closure constant)."""
    out_code = storage.IO_KINDS[out_kind][0]

    def merge_splits(part_acc, part_m, part_l, step, n_splits, out):
        """out[t, h] = the splits' partial means combined: sum w_i acc_i / sum w_i, w_i =
        l_i 2^(m_i - M) (the decode kernel's scores are in base 2), over the splits that saw a
        cell (l_i != EMPTY), M their
        NaN-propagating max; 0 when none saw a cell, NaN when M is not finite (as
        `tiles.make_write_rows`). The weights are normalised before the products, so no sum
        overflows."""
        # part_acc: [>= width, n_heads, >= n_splits, head_dim]
        # part_m, part_l: [>= width, n_heads, >= n_splits]
        # out: [>= width, n_heads, head_dim]; one item per (t, h, d), d fastest
        n_heads, head_dim = np.int32(out.shape[1]), np.int32(out.shape[2])
        row = np.int32(n_heads * head_dim)
        width = min(step[SCALARS, WIDTH], np.int32(out.shape[0]), np.int32(part_acc.shape[0]))
        # int32 counting and division (`wide.div`): numba's are 64-bit, a call on a GPU; a
        # while loop, where a range with a step divides to count its items
        i, n_items = np.int32(cuda.grid(1)), np.int32(width * row)
        while i < n_items:
            t = wide.div(i, row)
            h = wide.div(i - t * row, head_dim)
            d = np.int32(i - t * row - h * head_dim)
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
                        denominator += math.exp2(part_m[t, h, split] - m_max) * total
                for split in range(n_splits):
                    total = part_l[t, h, split]
                    if total != EMPTY:  # select: an empty split's acc is never read
                        weight = math.exp2(part_m[t, h, split] - m_max) * total / denominator
                        mean += weight * part_acc[t, h, split, d]
            if denominator == EMPTY:
                mean = ZERO
            elif not is_finite:
                mean = NAN
            if out_code == quant.FLOAT:
                out[t, h, d] = mean
            else:
                out[t, h, d] = storage.narrow_bfloat16(mean)
            i += np.int32(cuda.gridsize(1))

    return merge_splits


MERGES: dict[str, object] = {}


def merge_kernel(out_kind: str = "float"):
    """The merge of an out of `out_kind`, made (and registered for PTX) on first use."""
    if out_kind not in MERGES:
        name = f"merge_splits{io_name('float', out_kind)}"
        MERGES[out_kind] = kernel(merge_signatures(out_kind), name=name)(make_merge(out_kind))
    return MERGES[out_kind]


for _kind in storage.IO_KINDS:
    merge_kernel(_kind)
