"""Memory bandwidth in `python -m benchmarks.gpu_check`: a device-to-device copy's, and
decode attention's held to it, every output checked against numbakv.reference's solo
oracle and compared with torch's scaled_dot_product_attention where torch has CUDA."""

import functools
import time

import numpy as np

from benchmarks.gpu_check.fill import RandomKV, prefilled_cache
from benchmarks.gpu_check.run import ERR_BOUND, Run
from benchmarks.gpu_check.torch_sdpa import dense_kv, torch_sdpa


def part_copy(run: Run) -> None:
    """A device-to-device copy on one stream: (bytes read + written) / time."""
    cuda, n_bytes = run.device.cuda, run.shapes.copy_bytes
    src, dst = cuda.device_array(n_bytes, np.uint8), cuda.device_array(n_bytes, np.uint8)
    stream = cuda.stream()

    def copy():
        dst.copy_to_device(src, stream=stream)

    copy()
    seconds = run.device.time_each(copy, stream, repeat=3 if run.is_sim else 10)
    run.copy_bandwidth = 2 * n_bytes / seconds
    run.add(
        "copy", f"device to device {n_bytes / 2**20:g} MiB (read + write)",
        us=f"{seconds * 1e6:.1f}", **{"GB/s": f"{run.copy_bandwidth / 1e9:.4g}"},
    )  # fmt: skip


def part_attention(run: Run) -> None:
    """Every (batch, cells) case of the run's shapes."""
    for batch, n_cells in run.shapes.cases:
        attention_case(run, batch, n_cells)


def attention_case(run: Run, batch: int, n_cells: int) -> None:
    """`batch` sequences of n_cells - 1 positions, then a decode step (each sees n_cells
    cells), timed and checked for every GQA group and both modes."""
    s, cuda = run.shapes, run.device.cuda
    started = time.perf_counter()
    cache, step, seqs, kv = build_decode_step(run, batch, n_cells)
    print(f"  {batch} x {n_cells} cells built in {time.perf_counter() - started:.1f} s")
    dense = dense_kv(run, kv, seqs)
    visible = batch * n_cells * s.n_kv_heads * s.head_dim * 2 * 2  # K and V, float16
    rng = np.random.default_rng(batch)
    for group in s.groups:
        n_heads = s.n_kv_heads * group
        q_h = rng.standard_normal((batch, n_heads, s.head_dim), dtype=np.float32)
        q_d = cuda.to_device(q_h)
        out_d = cuda.device_array(q_h.shape, np.float32)
        expect = solo_outputs(kv, seqs, q_h, n_cells, check_tokens(batch))
        sdpa = torch_sdpa(run, dense, q_h)
        for mode in ("gathered", "masked"):
            out_d.copy_to_device(np.full(q_h.shape, np.nan, np.float32))  # unwritten: NaN
            attend = functools.partial(cache.attend, 0, q_d, mode=mode, out=out_d)
            if attend() is not out_d:  # the first launch also writes the mask when masked
                raise AssertionError("attend(out=out) did not return out")
            seconds = run.device.time_each(attend, step.stream, s.repeat)
            got = out_d.copy_to_host()
            err = float(np.max([np.abs(got[t] - e).max() for t, e in expect.items()]))  # NaN stays
            add_attention_row(run, mode, batch, n_cells, group, seconds, visible, err, sdpa, got)
    print(f"  {batch} x {n_cells} cells done in {time.perf_counter() - started:.1f} s")


def build_decode_step(run: Run, batch: int, n_cells: int) -> tuple:
    """(cache, step, sequences, K/V): a cache of one layer whose sequences hold n_cells - 1
    positions and a decode step of one token per sequence, prepared and written (each token
    sees n_cells cells)."""
    s = run.shapes
    cache, seqs, kv, n_steps = prefilled_cache(
        run, n_layers=1, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, batch=batch,
        max_seq_len=n_cells, history=n_cells - 1, seed=batch,
    )  # fmt: skip
    print(f"  {batch} x {n_cells - 1} positions in {n_steps} prefill steps")
    cache.declare_step(seqs)
    step = cache.prepare_step()
    k, v = kv.take(np.asarray(seqs, np.int32))
    cache.write(0, k, v)
    step.stream.synchronize()
    return cache, step, seqs, kv


def check_tokens(batch: int) -> list[int]:
    """The tokens whose outputs are checked against the solo oracle."""
    return sorted({0, batch // 2, batch - 1})


def solo_outputs(
    kv: RandomKV, seqs: list[int], q_h: np.ndarray, n_cells: int, tokens: list[int]
) -> dict[int, np.ndarray]:
    """token -> [n_heads, head_dim] float32: numbakv.reference's solo attention of the token
    over its own sequence's history, with no cells involved."""
    from numbakv.reference import solo_attention

    expect = {}
    for t in tokens:
        k_hist, v_hist = kv.history(seqs[t])
        assert len(k_hist) == n_cells, (len(k_hist), n_cells)
        expect[t] = solo_attention(q_h[t : t + 1], k_hist, v_hist, [n_cells - 1], window=0)[0]
    return expect


def add_attention_row(
    run: Run, mode: str, batch: int, n_cells: int, group: int, seconds: float, visible: int,
    err: float, sdpa: tuple | str, got: np.ndarray,
) -> None:  # fmt: skip
    """The table's row of one attention case: its time, bandwidth, error and torch's."""
    rate = visible / seconds
    if isinstance(sdpa, str):  # why torch did not run
        sdpa_us, sdpa_err = sdpa, "-"
    else:
        sdpa_us, sdpa_err = f"{sdpa[0] * 1e6:.1f}", f"{float(np.abs(sdpa[1] - got).max()):.1e}"
    cells = {
        "us": f"{seconds * 1e6:.1f}",
        "GB/s": f"{rate / 1e9:.4g}",
        "of copy": f"{rate / run.copy_bandwidth:.3g}" if run.copy_bandwidth else "-",
        "sdpa us": sdpa_us,
        "sdpa err": sdpa_err,
        "err": f"{err:.1e}",
    }
    result = "ok" if err <= ERR_BOUND else f"FAIL: err > {ERR_BOUND}"
    run.add("attention", f"{mode} {batch}x{n_cells} gqa{group}", result=result, **cells)
