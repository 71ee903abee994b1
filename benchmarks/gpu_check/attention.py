"""Memory bandwidth and FLOP rate in `python -m benchmarks.gpu_check`: a device-to-device
copy's bandwidth, decode attention per storage format held to it, and a prefill step's FLOP
rate (`prefill`); every output checked against numbakv.reference's solo oracle over the K/V
as the cache stores them, beside torch's scaled_dot_product_attention where torch has CUDA
and the ceiling benchmarks.kernel_cost reads from the machine code of the kernel that ran
(`estimate`)."""

import functools
import sys
import time
import traceback

import numpy as np

from benchmarks.gpu_check.estimate import Estimates, attention_flop
from benchmarks.gpu_check.fill import RandomKV, prefilled_cache
from benchmarks.gpu_check.prefill import prefill_case
from benchmarks.gpu_check.run import ERR_BOUND, LONG_CASE_S, Run
from benchmarks.gpu_check.torch_sdpa import SDPA_FORMATS, dense_kv, sdpa_cells, torch_sdpa
from numbakv.core.formats import head_bytes


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
    """Every decode case of the run's shapes in each of its storage formats, then the
    prefill step; a case that fails is a FAIL row and the next one runs. The kernel_cost
    estimates are filled in last."""
    estimates = Estimates(run)
    try:
        for i, (batch, n_cells, formats) in enumerate(run.shapes.cases):
            if i and run.time_left() < LONG_CASE_S:
                run.add("attention", f"{batch}x{n_cells} {', '.join(formats)}",
                        result=f"skipped: under {LONG_CASE_S} s left")  # fmt: skip
                continue
            for fmt in formats:
                guarded(run, f"{fmt} {batch}x{n_cells}", decode_case, run, estimates, batch,
                        n_cells, fmt)  # fmt: skip
        n_seqs, new, group = run.shapes.prefill
        guarded(run, f"prefill {n_seqs}x{new} gqa{group}", prefill_case, run, estimates)
    finally:
        estimates.fill(run)


def guarded(run: Run, case: str, fn, *args) -> None:
    """fn(*args); what it raises is printed and becomes the FAIL row of `case`."""
    try:
        fn(*args)
    except Exception as error:
        traceback.print_exc(file=sys.stdout)  # in order with the rest
        run.add("attention", case, result=f"FAIL: {type(error).__name__}: {error}")


def decode_case(run: Run, estimates: Estimates, batch: int, n_cells: int, fmt: str) -> None:
    """`batch` sequences of n_cells - 1 positions in a cache of storage format `fmt`, then a
    decode step (each token sees n_cells cells), timed and checked for every GQA group and
    mode (masked only for the shapes' masked_formats)."""
    s, cuda = run.shapes, run.device.cuda
    started = time.perf_counter()
    modes = ("gathered", "masked") if fmt in s.masked_formats else ("gathered",)
    cache, seqs, kv, n_steps = prefilled_cache(
        run, n_layers=1, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, batch=batch,
        max_seq_len=n_cells, history=n_cells - 1, seed=batch, dtype=fmt,
    )  # fmt: skip
    rng = np.random.default_rng(batch)
    q_h = {g: rng.standard_normal((batch, s.n_kv_heads * g, s.head_dim), dtype=np.float32)
           for g in s.groups}  # fmt: skip
    q_d = {g: cuda.to_device(q) for g, q in q_h.items()}
    out_d = {g: cuda.device_array(q.shape, np.float32) for g, q in q_h.items()}
    calls = [(g, mode) for g in s.groups for mode in modes]
    step, names = first_step(cache, seqs, kv, calls, q_d, out_d)
    estimates.want(list(names.values()))
    print(f"  {fmt}: {batch} x {n_cells - 1} positions in {n_steps} prefill steps, the decode "
          f"step written in {time.perf_counter() - started:.1f} s; kernels: "
          + ", ".join(f"gqa{g} {m} {names[g, m]}" for g, m in calls))  # fmt: skip
    dense = dense_kv(run, kv, seqs) if fmt in SDPA_FORMATS else "-"
    stored = stored_histories(kv, seqs, check_tokens(batch), fmt, s.n_kv_heads)
    kv_bytes = batch * n_cells * s.n_kv_heads * head_bytes(fmt, s.head_dim) * 2  # K and V
    for group in s.groups:
        n_heads = s.n_kv_heads * group
        expect = solo_outputs(stored, q_h[group], n_cells)
        sdpa = torch_sdpa(run, dense, q_h[group], fmt)
        out = out_d[group]
        for mode in modes:
            out.copy_to_device(np.full(out.shape, np.nan, np.float32))  # unwritten: NaN
            attend = functools.partial(cache.attend, 0, q_d[group], mode=mode, out=out)
            seconds = run.device.time_each(attend, step.stream, s.repeat)
            got = out.copy_to_host()
            err = float(np.max([np.abs(got[t] - e).max() for t, e in expect.items()]))  # NaN stays
            row = add_decode_row(run, f"{mode} {fmt} {batch}x{n_cells} gqa{group}", seconds,
                                 kv_bytes, err, sdpa, got)  # fmt: skip
            flop = attention_flop(n_heads, s.head_dim, batch * n_cells)
            estimates.attach(row, names[group, mode], fmt, "TB/s", flop / kv_bytes)
    print(f"  {fmt}: {batch} x {n_cells} cells done in {time.perf_counter() - started:.1f} s")


