"""The CUDA simulator as numbakv patches it (`numbakv.cache.cuda`): a block's threads still
meet at every syncthreads, see each other's shared-memory writes, and a thread's exception
still reaches the launcher, with the block runner waiting instead of spinning."""

import numpy as np
import pytest

from numbakv.cache.cuda import IS_SIMULATOR, cuda

pytestmark = pytest.mark.skipif(not IS_SIMULATOR, reason="the simulator's block runner")
THREADS = 8


@cuda.jit
def block_prefix_sums(x, out):
    """out[b, i] = sum of x[b, :i + 1], one block per row, a barrier between every round."""
    s = cuda.shared.array(THREADS, np.float32)
    i, b = cuda.threadIdx.x, cuda.blockIdx.x
    s[i] = x[b, i]
    offset = 1
    while offset < THREADS:
        cuda.syncthreads()
        add = s[i - offset] if i >= offset else np.float32(0)
        cuda.syncthreads()
        s[i] += add
        offset *= 2
    out[b, i] = s[i]


@cuda.jit
def fails_in_one_thread(out):
    i = cuda.threadIdx.x
    cuda.syncthreads()
    out[i + (THREADS if i == 3 else 0)] = i  # thread 3 writes past the end


def test_threads_meet_at_every_barrier():
    x = np.random.default_rng(0).integers(0, 9, (3, THREADS)).astype(np.float32)
    out = cuda.device_array_like(x)
    block_prefix_sums[3, THREADS](cuda.to_device(x), out)
    np.testing.assert_array_equal(out.copy_to_host(), np.cumsum(x, axis=1))


def test_a_threads_exception_reaches_the_launch_and_the_next_launch_works():
    with pytest.raises(IndexError, match=r"tid=\[3, 0, 0\]"):
        fails_in_one_thread[1, THREADS](cuda.device_array(THREADS, np.int32))
    test_threads_meet_at_every_barrier()
