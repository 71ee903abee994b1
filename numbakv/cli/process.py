"""What `numbakv` as a command sets up in its own process, and a library call never does
(`set_up`): an allocator that keeps the memory the process frees (`keep_freed_memory`),
and numpy's arrays on the kernel's small pages (`small_pages`)."""

import ctypes
import os

import numpy as np

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
# the free memory at the heap's top past which glibc hands it back: mallopt's largest int
TRIM_PAST = (1 << 31) - 1


def keep_freed_memory() -> bool:
    """Has glibc's malloc take every block from its heap and hand the heap's free top back
    only past 2 GiB, so the memory this process frees goes to its next arrays. By default
    a block of 32 MiB or more is mapped for itself and handed back when freed (smaller ones
    too, early on), so the next array of that size faults every page in again. Reading and
    drawing a trace of a GPU-sized pool makes many such temporaries: at 1 Mi cells x 10 000
    steps, on small pages (`small_pages`), `load_trace` took 1.86-1.93 s with this set and
    2.11-2.15 s without, at the same peak memory (docs/pictures.md). The process then
    keeps most of its peak memory until it exits: right for a command, never set by a
    library call.

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


def small_pages() -> bool:
    """Has numpy stop asking the kernel for transparent huge pages for its large arrays
    (madvise MADV_HUGEPAGE, from 4 MiB), as NUMPY_MADVISE_HUGEPAGE=0 would at import. Where
    the kernel's THP defrag is `madvise`, a common default, the first fault of such a page
    may stop to compact the host's memory: at 1 Mi cells x 10 000 steps, with the freed
    memory kept, `load_trace` took 1.90-3.54 s, 0.44-2.01 s of it in the kernel, on huge
    pages and 1.78-1.82 s, 0.28-0.33 s in the kernel, on small ones (docs/pictures.md).
    A command's arrays live too short for a huge page's fewer TLB misses to pay that back.

    Returns True once set; False, changing nothing, where NUMPY_MADVISE_HUGEPAGE is set
    (the user's choice stands) or numpy has no such switch."""
    switch = getattr(np._core.multiarray, "_set_madvise_hugepage", None)
    if switch is None or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return False
    switch(False)
    return True


def set_up() -> None:
    """What the `numbakv` executable sets up in its process before it runs: the memory it
    frees kept (`keep_freed_memory`) and its arrays on small pages (`small_pages`)."""
    keep_freed_memory()
    small_pages()
