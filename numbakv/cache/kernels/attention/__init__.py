"""Attention over the cell pool (docs/contract.md §5): masked and gathered, each in decode
and prefill shape.

For each token t < width and query head h (KV head h // (n_heads // n_kv_heads)):

    out[t, h] = softmax_c(q[t, h] · K[c] * scale) · V[c]      over the cells t sees

*masked* sees the cells c < read_len with mask[t, c] == 1; *gathered* sees the cells
seq_cells[s, lo : p + 1] of its own sequence s at position p (lo = max(0, p - W + 1) for a
window W > 0, else 0). Everything is float32 (K/V stored as float16 are widened on load);
the softmax is online, in one pass (a running max m and sum l per query row, the
accumulator rescaled by exp(m_old - m_new) whenever m grows). A row that sees nothing
gives exactly 0. Cells a row does not see may hold NaN or inf: their K/V are never read
into a sum (loads and products are selected, never multiplied by a zero weight), the mask
is read only at rows < width and columns < read_len, and seq_cells only inside a token's
own range.

The modules, by role:

    tiles    the prefill tiles: geometry, row reductions, scores, online softmax, p·V
    staging  q and K/V tiles into shared memory (wide loads), the prefill's output written
    views    which cells a token sees: the masked and the gathered view, the only difference
             between the two modes
    lanes    a lane's 8 elements of a K/V row per storage kind (wide loads, `kernels.wide`)
    decode   one token x one split per block, a warp per chunk of query heads, registers and
             shuffles; partials merged by `merge` when the grid splits
    prefill  a tile of query rows per block, each K/V tile loaded once for all of them,
             register tiles of scores and outputs (FlashAttention-2 on CUDA cores)
    merge    the decode splits combined
    launch   the plan (shape rule, grid, splits), the run, the checks and the two launchers
"""

from numbakv.cache.kernels.attention.decode import MIN_SPLIT_CELLS, cost_specialisations
from numbakv.cache.kernels.attention.launch import (
    DECODE_MAX_WIDTH,
    MAX_SPLITS,
    SPLIT_TARGET_BLOCKS_PER_SM,
    AttentionPlan,
    choose_splits,
    decode_width_limit,
    gathered_max_len,
    is_decode_shape,
    launch_attend_gathered,
    launch_attend_masked,
    plan_attention,
    pools_are_wide,
    run_attention,
    split_workspace,
)
from numbakv.cache.kernels.attention.tiles import HEAD_DIM_MAX, PREFILL_ROWS, PREFILL_TILE, STORAGE

__all__ = [
    "DECODE_MAX_WIDTH",
    "HEAD_DIM_MAX",
    "MAX_SPLITS",
    "MIN_SPLIT_CELLS",
    "PREFILL_ROWS",
    "PREFILL_TILE",
    "SPLIT_TARGET_BLOCKS_PER_SM",
    "STORAGE",
    "AttentionPlan",
    "choose_splits",
    "cost_specialisations",
    "decode_width_limit",
    "gathered_max_len",
    "is_decode_shape",
    "launch_attend_gathered",
    "launch_attend_masked",
    "plan_attention",
    "pools_are_wide",
    "run_attention",
    "split_workspace",
]
