"""A prefill step's FLOP rate in `python -m benchmarks.gpu_check`: n_seqs fresh sequences of
`new` tokens each in one step through `attend` (gathered, float16 K/V, GQA `group`; the
cache's max_width and capacity are the step's n_seqs x new tokens, max_seq_len `new`), its
median launch timed with CUDA events. FLOP = 4 x head_dim x n_heads x the cells the step's
tokens see, summed (token p of a sequence sees p + 1: 2 FLOP for q·k and 2 for p·v per
multiply-add). Checked against numbakv.reference's solo oracle at a few tokens, beside
torch's causal scaled_dot_product_attention on the same data (float16) and kernel_cost's
ceiling of the kernel the plan picked."""

import functools
import time

import numpy as np

from benchmarks.gpu_check.estimate import Estimates, attention_flop
from benchmarks.gpu_check.fill import RandomKV
from benchmarks.gpu_check.run import ERR_BOUND, Run
from benchmarks.gpu_check.torch_sdpa import dense_kv, sdpa_cells, torch_sdpa_prefill
from numbakv.core.formats import head_bytes

FORMAT = "float16"


def prefill_case(run: Run, estimates: Estimates) -> None:
    """The prefill step of the run's shapes (`Shapes.prefill`), timed, checked, and its row
    added: µs, TFLOP/s, torch's, the estimate's."""
    from numbakv.core.config import CacheConfig

    s, cuda = run.shapes, run.device.cuda
    n_seqs, new, group = s.prefill
    width, n_heads = n_seqs * new, s.n_kv_heads * group
    started = time.perf_counter()
    config = CacheConfig(
        n_layers=1, n_kv_heads=s.n_kv_heads, head_dim=s.head_dim, capacity=width,
        max_width=width, max_seqs=n_seqs, initial_cells=width, dtype=FORMAT, max_seq_len=new,
    )  # fmt: skip
    cache = run.device.CellCache(config)
    seqs = [cache.seq_new() for _ in range(n_seqs)]
    seq_ids = np.repeat(np.asarray(seqs, np.int32), new)  # each sequence's tokens in a run
    kv = RandomKV(cuda, width, s.n_kv_heads, s.head_dim, seed=width)
    q_h = np.random.default_rng(width).standard_normal((width, n_heads, s.head_dim),
                                                       dtype=np.float32)  # fmt: skip
    q_d, out_d = cuda.to_device(q_h), cuda.device_array(q_h.shape, np.float32)
    cache.declare_step(seq_ids)
    step = cache.prepare_step()
    k, v = kv.take(seq_ids)

    def once():
        cache.write(0, k, v)
        if cache.attend(0, q_d, out=out_d) is not out_d:
            raise AssertionError("attend(out=out) did not return out")

    launched = cache.capture(once, backend="record").kernels  # which kernel the plan picked
    (name,) = [n for n in launched if n.startswith("attend_")]
    estimates.want([name])
    step.stream.synchronize()
    print(f"  prefill: {n_seqs} x {new} new tokens, GQA {group} ({n_heads} heads), {FORMAT}, "
          f"one step of {width} tokens written in {time.perf_counter() - started:.1f} s; "
          f"kernel {name}")  # fmt: skip
    out_d.copy_to_device(np.full(q_h.shape, np.nan, np.float32))  # unwritten: NaN
    attend = functools.partial(cache.attend, 0, q_d, out=out_d)
    seconds = run.device.time_each(attend, step.stream, s.prefill_repeat)
    got = out_d.copy_to_host()
    err = prefill_error(got, q_h, kv, seqs, new)
    visible = n_seqs * new * (new + 1) // 2  # cells the step's tokens see, summed
    flop = attention_flop(n_heads, s.head_dim, visible)
    sdpa = torch_sdpa_prefill(run, dense_kv(run, kv, seqs), q_h)
    cells = {
        "us": f"{seconds * 1e6:.1f}",
        "TFLOP/s": f"{flop / seconds / 1e12:.4g}",
        "err": f"{err:.1e}",
        **sdpa_cells(sdpa, got, flop / 1e12, "TF/s"),
    }
    result = "ok" if err <= ERR_BOUND else f"FAIL: err > {ERR_BOUND}"
    case = f"prefill gathered {FORMAT} {n_seqs}x{new} gqa{group}"
    row = run.add("attention", case, result=result, **cells)
    kv_bytes = visible * s.n_kv_heads * head_bytes(FORMAT, s.head_dim) * 2  # as the tokens see
    estimates.attach(row, name, FORMAT, "TF/s", flop / kv_bytes)
    print(f"  prefill done in {time.perf_counter() - started:.1f} s")


def prefill_tokens(n_seqs: int, new: int) -> list[int]:
    """The tokens checked against the oracle: the first sequence's last, one in the middle of
    the step, the step's last."""
    return sorted({new - 1, (n_seqs // 2) * new + new // 2, n_seqs * new - 1})


def prefill_error(got: np.ndarray, q_h: np.ndarray, kv: RandomKV, seqs: list[int], new: int
                  ) -> float:  # fmt: skip
    """max |numbakv - solo oracle| over `prefill_tokens`: token t is position t % new of
    sequence seqs[t // new] and sees its positions 0 .. t % new (NaN stays NaN)."""
    from numbakv.reference import solo_attention

    errs = []
    for t in prefill_tokens(len(seqs), new):
        k_hist, v_hist = kv.history(seqs[t // new])
        expect = solo_attention(q_h[t : t + 1], k_hist, v_hist, [t % new], window=0)[0]
        errs.append(np.abs(got[t] - expect).max())
    return float(np.max(errs))
