"""torch beside numbakv in `python -m benchmarks.gpu_check`, where it has CUDA: found once,
and its scaled_dot_product_attention timed on the same K/V as numbakv's attention (decode:
one token per sequence, float16 or bfloat16; prefill: causal over each sequence's new
tokens). Anything torch cannot do is said (a str in place of a result), and the rest runs."""

import functools
import importlib.util

import numpy as np

from benchmarks.gpu_check.fill import RandomKV
from benchmarks.gpu_check.run import Run


def find_torch() -> object:
    """The torch module when it imports and sees a GPU, else why not (a str)."""
    if importlib.util.find_spec("torch") is None:
        return "torch: not installed"
    try:
        import torch
    except Exception as error:  # a broken install: say so, run the rest
        return f"torch: import failed ({type(error).__name__})"
    return torch if torch.cuda.is_available() else "torch: no CUDA device"


def torch_note(torch) -> str:
    """torch's version, its CUDA's and the device's name."""
    return f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}"


def dense_kv(run: Run, kv: RandomKV, seqs: list[int]) -> tuple | str:
    """The K/V `seqs` hold as torch tensors [batch, n_kv_heads, n_cells, head_dim] float16
    on the GPU, or why not (a str)."""
    if isinstance(run.torch, str):
        return run.torch
    torch = run.torch
    k, v = zip(*(kv.history(seq) for seq in seqs), strict=True)
    return tuple(torch.from_numpy(np.stack(x).transpose(0, 2, 1, 3).copy()).cuda() for x in (k, v))


SDPA_FORMATS = ("float16", "bfloat16")  # the storage formats torch's sdpa takes as they are


def torch_sdpa(run: Run, dense: tuple | str, q_h: np.ndarray, fmt: str = "float16"
               ) -> tuple | str:  # fmt: skip
    """(median seconds, [batch, n_heads, head_dim] float32) of torch's
    scaled_dot_product_attention of one decode token per sequence on `dense` K/V
    (`dense_kv`) in `fmt` ("float16" or "bfloat16": K, V and q rounded to it), or why not (a
    str)."""
    if isinstance(dense, str):
        return dense
    torch = run.torch

    def inputs():
        dtype = getattr(torch, fmt)
        q = torch.from_numpy(q_h).cuda().to(dtype).unsqueeze(2)  # [batch, n_heads, 1, head_dim]
        return (q, *(x.to(dtype) for x in dense))

    found = sdpa_timed(run, inputs, is_causal=False, repeat=run.shapes.repeat)
    return found if isinstance(found, str) else (found[0], found[1][:, :, 0])


def torch_sdpa_prefill(run: Run, dense: tuple | str, q_h: np.ndarray) -> tuple | str:
    """(median seconds, [n_seqs x new, n_heads, head_dim] float32) of torch's causal
    scaled_dot_product_attention of `new` new tokens of each sequence over float16 `dense`
    K/V [n_seqs, n_kv_heads, new, head_dim] (`dense_kv`), q [n_seqs x new, n_heads,
    head_dim] sequence by sequence rounded to float16; or why not (a str)."""
    if isinstance(dense, str):
        return dense
    torch = run.torch
    n_seqs, _, new, head_dim = dense[0].shape

    def inputs():
        q = q_h.reshape(n_seqs, new, -1, head_dim).transpose(0, 2, 1, 3)  # by sequence
        return (torch.from_numpy(q.copy()).cuda().half(), *dense)

    found = sdpa_timed(run, inputs, is_causal=True, repeat=run.shapes.prefill_repeat)
    if isinstance(found, str):
        return found
    return found[0], found[1].transpose(0, 2, 1, 3).reshape(q_h.shape)


def sdpa_timed(run: Run, inputs, is_causal: bool, repeat: int) -> tuple | str:
    """(median seconds of `repeat` calls, its output as float32 NumPy [batch, n_heads,
    n_q, head_dim]) of scaled_dot_product_attention(q, k, v) over (q, k, v) = inputs() (q
    [batch, n_heads, n_q, head_dim], k and v [batch, n_kv_heads, n_cells, head_dim] torch
    CUDA tensors), or what torch raised (a str)."""
    torch = run.torch
    try:
        run_sdpa = _sdpa_call(torch, *inputs(), is_causal)
        out = run_sdpa().float().cpu().numpy()
        return _time_torch(torch, run_sdpa, repeat), out
    except Exception as error:  # torch's trouble is not numbakv's: say it, run the rest
        print(f"  torch sdpa failed: {type(error).__name__}: {error}")
        return f"torch: {type(error).__name__}"


def sdpa_cells(sdpa: tuple | str, got: np.ndarray, work: float, unit: str) -> dict[str, str]:
    """The "sdpa" cells of a row: torch's time, its rate (`work` in `unit`'s numerator per
    second) and max |torch - numbakv|; or why torch did not run."""
    if isinstance(sdpa, str):
        return {"sdpa us": sdpa}
    seconds, out = sdpa
    return {
        "sdpa us": f"{seconds * 1e6:.1f}",
        "sdpa rate": f"{work / seconds:.4g} {unit}",
        "sdpa err": f"{float(np.abs(out - got).max()):.1e}",
    }


def _sdpa_call(torch, q, k, v, is_causal: bool):
    """scaled_dot_product_attention of q over k, v, ready to call: with enable_gqa where
    torch has it (2.5 and later), else over KV heads repeated to the query heads."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    try:
        sdpa(q, k, v, is_causal=is_causal, enable_gqa=True)
        return functools.partial(sdpa, q, k, v, is_causal=is_causal, enable_gqa=True)
    except TypeError:
        group = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        print("  torch sdpa: no enable_gqa in this torch, KV heads repeated")
        return functools.partial(sdpa, q, k, v, is_causal=is_causal)


def _time_torch(torch, run, repeat: int) -> float:
    """Median seconds of `run()` on torch's current stream, CUDA events around each."""
    torch.cuda.synchronize()
    events = [[torch.cuda.Event(enable_timing=True) for _ in "se"] for _ in range(repeat)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return float(np.median([start.elapsed_time(end) / 1e3 for start, end in events]))
