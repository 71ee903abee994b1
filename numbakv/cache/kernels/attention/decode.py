"""The decode-shaped attention kernels: registers and warp shuffles, one read of K/V per group.

A flat grid of (token, split, head block) items; a block of up to MAX_WARPS warps takes one
token, one split of its cells (`split_range`) and a chunk of its group's heads a warp. Each
lane owns 8 dimensions (`lanes`) of a row; a warp's row groups (32 // lanes of a row) take
ROW_HEADS heads each, as many as the group needs (`warp_layout`), and the rest walk other
cells beside them. A 16-byte load of K and of V serves every head of its row group: the
lanes' partial scores meet by xor shuffles, each lane adds p · V to its own dimensions, q
and the accumulators stay in registers, TILE cells a step (their loads before their math),
an online softmax per row group and no barrier in the loop. At the end the cell groups merge
by shuffles, the warps of a chunk through shared memory; the block writes out when the plan
has one split, else the split's partial (acc, m, l) for `merge.merge_splits`.

The softmax follows docs/contract.md §5 to the special values: the running max keeps a NaN;
a row whose max is not finite once it saw a cell gives NaN; a seen cell of weight 0 still
adds 0 · V; a row that saw nothing gives exactly 0; the accumulator is the weighted mean of
the V rows seen (weights normalised per tile), so finite V never overflows. Scores are in
base 2 (`wide.exp2`). Index arithmetic is int32 (`wide.div`, no range with a step), head_dim
and the tile sizes are compile-time constants; cells a token does not see are never loaded.
"""

import math

import numpy as np

from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels import device_function, kernel, quant, storage, wide
from numbakv.cache.kernels.attention import lanes, tiles, views
from numbakv.cache.kernels.attention.lanes import VEC
from numbakv.cache.kernels.attention.tiles import PARTIALS
from numbakv.cache.kernels.placement import KV_SCALES, PAIRS, io_name, kind_name
from numbakv.cache.kernels.step_buffer import SCALARS, STEP, WIDTH
from numbakv.core.formats import head_bytes

ROW_HEADS = 2  # query heads per row group: 2 x TILE scores a step, one `wide.lane_sum4`
MAX_WARPS = 4  # warps per block, at most: the kernel takes its count from the launch
WARPS = 1 if IS_SIMULATOR else MAX_WARPS  # ... as planned (a simulated warp is 32 threads)
THREADS = 32 * WARPS
TILE = 2  # cells per row group per step of its loop
BLOCKS_PER_SM = 4  # resident blocks asked of the compiler: 16 warps, at most 128 registers
MIN_SPLIT_CELLS = 64  # a split's cells, at least (when there is more than one)
NEG_INF = np.float32(-np.inf)
POS_INF = np.float32(np.inf)
NAN = np.float32(np.nan)
EMPTY = np.float32(-1.0)  # l of a state that has seen no cell
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
LOG2E = np.float32(1.4426950408889634)


def signatures(view: str, pools: list[tuple[str, str]], q: str, out: str) -> list[str]:
    """q, k_pool, v_pool, kv_scales, step, view, scale, n_splits, part_acc, part_m, part_l,
    out; per (K pool dtype, V pool dtype)."""
    return [
        f"void({q}, {ks}[:, :, ::1], {vs}[:, :, ::1], {KV_SCALES}, {STEP}, {view}, float32, "
        f"int32, {PARTIALS}, {out})"
        for ks, vs in pools
    ]