def first_step(cache, seqs: list[int], kv: RandomKV, calls: list[tuple[int, str]], q_d: dict,
               out_d: dict) -> tuple:  # fmt: skip
    """(step, {(group, mode): the attention kernel it launched}): a decode step of one token
    per sequence declared and prepared, then its write and one attend per (group, mode) of
    `calls` run once, captured as recorded launches (`CellCache.capture`), whose kernel
    names say which kernel each plan picked (the names of numbakv.cache.kernels.REGISTRY
    keys, without their module)."""
    cache.declare_step(seqs)
    step = cache.prepare_step()
    for group in q_d:
        cache.reserve(q_d[group].shape[1])  # the decode workspace: nothing allocates inside
    k, v = kv.take(np.asarray(seqs, np.int32))

    def once():
        cache.write(0, k, v)
        for group, mode in calls:
            if cache.attend(0, q_d[group], mode=mode, out=out_d[group]) is not out_d[group]:
                raise AssertionError("attend(out=out) did not return out")

    launched = cache.capture(once, backend="record").kernels
    attends = [name for name in launched if name.startswith("attend_")]
    if len(attends) != len(calls):
        raise AssertionError(f"{len(calls)} attends launched {launched}")
    step.stream.synchronize()
    return step, dict(zip(calls, attends, strict=True))


def check_tokens(batch: int) -> list[int]:
    """The tokens whose outputs are checked against the solo oracle."""
    return sorted({0, batch // 2, batch - 1})


def stored_histories(kv: RandomKV, seqs: list[int], tokens: list[int], fmt: str,
                     n_kv_heads: int) -> dict[int, tuple]:  # fmt: skip
    """token -> (K, V) [length, n_kv_heads, head_dim] float32: the history of the token's
    sequence as a cache of `fmt` stores it and attention reads it (numbakv.reference's
    `to_storage` then `to_float32`; fp8 at the config's default scale, 1)."""
    from numbakv.reference.storage import to_float32, to_storage

    scales = np.ones(n_kv_heads, np.float32) if fmt == "fp8_e4m3" else None

    def stored(x: np.ndarray) -> np.ndarray:
        return to_float32(to_storage(x.astype(np.float32), fmt, scales), fmt, scales)

    return {t: tuple(stored(x) for x in kv.history(seqs[t])) for t in tokens}


def solo_outputs(stored: dict[int, tuple], q_h: np.ndarray, n_cells: int
                 ) -> dict[int, np.ndarray]:  # fmt: skip
    """token -> [n_heads, head_dim] float32: numbakv.reference's solo attention of the token
    over its own sequence's stored history (`stored_histories`), with no cells involved."""
    from numbakv.reference import solo_attention

    expect = {}
    for t, (k_hist, v_hist) in stored.items():
        assert len(k_hist) == n_cells, (len(k_hist), n_cells)
        expect[t] = solo_attention(q_h[t : t + 1], k_hist, v_hist, [n_cells - 1], window=0)[0]
    return expect


def add_decode_row(run: Run, case: str, seconds: float, kv_bytes: int, err: float,
                   sdpa: tuple | str, got: np.ndarray) -> list[str]:  # fmt: skip
    """The table's row of one decode case: its time, bandwidth, error and torch's; the row
    (its "model" cell is the estimate's)."""
    rate = kv_bytes / seconds
    cells = {
        "us": f"{seconds * 1e6:.1f}",
        "GB/s": f"{rate / 1e9:.4g}",
        "of copy": f"{rate / run.copy_bandwidth:.3g}" if run.copy_bandwidth else "-",
        "err": f"{err:.1e}",
        **sdpa_cells(sdpa, got, kv_bytes / 1e9, "GB/s"),
    }
    result = "ok" if err <= ERR_BOUND else f"FAIL: err > {ERR_BOUND}"
    return run.add("attention", case, result=result, **cells)
