"""Counting what your own numba.cuda code does per step, on the CUDA simulator.

A runtime's decode step should launch a fixed number of kernels, copy only what changed,
allocate nothing and never synchronize. `numbakv.testing.launches.count_device_calls`
counts those on numba's CUDA simulator, exactly and in call order, so a test can hold your
step to its budget without a GPU. This is a toy step of a user's runtime: it uploads the
step's positions (one copy), appends K/V rows into a preallocated cache (one launch) and
scales a query by the rows it may see (one launch), all on the caller's stream.

    NUMBA_ENABLE_CUDASIM=1 python examples/count_device_calls.py

prints the counts of one step and its log; tests/testing/test_count_example.py asserts them.
"""

import numpy as np
from numba import cuda

from numbakv.testing.launches import count_device_calls


@cuda.jit
def append_kv(cache, rows, positions):
    """cache[positions[t]] = rows[t] for every t: [n_positions, head_dim] float32."""
    t, d = cuda.grid(2)
    if t < rows.shape[0] and d < rows.shape[1]:
        cache[positions[t], d] = rows[t, d]


@cuda.jit
def scale_by_history(q, positions):
    """q[t] *= 1 / (positions[t] + 1): a stand-in for attention over the history."""
    t, d = cuda.grid(2)
    if t < q.shape[0] and d < q.shape[1]:
        q[t, d] *= 1.0 / (positions[t] + 1)


class ToyStep:
    """Device buffers made once; `run` does one step on `stream` without allocating."""

    def __init__(self, n_positions: int, width: int, head_dim: int, stream):
        self.stream = stream
        self.cache = cuda.device_array((n_positions, head_dim), np.float32, stream=stream)
        self.positions = cuda.device_array(width, np.int32, stream=stream)
        self.host_positions = cuda.pinned_array(width, np.int32)

    def run(self, positions: np.ndarray, rows, q) -> None:
        """positions: [width] int host; rows, q: [width, head_dim] float32 device arrays."""
        self.host_positions[:] = positions
        self.positions.copy_to_device(self.host_positions, stream=self.stream)
        grid, block = (1, 1), (rows.shape[0], rows.shape[1])
        append_kv[grid, block, self.stream](self.cache, rows, self.positions)
        scale_by_history[grid, block, self.stream](q, self.positions)


def one_step():
    """The calls of the second step of a ToyStep (the first may compile): DeviceCalls."""
    stream = cuda.stream()
    step = ToyStep(n_positions=16, width=4, head_dim=8, stream=stream)
    rows = cuda.to_device(np.ones((4, 8), np.float32), stream=stream)
    q = cuda.to_device(np.ones((4, 8), np.float32), stream=stream)
    step.run(np.arange(4), rows, q)
    with count_device_calls() as calls:
        step.run(np.arange(4, 8), rows, q)
    stream.synchronize()
    return calls


if __name__ == "__main__":
    calls = one_step()
    print(calls.counts)
    print(calls.log)
    print("on the legacy default stream:", calls.on_default_stream())
