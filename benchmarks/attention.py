"""Decode attention over cells: work amplification of the two modes, and on a GPU their
bandwidth utilisation (FlashInfer's metric: bytes of visible K/V / kernel time / peak HBM).

    python -m benchmarks.attention              # amplification everywhere; timings on a GPU
    python -m benchmarks.attention --quick

Each case builds a churned table with the host table (sequences prefilled round-robin in
chunks, then clones, rewinds and removals whose holes refill), so a sequence's cells
interleave with others'. The decode step is one token per sequence. `masked` visits every
cell of [0, read_len) for every token; `gathered` visits exactly the cells a token sees.
On a GPU the pool (float16), seq_cells, the step buffer and the step's mask are uploaded
once; each mode is planned once, as the device cache plans it (`attention.plan_attention`,
one split workspace), and its launch (`run_attention`: decode and merge) is timed with CUDA
events; torch's scaled_dot_product_attention runs on the same K/V laid out densely, when
torch with CUDA is installed.
"""

import argparse
from collections.abc import Callable

import numpy as np

from benchmarks.common import print_machine
from numbakv.cache.cuda import IS_SIMULATOR, MODE, cuda, device_info
from numbakv.cache.table import HostTable
from numbakv.core.config import CacheConfig
from numbakv.reference.step import window_mask

N_KV_HEADS, N_HEADS, HEAD_DIM = 8, 32, 128
CHUNK = 64