@device_function
def split_range(lo, hi, split, n_splits):
    """[start, end) of split `split` of [lo, hi): near-equal parts of at least MIN_SPLIT_CELLS
    cells, at most n_splits of them; the splits past those get an empty range."""
    n_used = min(n_splits, max(np.int32(1), np.int32((hi - lo) // np.int32(MIN_SPLIT_CELLS))))
    size = wide.div(hi - lo + n_used - np.int32(1), n_used)
    start = min(hi, np.int32(lo + split * size))
    return start, min(hi, np.int32(start + size))


@device_function
def elements(stride, itemsize):
    """A byte stride in elements, as int32."""
    return wide.div(np.int32(stride), np.int32(itemsize))


@device_function
def merge_state(m1, l1, m2, l2):
    """(m, l, f1, f2) of two softmax states merged: acc = f1 · acc1 + f2 · acc2 (a state
    that saw nothing, l = EMPTY, has acc = 0 and weight 0, so the sum is exact); a max that
    is not finite keeps the sum (the output is NaN)."""
    if l2 == EMPTY:
        return m1, l1, ONE, ZERO
    if l1 == EMPTY:
        return m2, l2, ZERO, ONE
    m = m1 if (m1 > m2 or m1 != m1) else m2  # a max that keeps a NaN
    if not NEG_INF < m < POS_INF:
        return m, l1 + l2, ONE, ZERO
    w1 = l1 * math.exp2(m1 - m)
    w2 = l2 * math.exp2(m2 - m)
    total = w1 + w2
    return m, total, w1 / total, w2 / total


def warp_layout(head_dim: int, group: int) -> tuple[int, int]:
    """(heads of a warp, its cell groups) for a GQA `group`: the warp's row groups (32 //
    lanes of a row) take heads, ROW_HEADS each, as many as the group fills (a power of two),
    and the rest walk other cells beside them (each cell group its own cells)."""
    _, n_rows = lanes.lane_dims(head_dim)
    head_rows = 1
    while head_rows < n_rows and head_rows * ROW_HEADS < group:
        head_rows *= 2
    return head_rows * ROW_HEADS, n_rows // head_rows


def make_decode(token, cell, k_loader, v_loader, q_code, out_code, head_dim, warp_heads):
    """The decode kernel of one view (`views`: `token` and `cell`), the lane loaders of its
    K and V pools (`lanes.make_loader`: load, value), q and out of codes q_code and
    out_code (`storage.IO_KINDS`), `head_dim` and `warp_heads` heads a warp
    (`warp_layout`)."""
    load_k, k_value = k_loader
    load_v, v_value = v_loader
    n_lanes, n_rows = lanes.lane_dims(head_dim)
    dim, lane_count, vec = np.int32(head_dim), np.int32(n_lanes), np.int32(VEC)
    row_heads = np.int32(ROW_HEADS)
    chunk_heads = warp_heads  # a warp's chunk of query heads
    head_rows = warp_heads // ROW_HEADS  # its row groups that take heads
    cell_groups = np.int32(n_rows // head_rows)  # ... side by side, on cells of their own
    head_lanes = np.int32(n_lanes * head_rows)  # lanes of one cell group
    warp_heads = np.int32(warp_heads)
    padded = n_lanes * VEC  # a row's elements over its lanes (head_dim and zeros)
    # closure booleans in conditions: numba compiles only the branch of the kinds at hand
    is_q_bf16, is_out_bf16 = q_code == quant.BFLOAT16, out_code == quant.BFLOAT16

    def attend_decode(q, k_pool, v_pool, kv_scales, step, view, scale, n_splits,
                      part_acc, part_m, part_l, out):  # fmt: skip
        """Attention of one token over one split of the cells it sees, per block."""
        # q, out: [>= width, n_heads, head_dim]  k_pool, v_pool: [rows, n_kv_heads, row_width]
        # part_acc: [>= width, n_heads, >= n_splits, head_dim]  part_m, part_l: [.., .., ..]
        acc_s = cuda.shared.array((MAX_WARPS, chunk_heads, padded), np.float32)
        ml_s = cuda.shared.array((2, MAX_WARPS, chunk_heads), np.float32)
        q_r = cuda.local.array((ROW_HEADS, VEC), np.float32)
        acc = cuda.local.array((ROW_HEADS, VEC), np.float32)
        m = cuda.local.array(ROW_HEADS, np.float32)
        total = cuda.local.array(ROW_HEADS, np.float32)
        thread = np.int32(cuda.threadIdx.x)
        lane, warp = thread & np.int32(31), thread >> np.int32(5)
        warps = min(np.int32(cuda.blockDim.x) >> np.int32(5), np.int32(MAX_WARPS))
        d0 = (lane % lane_count) * vec  # this lane's dimensions [d0, d0 + 8)
        row = lane // lane_count
        slot = (row % np.int32(head_rows)) * row_heads  # its row group's first head
        walker_in_warp = row // np.int32(head_rows)  # its cell group
        n_kv = np.int32(k_pool.shape[1])
        group = wide.div(np.int32(q.shape[1]), n_kv)
        n_chunks = wide.div(group + warp_heads - np.int32(1), warp_heads)
        per_block = min(n_chunks, warps)  # chunks of one block
        blocks_per_kv = wide.div(n_chunks + per_block - np.int32(1), per_block)
        n_subsets = wide.div(warps, per_block)  # warps of one chunk: each walks its own cells
        subset = wide.div(warp, per_block)
        rows = np.int32(k_pool.shape[0])
        q_head = elements(q.strides[1], q.itemsize)  # between heads
        k_head = elements(k_pool.strides[1], k_pool.itemsize)
        v_head = elements(v_pool.strides[1], v_pool.itemsize)
        # the writes' strides, read back from shared memory after the loop's barrier: the
        # compiler cannot hoist their address arithmetic into registers held across the loop
        layout_s = cuda.shared.array(3, np.int32)
        if thread == 0:
            layout_s[0] = elements(out.strides[1], out.itemsize)
            layout_s[1] = np.int32(part_acc.shape[2] * head_dim)  # the workspace is C-contiguous
            layout_s[2] = np.int32(part_m.shape[2])
        scale2 = scale * LOG2E  # scores in base 2: exp2 is one instruction
        width = min(step[SCALARS, WIDTH], np.int32(q.shape[0]), np.int32(out.shape[0]))
        n_head_blocks = n_kv * blocks_per_kv
        n_items = width * n_splits * n_head_blocks
        # one flat grid-stride loop over (token, split, head block), head blocks adjacent (they
        # read the same cells): one counter held across the cell loop, not three
        item = np.int32(cuda.blockIdx.x)
        while item < n_items:  # (a range with a step divides in 64 bits to count)
            t = wide.div(item, n_splits * n_head_blocks)
            rest = item - t * (n_splits * n_head_blocks)
            split = wide.div(rest, n_head_blocks)
            hy = rest - split * n_head_blocks
            key, lo, hi = token(view, step, t)
            kv_head = wide.div(hy, blocks_per_kv)
            chunk = (hy - kv_head * blocks_per_kv) * per_block + warp - subset * per_block
            g0 = chunk * warp_heads + slot  # the row group's first head in the group
            n_here = max(np.int32(0), min(row_heads, group - g0))
            if subset >= n_subsets:  # a warp left over when chunks do not divide the warps
                n_here = np.int32(0)
            h0 = kv_head * group + g0
            k_scale, v_scale = kv_scales[0, kv_head], kv_scales[1, kv_head]
            k_at, v_at = kv_head * k_head, kv_head * v_head
            for g in range(ROW_HEADS):
                at = np.int32((h0 + g) * q_head + d0)
                for i in range(VEC):
                    x = ZERO
                    if g < n_here and d0 + i < dim:
                        if is_q_bf16:
                            x = quant.widen_bfloat16(wide.item(q, t, np.int32(at + i)))
                        else:
                            x = np.float32(wide.item(q, t, np.int32(at + i)))
                    q_r[g, i] = x
            start, end = split_range(lo, hi, split, n_splits)
            for g in range(ROW_HEADS):
                m[g] = NEG_INF
                total[g] = EMPTY
                for i in range(VEC):
                    acc[g, i] = ZERO
            is_walking = subset < n_subsets
            n_walkers = n_subsets * cell_groups  # the chunk's cell groups, each its own cells
            walker = subset * cell_groups + walker_in_warp
            base = start  # every walker steps together: shuffles need the whole warp
            while base < end:
                # the tile's cells and rows, every load before any math
                j = base + walker
                c0 = np.int32(-1)
                c1 = np.int32(-1)
                if is_walking and j < end:
                    c0 = cell(view, t, key, j, rows)
                    if np.int32(j + n_walkers) < end:
                        c1 = cell(view, t, key, j + n_walkers, rows)
                r0 = c0 if d0 < dim else np.int32(-1)  # lanes past head_dim read
                r1 = c1 if d0 < dim else np.int32(-1)  # nothing
                k0, ks0 = load_k(k_pool, r0, k_at, d0, k_scale)
                v0, vs0 = load_v(v_pool, r0, v_at, d0, v_scale)
                k1, ks1 = load_k(k_pool, r1, k_at, d0, k_scale)
                v1, vs1 = load_v(v_pool, r1, v_at, d0, v_scale)
                # the row's lanes meet: every lane gets the dot products of both heads
                d00, d01, d10, d11 = ZERO, ZERO, ZERO, ZERO
                for i in range(VEC):
                    d00 += q_r[0, i] * k_value(k0, i)
                    d01 += q_r[0, i] * k_value(k1, i)
                    d10 += q_r[1, i] * k_value(k0, i)
                    d11 += q_r[1, i] * k_value(k1, i)
                d00, d01, d10, d11 = wide.lane_sum4(d00, d01, d10, d11, lane_count)
                for g in range(ROW_HEADS):
                    dot0 = d00 if g == 0 else d10
                    dot1 = d01 if g == 0 else d11
                    # the head's online softmax over the tile
                    s0 = dot0 * ks0 * scale2
                    s1 = dot1 * ks1 * scale2
                    m_old = m[g]
                    m_new = m_old
                    if c0 >= 0 and (s0 > m_new or s0 != s0):
                        m_new = s0  # a max that keeps a NaN
                    if c1 >= 0 and (s1 > m_new or s1 != s1):
                        m_new = s1
                    is_usable = NEG_INF < m_new < POS_INF
                    # exp2 of differences <= 0 (of finite maxima), then selected
                    p0 = wide.exp2(s0 - m_new if is_usable else ZERO)
                    p1 = wide.exp2(s1 - m_new if is_usable else ZERO)
                    alpha = wide.exp2(m_old - m_new if is_usable else ZERO)
                    p0 = p0 if (c0 >= 0 and is_usable and s0 > NEG_INF) else ZERO
                    p1 = p1 if (c1 >= 0 and is_usable and s1 > NEG_INF) else ZERO
                    alpha = alpha if (is_usable and m_old < m_new) else ONE
                    m[g] = m_new
                    kept = max(total[g], ZERO) * alpha
                    l_new = kept + p0 + p1
                    inv = wide.rcp(l_new) if is_usable else ONE  # l_new >= 1 then
                    keep = kept * inv if is_usable else ONE
                    if c0 >= 0 or c1 >= 0:
                        total[g] = l_new
                    w0 = p0 * inv * vs0
                    w1 = p1 * inv * vs1
                    for i in range(VEC):  # a cell not seen has w = 0 and V = 0 unread
                        a = acc[g, i] * keep + w0 * v_value(v0, i)
                        acc[g, i] = a + w1 * v_value(v1, i)
                base += n_walkers * np.int32(TILE)
            # the warp's cell groups merge (xor shuffles), then the chunk's subsets
            for g in range(ROW_HEADS):
                offset = head_lanes
                while offset < np.int32(32):
                    other = wide.xor_swap10(
                        (m[g], total[g], acc[g, 0], acc[g, 1], acc[g, 2], acc[g, 3], acc[g, 4],
                         acc[g, 5], acc[g, 6], acc[g, 7]), offset,
                    )  # fmt: skip
                    mm, ll, f1, f2 = merge_state(m[g], total[g], other[0], other[1])
                    for i in range(VEC):
                        acc[g, i] = f1 * acc[g, i] + f2 * other[2 + i]
                    m[g] = mm
                    total[g] = ll
                    offset <<= np.int32(1)
            for g in range(ROW_HEADS):
                for i in range(VEC):
                    acc_s[warp, slot + g, d0 + i] = acc[g, i]
                ml_s[0, warp, slot + g] = m[g]
                ml_s[1, warp, slot + g] = total[g]
            cuda.syncthreads()
            if subset == 0:
                for g in range(ROW_HEADS):
                    for other in range(np.int32(1), n_subsets):
                        w = other * per_block + warp
                        mm, ll, f1, f2 = merge_state(
                            m[g], total[g], ml_s[0, w, slot + g], ml_s[1, w, slot + g]
                        )
                        for i in range(VEC):
                            acc[g, i] = f1 * acc[g, i] + f2 * acc_s[w, slot + g, d0 + i]
                        m[g] = mm
                        total[g] = ll
                    if g < n_here and d0 < dim:
                        h = h0 + g
                        out_head, part_head, n_split_max = (layout_s[0], layout_s[1], layout_s[2])
                        if n_splits == 1:
                            is_finite = NEG_INF < m[g] < POS_INF
                            at = np.int32(h * out_head + d0)
                            for i in range(VEC):
                                value = acc[g, i]
                                if total[g] == EMPTY:
                                    value = ZERO
                                elif not is_finite:
                                    value = NAN
                                if d0 + i < dim:
                                    if is_out_bf16:
                                        value = storage.narrow_bfloat16(value)
                                    wide.put(out, t, np.int32(at + i), value)
                        else:
                            at = np.int32(h * part_head + split * dim + d0)
                            for i in range(VEC):
                                if d0 + i < dim:
                                    wide.put(part_acc, t, np.int32(at + i), acc[g, i])
                            at = np.int32(h * n_split_max + split)
                            wide.put(part_m, t, at, m[g])
                            wide.put(part_l, t, at, total[g])
            cuda.syncthreads()
            item += np.int32(cuda.gridDim.x)

    return attend_decode


def head_blocks(n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """Head blocks of a decode grid: per KV head, its group's chunks of one warp's heads
    (`warp_layout`) in blocks of at most WARPS chunks."""
    group = n_heads // n_kv_heads
    warp_heads, _ = warp_layout(head_dim, group)
    n_chunks = -(-group // warp_heads)
    return n_kv_heads * -(-n_chunks // min(n_chunks, WARPS))


_built: dict = {}
_served: dict[str, list[int]] = {}  # kernel name -> served_bytes per signature


def served_bytes(name: str, index: int) -> int | None:
    """The distinct K/V bytes one step of a warp's cell loop serves in signature `index` of
    kernel `name`: TILE cells of one KV head per cell group (the row groups of a cell group
    read the same rows), for a GQA group that one warp holds; the measure
    `benchmarks.kernel_cost` divides the loop's instructions by. (A group larger than a
    warp's heads, e.g. 4 at head_dim 256, has two warps read each row: twice the cost.)"""
    sizes = _served.get(name)
    return None if sizes is None else sizes[index]


def _format(kind: str, dtype: str) -> str:
    """The storage format (`numbakv.core.formats`) of a pool of `kind` and `dtype`."""
    return dtype if kind == "float" else kind


def KERNELS(mode: str, k_kind: str, v_kind: str, q_kind: str = "float", out_kind: str = "float",
            head_dim: int = 128, is_wide: bool = True, group: int = 4):  # fmt: skip
    """The decode kernel of `mode` ("masked" or "gathered") over pools of (k_kind, v_kind)
    for q and out of (q_kind, out_kind) (`storage.IO_KINDS`), `head_dim` and a GQA `group`
    (which sets a warp's heads, `warp_layout`), with wide loads (`lanes.is_wide`) or element
    loads; made and registered on first use, as
    attend_{mode}_decode{kinds}{io}_d{head_dim}_h{heads a warp}[_narrow]."""
    warp_heads, cell_groups = warp_layout(head_dim, group)
    key = (mode, k_kind, v_kind, q_kind, out_kind, head_dim, is_wide, warp_heads)
    if key not in _built:
        view, token, cell = views.CELL_VIEWS[mode]
        name = (f"attend_{mode}_decode{kind_name(k_kind, v_kind)}{io_name(q_kind, out_kind)}"
                f"_d{head_dim}_h{warp_heads}{'' if is_wide else '_narrow'}")  # fmt: skip
        pools, sigs = tiles.kernel_signatures(signatures, view, k_kind, v_kind, q_kind, out_kind)
        body = make_decode(
            token, cell, lanes.make_loader(k_kind, head_dim, is_wide),
            lanes.make_loader(v_kind, head_dim, is_wide), storage.IO_KINDS[q_kind][0],
            storage.IO_KINDS[out_kind][0], head_dim, warp_heads,
        )  # fmt: skip
        # wide kernels are held to BLOCKS_PER_SM; element loads keep 8 floats a row part and
        # would spill there
        bounds = (THREADS, BLOCKS_PER_SM) if is_wide else None
        _built[key] = kernel(sigs, name=name, launch_bounds=bounds)(body)
        _served[name] = [
            TILE * cell_groups * (head_bytes(_format(k_kind, ks), head_dim)
                    + head_bytes(_format(v_kind, vs), head_dim))
            for ks, vs in pools
        ]  # fmt: skip
    return _built[key]


def cost_specialisations() -> None:
    """Makes the kernels `benchmarks.kernel_cost` reads beside those made at import, over
    float pools, gathered: head_dim 64 and 256 at GQA 4 (at 256 a warp holds 2 heads),
    and head_dim 128 at GQA 1, 2 and 8."""
    for head_dim in (64, 256):
        KERNELS("gathered", "float", "float", head_dim=head_dim)
    for group in (1, 2, 8):
        KERNELS("gathered", "float", "float", group=group)


# made at import, so that the suite compiles them to PTX: every kind (as K and V) in both
# modes at head_dim 128, bfloat16 q and out, and the element loads (head_dim 40)
for _mode in views.CELL_VIEWS:
    for _pair in PAIRS:
        KERNELS(_mode, *_pair)
KERNELS("gathered", "float", "float", "bfloat16", "bfloat16")
KERNELS("gathered", "float", "float", head_dim=40, is_wide=False)
