"""What `numbakv` as a command sets up in its own process, and a library call never does:
an allocator that keeps the memory the process frees (`keep_freed_memory`)."""

import ctypes
import os

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
# the free memory at the heap's top past which glibc hands it back: mallopt's largest int
TRIM_PAST = (1 << 31) - 1


def keep_freed_memory() -> bool:
    """Has glibc's malloc take every block from its heap and hand the heap's free top back
    only past 2 GiB, so the memory this process frees goes to its next arrays. By default
    a block of 32 MiB or more is mapped for itself and handed back when freed (smaller ones
    too, early on), so the next array of that size faults every page in again; where the
    kernel backs numpy's large arrays with transparent huge pages, such a fault may first
    compact the system's memory. Reading and drawing a trace of a GPU-sized pool makes
    many such temporaries: at 1 Mi cells x 10 000 steps, `load_trace` spent 0.6-2.1 s of
    its 2.1-3.6 s in the kernel, and 0.14-0.41 s of 1.6-2.0 s with this set, at the same
    peak memory (docs/pictures.md). The process then keeps most of its peak memory until
    it exits: right for a command, never set by a library call.

    Returns True once set; False, changing nothing, where the C library is not glibc or
    refuses."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), not glibc, no libc
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_PAST))
