"""numbakv.testing.launches: count what numba device code asks of numba.cuda, per call, in
numba's CUDA simulator: kernel launches, copies, device allocations, synchronizations, and
the streams and events made. It is how numbakv holds its own step to the launch budget of
docs/contract.md §8.1, and it counts any numba code the same way:

    # NUMBA_ENABLE_CUDASIM=1 in the environment before numba is imported
    # (or NUMBAKV_DEVICE=sim, which numbakv's caches read)
    import numpy as np
    from numba import cuda
    from numbakv.testing.launches import count_device_calls

    @cuda.jit
    def add_one(x):
        i = cuda.grid(1)
        if i < x.shape[0]:
            x[i] += 1

    x_d = cuda.to_device(np.zeros(4, np.float32))
    with count_device_calls() as calls:
        add_one[1, 4](x_d)
        x = x_d.copy_to_host()
    calls.counts     # {"launches": 1, "copies": 1, "allocations": 0, "synchronizations": 0,
                     #  "streams": 0, "events": 0}
    calls.log        # [("launches", "add_one"), ("copies", "copy_to_host")]
    calls.launches   # [Launch(name="add_one", grid=(1, 1, 1), block=(4, 1, 1), stream=0, ...)]
    calls.on_default_stream()  # the launches and copies on the legacy default stream: both

Inside the block, `calls.mark()` and `calls.since(mark)` give the calls of one part of it
(one step, one layer).

While the block runs, the simulator's entry points are wrapped (`patches`, with the wrappers
of `wrappers`); leaving it, also by an exception, puts every original back (`entry_points`
shows them). Blocks may nest: an outer counter sees everything an inner one sees. What is
counted, and the records (`Call`, `Launch`, `DeviceCalls`), are in `records`. Counting is
exact and deterministic: nothing is sampled, and the log is in call order. Only the
simulator is counted: `count_device_calls` raises RuntimeError when numba runs on a GPU.

Importing this package imports no numba; `count_device_calls` imports it when called.
`numbakv.testing` does not import this package.
"""

from numbakv.testing.launches.counter import count_device_calls
from numbakv.testing.launches.patches import entry_points
from numbakv.testing.launches.records import (
    CATEGORIES,
    NO_STREAM,
    Call,
    DeviceCalls,
    Launch,
    is_default_stream,
    stream_kind,
)

__all__ = [
    "CATEGORIES",
    "NO_STREAM",
    "Call",
    "DeviceCalls",
    "Launch",
    "count_device_calls",
    "entry_points",
    "is_default_stream",
    "stream_kind",
]
