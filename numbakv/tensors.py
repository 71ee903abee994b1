"""Results in the caller's kind of array: torch tensors in, a torch tensor out
(docs/contract.md §5.1).

Both caches take torch tensors as they take NumPy arrays (`checks.host_floats`, the device
cache's `inputs`); when `attend`'s q is a torch tensor, its result is one too, in q's dtype
and on q's device. torch is never imported here: a caller who passes a torch tensor has
imported it (`sys.modules`), so numbakv needs torch only where its caller has it.
"""

import sys

import numpy as np

from numbakv.checks import check_shape
from numbakv.errors import StepError


def is_torch(x) -> bool:
    """Whether x is a torch tensor, a subclass's included (without importing torch: with
    no torch imported, nothing is one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_cuda_tensor(x) -> bool:
    """Whether x is a torch tensor in CUDA memory."""
    return is_torch(x) and bool(getattr(x, "is_cuda", False))


def _torch():
    return sys.modules["torch"]  # imported: the caller passed one of its tensors


def host_result(q, result: np.ndarray):
    """`result` ([width, n_heads, head_dim] float32 NumPy) as the caller gave q: a CPU torch
    tensor sharing its memory when q is a float32 one, a new one in q's dtype (float16,
    bfloat16: rounded to nearest even by torch) when q is of another; else `result`."""
    if not is_torch(q):
        return result
    tensor = _torch().from_dlpack(result)
    return tensor if tensor.dtype == q.dtype else tensor.to(q.dtype)


def check_host_out(out, shape: tuple[int, ...]):
    """`out` checked as a host array `attend` can write a float32 result into: a writable
    NumPy float array or a CPU torch float tensor of `shape`, or StepError."""
    if is_torch(out):
        if out.device.type != "cpu" or not out.is_floating_point() or out.requires_grad:
            raise StepError(
                f"out is a torch tensor of {out.dtype} on {out.device} (requires_grad="
                f"{out.requires_grad}); the reference writes a CPU float tensor of shape "
                f"{shape} that requires no grad"
            )
        check_shape("out", tuple(out.shape), shape)
        if any(st == 0 and n > 1 for st, n in zip(out.stride(), out.shape, strict=True)):
            raise StepError(f"out has strides {out.stride()}: its elements overlap (expand)")
        return out
    if not isinstance(out, np.ndarray) or out.dtype.kind != "f" or not out.flags.writeable:
        raise StepError(
            f"out is a {type(out).__name__}; give a writable NumPy float array or a CPU torch "
            f"float tensor of shape {shape}, or None"
        )
    check_shape("out", out.shape, shape)
    return out


def write_into(out, result: np.ndarray):
    """`out` (checked by `check_host_out`) holding `result`, cast to its dtype; returns out."""
    if is_torch(out):
        out.copy_(_torch().from_dlpack(result))  # torch casts, bfloat16 to nearest even
    else:
        np.copyto(out, result, casting="unsafe")
    return out
