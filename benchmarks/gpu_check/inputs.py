"""Device tensors from torch read in place, in `python -m benchmarks.gpu_check`: q, k and v as
views of one fused bfloat16 (and float16) QKV tensor, through DLPack, and a bfloat16 `out=`,
against the same values as contiguous float32 copies; and whether the cache wrote into the
caller's `out` (its address). Needs torch with CUDA; the simulator twin is
tests/cache/test_strided_inputs.py, over an exporter of host memory."""

import numpy as np

from benchmarks.gpu_check.run import Run
from benchmarks.gpu_check.torch_sdpa import find_torch

N_KV_HEADS, N_HEADS, HEAD_DIM = 2, 8, 128


def part_inputs(run: Run) -> None:
    """One prefill step and one decode step per dtype, each on two new caches: torch views
    (bfloat16, float16) against float32 copies of their values."""
    if run.is_sim:
        twin = "tests/cache/test_strided_inputs.py"
        run.add("inputs", "torch tensors through DLPack", result=f"skipped: the simulator ({twin})")
        return
    if isinstance(run.torch, str):
        run.torch = find_torch()
    if isinstance(run.torch, str):
        run.add("inputs", "torch tensors through DLPack", result=f"skipped: {run.torch}")
        return
    torch = run.torch
    for dtype in (torch.bfloat16, torch.float16):
        for width in (64, 1):
            err, in_place = _compare(run, torch, dtype, width)
            ok = err == 0.0 and in_place
            result = "ok" if ok else f"FAIL: err {err}, out written in place: {in_place}"
            run.add("inputs", f"torch {str(dtype)[6:]} views, width {width}", err=f"{err:.1e}",
                    result=result)  # fmt: skip


def _compare(run: Run, torch, dtype, width: int) -> tuple[float, bool]:
    """(max |torch path - float32 copies, rounded to dtype|, whether attend wrote into the
    caller's out tensor) over a step of `width` tokens of one sequence."""
    import numbakv

    cuda = run.device.cuda
    config = numbakv.CacheConfig(
        n_layers=1, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, capacity=256, max_width=64,
        max_seqs=1, dtype="float16",
    )  # fmt: skip
    generator = torch.Generator(device="cuda").manual_seed(width)
    qkv = torch.randn((width, N_HEADS + 2 * N_KV_HEADS, HEAD_DIM), device="cuda",
                      generator=generator).to(dtype)  # fmt: skip
    q, k, v = qkv.split([N_HEADS, N_KV_HEADS, N_KV_HEADS], dim=1)  # strided views
    outs = []
    for inputs in ((q, k, v), tuple(cuda.as_cuda_array(x.float().contiguous()) for x in (q, k, v))):
        cache = numbakv.CellCache(config)
        cache.declare_step([cache.seq_new()] * width)
        cache.prepare_step()
        cache.write(0, inputs[1], inputs[2])
        is_torch = inputs[0] is q
        out = torch.empty((width, N_HEADS, HEAD_DIM), device="cuda", dtype=dtype) if is_torch \
            else cuda.device_array((width, N_HEADS, HEAD_DIM), np.float32)  # fmt: skip
        got = cache.attend(0, inputs[0], out=out)
        cuda.synchronize()
        in_place = not is_torch or got.__cuda_array_interface__["data"][0] == out.data_ptr()
        outs.append((out if is_torch else torch.as_tensor(got, device="cuda"), in_place))
    (mine, in_place), (reference, _) = outs
    err = (mine.float() - reference.to(dtype).float()).abs().nan_to_num(0.0).max().item()
    return err, in_place
