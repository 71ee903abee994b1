"""Counts what numba.cuda is asked to do, in the CUDA simulator: kernel launches, copies,
device allocations, synchronizations, and the streams and events made.

    with count_device_calls() as calls:
        cache.prepare_step()
    calls.counts   # {"launches": 2, "copies": 1, "allocations": 0, "synchronizations": 0, ...}
    calls.log      # [("copies", "copy_to_device"), ("launches", "place_tokens"), ...]
    calls.launches # [Launch(name, grid, block, stream, args), ...]

While the block runs, the simulator's entry points are wrapped (`counting_patches`, with the
wrappers of `counting_wrappers`); leaving it puts every original back. Blocks may nest: an
outer counter sees everything an inner one sees. What is counted, and the records, are in
`counting_calls`. Counting is exact and deterministic: nothing is sampled, and the log is in
call order. Only the simulator is supported (`count_device_calls` raises on a GPU).
"""

import contextlib
import threading
from collections.abc import Iterator

from counting_calls import (
    CATEGORIES,
    NO_STREAM,
    Call,
    DeviceCalls,
    Launch,
    is_default_stream,
    stream_kind,
)
from counting_patches import entry_points, install, uninstall
from counting_wrappers import ACTIVE

from numbakv.cache.cuda import IS_SIMULATOR

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

_INSTALL_LOCK = threading.Lock()


@contextlib.contextmanager
def count_device_calls() -> Iterator[DeviceCalls]:
    """Counts numba.cuda's launches, copies, allocations, synchronizations, streams and
    events made inside the block; yields the DeviceCalls, which keeps filling until the
    block ends. Nested blocks share one set of patches."""
    if not IS_SIMULATOR:
        raise RuntimeError(
            "count_device_calls() wraps the CUDA simulator's entry points; run with "
            "NUMBAKV_DEVICE=sim"
        )
    counter = DeviceCalls()
    with _INSTALL_LOCK:
        if not ACTIVE:
            install()
        ACTIVE.append(counter)
    try:
        yield counter
    finally:
        with _INSTALL_LOCK:
            ACTIVE.remove(counter)
            if not ACTIVE:
                uninstall()
