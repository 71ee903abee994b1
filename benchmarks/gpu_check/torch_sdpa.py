"""torch beside numbakv in `python -m benchmarks.gpu_check`, where it has CUDA: found once,
and its scaled_dot_product_attention timed on the same K/V as numbakv's attention. Anything
torch cannot do is said (a str in place of a result), and the rest runs."""

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


def torch_sdpa(run: Run, dense: tuple | str, q_h: np.ndarray) -> tuple | str:
    """(median seconds, [batch, n_heads, head_dim] float32) of torch's
    scaled_dot_product_attention on `dense` (q rounded to float16), or why not (a str)."""
    if isinstance(dense, str):
        return dense
    torch = run.torch
    try:
        run_sdpa = _sdpa_call(torch, dense, q_h)
        out = run_sdpa().squeeze(2).float().cpu().numpy()
        return _time_torch(torch, run_sdpa, run.shapes.repeat), out
    except Exception as error:  # torch's trouble is not numbakv's: say it, run the rest
        print(f"  torch sdpa failed: {type(error).__name__}: {error}")
        return f"torch: {type(error).__name__}"


def _sdpa_call(torch, dense, q_h):
    """scaled_dot_product_attention of q_h over `dense`, ready to call: with enable_gqa where
    torch has it (2.5 and later), else over KV heads repeated to the query heads."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.from_numpy(q_h).cuda().half().unsqueeze(2)  # [batch, n_heads, 1, head_dim]
    k, v = dense  # [batch, n_kv_heads, n_cells, head_dim]
    try:
        sdpa(q, k, v, enable_gqa=True)
        return functools.partial(sdpa, q, k, v, enable_gqa=True)
    except TypeError:
        group = q.shape[1] // k.shape[1]
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        print("  torch sdpa: no enable_gqa in this torch, KV heads repeated")
        return functools.partial(sdpa, q, k, v)


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
