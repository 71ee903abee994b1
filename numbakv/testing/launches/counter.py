"""`count_device_calls`: the block inside which numba's CUDA simulator is counted."""

import contextlib
import threading
from collections.abc import Iterator

from numbakv.testing.launches.patches import install, uninstall
from numbakv.testing.launches.records import DeviceCalls
from numbakv.testing.launches.wrappers import ACTIVE

_INSTALL_LOCK = threading.Lock()


def check_simulator() -> None:
    """Raises RuntimeError unless numba runs CUDA on its simulator. numba reads
    NUMBA_ENABLE_CUDASIM once, when it is first imported, so it is imported here (not when
    this package is) and the flag is read as numba holds it."""
    import numba

    if not numba.config.ENABLE_CUDASIM:
        raise RuntimeError(
            "count_device_calls() wraps numba's CUDA simulator, and numba is not running on "
            "it: set NUMBAKV_DEVICE=sim (numbakv's caches) or NUMBA_ENABLE_CUDASIM=1 in the "
            "environment before numba is imported"
        )


@contextlib.contextmanager
def count_device_calls() -> Iterator[DeviceCalls]:
    """Counts numba.cuda's launches, copies, allocations, synchronizations, streams and
    events made inside the block; yields the DeviceCalls, which keeps filling until the
    block ends. Nested blocks share one set of patches. Raises RuntimeError (before the
    block runs) unless numba runs on the CUDA simulator."""
    check_simulator()
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