def build(
    n_seqs: int, tokens: int, window: int, seed: int
) -> tuple[HostTable, CacheConfig, np.ndarray, np.ndarray]:
    """(table, config, seq_ids, positions) of a decode step after churn."""
    rng = np.random.default_rng(seed)
    capacity = int(n_seqs * tokens * 1.5) + 4 * CHUNK
    cfg = CacheConfig(
        n_layers=1, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, capacity=capacity,
        max_width=max(n_seqs, CHUNK), max_seqs=2 * n_seqs + 1, windows=(window,),
        max_seq_len=tokens + CHUNK, dtype="float16",
    )  # fmt: skip
    table = HostTable(cfg)

    def step(seq_ids):
        seq_ids = np.asarray(seq_ids, np.int32)
        return table.claim(table.find_cells(len(seq_ids)), seq_ids)

    def fill(seqs, target):
        while any(table.length(s) < target for s in seqs):
            for s in seqs:  # round robin: the sequences' cells interleave
                n = min(CHUNK, target - table.length(s))
                if n > 0:
                    step([s] * n)

    seqs = [table.seq_new() for _ in range(n_seqs)]
    fill(seqs, tokens)
    for s in rng.choice(seqs, size=max(1, n_seqs // 4), replace=False):  # churn
        table.rewind(s, int(rng.integers(tokens // 2, tokens)))
    for s in rng.choice(seqs, size=max(1, n_seqs // 4), replace=False):
        table.seq_rm(s)
        seqs.remove(s)
        clone_src = seqs[int(rng.integers(len(seqs)))] if seqs else None
        if clone_src is not None and rng.random() < 0.5:
            seqs.append(table.seq_clone(clone_src, table.length(clone_src) // 2)[0])
        else:
            seqs.append(table.seq_new())
    fill(seqs, tokens)
    positions = step(seqs)
    return table, cfg, np.asarray(seqs, np.int32), positions


def visible_cells(table: HostTable, seq_ids: np.ndarray, positions: np.ndarray, window: int) -> int:
    """Cells the decode step's tokens may attend, counted by the mask rule on the table."""
    snap = table.snapshot(table.read_len)
    return int(window_mask(snap.pos, snap.owners, seq_ids, positions, window).sum())


def gathered_cells(positions: np.ndarray, window: int) -> int:
    """Cells the gathered kernel reads: seq_cells[s, lo : p + 1] per token."""
    lo = np.maximum(positions - window + 1, 0) if window else np.zeros_like(positions)
    return int((positions + 1 - lo).sum())


def peak_bandwidth() -> float:
    """Bytes per second the GPU's memory can move (clock x bus width x 2, double data rate)."""
    device = cuda.get_current_device()
    return 2 * device.MEMORY_CLOCK_RATE * 1e3 * device.GLOBAL_MEMORY_BUS_WIDTH / 8


def time_kernel(run: Callable[[], object], repeat: int) -> float:
    """Median seconds of `run()` over `repeat` launches, timed with CUDA events."""
    run()
    times = []
    for _ in range(repeat):
        start, end = cuda.event(), cuda.event()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) / 1e3)
    return float(np.median(times))


def gpu_times(
    table: HostTable, cfg: CacheConfig, seq_ids: np.ndarray, positions: np.ndarray, window: int,
    repeat: int,
) -> dict[str, float]:  # fmt: skip
    """{mode: seconds} of the two modes' planned launches (and torch SDPA when available)."""
    from numbakv.cache.kernels.attention import (
        gathered_max_len,
        plan_attention,
        run_attention,
        split_workspace,
    )
    from numbakv.cache.kernels.masks import launch_write_masks
    from numbakv.cache.kernels.step_buffer import host_step

    rng = np.random.default_rng(0)
    rows, width = table.read_len, len(seq_ids)
    k = cuda.to_device(rng.standard_normal((rows, N_KV_HEADS, HEAD_DIM)).astype(np.float16))
    v = cuda.to_device(rng.standard_normal((rows, N_KV_HEADS, HEAD_DIM)).astype(np.float16))
    seq_cells = np.full((cfg.max_seqs, cfg.max_seq_len), -1, np.int32)
    for s in seq_ids.tolist():
        cells = table.cells_of(s)
        seq_cells[s, : len(cells)] = cells
    snap = table.snapshot(rows)
    cell_pos = np.full(cfg.capacity, -1, np.int32)
    cell_pos[:rows] = snap.pos
    owners = np.zeros((cfg.capacity, cfg.n_owner_words), np.uint64)
    owners[:rows] = snap.owners
    # the step buffer: the tokens' positions and sequences, width and read_len (the
    # attention kernels read no cells: -1)
    step = cuda.to_device(host_step(np.full(width, -1), positions, seq_ids, read_len=rows))
    masks = cuda.device_array((1, width, rows), np.uint8)
    window_d = cuda.to_device(np.array([window], np.int32))
    cell_pos_d, owners_d = cuda.to_device(cell_pos[:rows]), cuda.to_device(owners[:rows])
    launch_write_masks(masks, window_d, cell_pos_d, owners_d, step, width)
    mask = masks[0]
    q = cuda.to_device(rng.standard_normal((width, N_HEADS, HEAD_DIM)).astype(np.float32))
    out = cuda.device_array(q.shape, np.float32)
    scale = np.float32(HEAD_DIM**-0.5)
    seq_cells_d = cuda.to_device(seq_cells)
    # planned as the device cache plans: a token reads at most capacity cells (masked), or
    # its window's or max_seq_len's (gathered)
    gathered_len = gathered_max_len(window, cfg.max_seq_len)
    shape = (width, N_HEADS, N_KV_HEADS, HEAD_DIM)
    runs = {
        "masked": (plan_attention("masked", "float", *shape, cfg.capacity), (mask,)),
        "gathered": (
            plan_attention("gathered", "float", *shape, gathered_len),
            (seq_cells_d, np.int32(window)),
        ),
    }
    max_splits = max(1, *(plan.n_splits for plan, _ in runs.values()))
    workspace = split_workspace(width, N_HEADS, HEAD_DIM, max_splits=max_splits)
    times = {
        mode: time_kernel(
            lambda plan=plan, view=view: run_attention(
                plan, q, k, v, step, view, scale, out, workspace, 0
            ),
            repeat,
        )
        for mode, (plan, view) in runs.items()
    }
    times.update(torch_time(table, seq_ids, k, v, window, repeat))
    return times


def torch_time(
    table: HostTable, seq_ids: np.ndarray, k, v, window: int, repeat: int
) -> dict[str, float]:
    """torch SDPA on the same K/V, one padded dense batch per decode step (if available)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    k_h, v_h = k.copy_to_host(), v.copy_to_host()
    length = max(table.length(s) for s in seq_ids.tolist())
    dense_k = np.zeros((len(seq_ids), N_KV_HEADS, length, HEAD_DIM), np.float16)
    dense_v = np.zeros_like(dense_k)
    for i, s in enumerate(seq_ids.tolist()):
        cells = table.cells_of(s)
        dense_k[i, :, : len(cells)] = k_h[cells].transpose(1, 0, 2)
        dense_v[i, :, : len(cells)] = v_h[cells].transpose(1, 0, 2)
    group = N_HEADS // N_KV_HEADS
    kt = torch.from_numpy(dense_k).cuda().repeat_interleave(group, dim=1)
    vt = torch.from_numpy(dense_v).cuda().repeat_interleave(group, dim=1)
    qt = torch.randn(len(seq_ids), N_HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.float16)

    def run():
        F.scaled_dot_product_attention(qt, kt, vt)

    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return {"torch sdpa": float(np.median(times))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller cases")
    parser.add_argument("--window", type=int, default=0, help="0 = global attention")
    parser.add_argument("--max-cells", type=int, default=1 << 20, help="skip larger cases")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    seq_counts = (1, 8, 64) if args.quick else (1, 8, 64, 256)
    lengths = (512, 2048) if args.quick else (512, 2048, 8192)
    on_gpu = MODE == "gpu"
    print(f"numbakv attention benchmark: {device_info()['name']}")
    print_machine("numba")
    print(f"K/V float16, n_heads {N_HEADS}, n_kv_heads {N_KV_HEADS}, head_dim {HEAD_DIM}, "
          f"window {args.window or 'global'}; decode step = one token per sequence")  # fmt: skip
    if on_gpu:
        print(f"peak HBM bandwidth {peak_bandwidth() / 1e12:.2f} TB/s")
    else:
        where = "the simulator" if IS_SIMULATOR else "compile-only mode"
        print(f"no GPU: amplification only (kernel timings need a GPU; {where} does not time)")
    header = (
        f"{'seqs':>5} {'tokens':>6} {'read_len':>8} {'visible':>9} {'masked x':>9} "
        f"{'gathered x':>10}"
    )
    if on_gpu:
        header += "  masked us  util  gathered us  util  sdpa us  util"
    print(header)
    for n_seqs in seq_counts:
        for tokens in lengths:
            if n_seqs * tokens > args.max_cells:
                continue
            table, cfg, seq_ids, positions = build(n_seqs, tokens, args.window, seed=n_seqs)
            total = visible_cells(table, seq_ids, positions, args.window)
            masked_x = len(seq_ids) * table.read_len / total
            gathered_x = gathered_cells(positions, args.window) / total
            line = (f"{len(seq_ids):>5} {tokens:>6} {table.read_len:>8} {total:>9} "
                    f"{masked_x:>9.2f} {gathered_x:>10.2f}")  # fmt: skip
            if on_gpu:
                times = gpu_times(table, cfg, seq_ids, positions, args.window, args.repeat)
                nbytes = 2 * total * N_KV_HEADS * HEAD_DIM * 2  # K and V, float16
                for mode in ("masked", "gathered", "torch sdpa"):
                    if mode in times:
                        util = nbytes / times[mode] / peak_bandwidth()
                        line += f"  {1e6 * times[mode]:>9.1f} {util:>5.2f}"
            print(line)


if __name__ == "__main__":
    main()
