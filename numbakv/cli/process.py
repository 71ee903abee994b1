"""What `numbakv` as a command sets up in its own process, and a library call never does:
an allocator that keeps the memory the process frees (`keep_freed_memory`)."""

import ctypes
import os

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# blocks under this come from the heap, which keeps what is freed below 2 GiB at its top
HEAP_BLOCKS_BELOW = 1 << 30
KEEP_FREE_BELOW = (1 << 31) - 1  # mallopt's int


def keep_freed_memory() -> bool:
    """Has glibc's malloc keep the memory this process frees, for its next arrays. By
    default a block of 32 MiB or more is mapped for itself and handed back to the system
    when freed (smaller ones too, early on), so the next array of that size faults every
    page in again; where numpy asks for transparent huge pages, such a fault may first
    compact the system's memory. Reading and drawing a trace of a GPU-sized pool makes
    many such temporaries: at 1 Mi cells x 10 000 steps, `load_trace` spent 0.6-1.8 s of
    its 2.2-3.6 s in the kernel, and 0.14-0.35 s of 1.6-2.0 s with this set, at the same
    peak memory (docs/pictures.md). The process's resident memory then stays at its peak
    until it exits: right for a command, never set by a library call.

    Returns True once set, False where the C library is not glibc (nothing changed)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), or not glibc
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_BLOCKS_BELOW)) and bool(
        mallopt(M_TRIM_THRESHOLD, KEEP_FREE_BELOW)
    )
