"""numbakv's two fixes to numba's CUDA simulator (`numbakv.cache.simulator`, installed by
`numbakv.cache.cuda`), each shown by a test of the bug with numba's own code (`numbas_own`)
and one of its absence with the fix; and the simulator's rules, which the fixed block
runner keeps: a block's threads meet at every syncthreads and see each other's
shared-memory writes, and a thread's exception reaches the launcher.

Each bug is shown deterministically, with no assertion on time: its kernel is given a
Python object that orders the block's threads or counts what the runner does (on the
simulator a kernel is Python and may call the objects it is given as arguments)."""

import sys
import threading

import numpy as np
import pytest

from numbakv.cache import simulator
from numbakv.cache.cuda import IS_SIMULATOR, cuda

pytestmark = pytest.mark.skipif(
    not IS_SIMULATOR, reason="numbakv's fixes to numba's CUDA simulator run on the simulator only"
)
THREADS = 8
GUARD_S = 30.0  # a wait in these tests that is never expected to run out, seconds
GRACE_S = 0.2  # once every thread has arrived, how long an allocation waits for the rest, s
WAITS = 20  # the runner's waits for a thread that release the holding thread
LOOKS = 20_000  # or its looks at its threads, whichever comes first


@pytest.fixture
def numbas_own():
    """numba's own shared arrays, block runner and switch interval for one test."""
    simulator.uninstall()
    try:
        yield
    finally:
        simulator.install()


# -- shared arrays: the look-up and the insert --------------------------------------------


class WidenedAllocation:
    """`np.empty` for one block's `cuda.shared.array` with the window between the look-up
    (no array for this line yet) and the insert widened: an allocation returns once every
    thread of the block has entered `np.empty` (each past the look-up before any insert)
    or, once every thread has arrived at the allocating line, after GRACE_S more. Each
    array it makes holds -1, so a read of a slot no thread wrote is -1."""

    def __init__(self, empty):
        self._empty = empty
        self._changed = threading.Condition()
        self.arrived = 0
        self.made = []  # every array made, [THREADS] int32

    def arrive(self) -> None:
        """Called by each thread just before it asks for the shared array."""
        with self._changed:
            self.arrived += 1
            self._changed.notify_all()

    def empty(self, shape, dtype):
        made = self._empty(shape, dtype)
        if threading.current_thread() is threading.main_thread():
            return made  # not the block's: the launcher's own arrays
        made.fill(-1)
        with self._changed:
            self.made.append(made)
            self._changed.notify_all()
            all_in = lambda: len(self.made) == THREADS  # noqa: E731
            self._changed.wait_for(lambda: all_in() or self.arrived == THREADS, GUARD_S)
            self._changed.wait_for(all_in, GRACE_S)
        return made


@cuda.jit
def reverse_through_shared(allocation, out):
    """out[i] = THREADS - 1 - i, read from the slot thread THREADS - 1 - i wrote into the
    block's shared array. `allocation`: a WidenedAllocation; out: [THREADS] int32."""
    i = cuda.threadIdx.x
    allocation.arrive()
    s = cuda.shared.array(THREADS, np.int32)
    s[i] = i
    cuda.syncthreads()
    out[i] = s[THREADS - 1 - i]


def launch_widened(monkeypatch) -> tuple[WidenedAllocation, np.ndarray]:
    """One block of reverse_through_shared under a WidenedAllocation: (it, out)."""
    allocation = WidenedAllocation(np.empty)
    out = np.zeros(THREADS, np.int32)
    with monkeypatch.context() as patch:
        patch.setattr(np, "empty", allocation.empty)
        reverse_through_shared[1, THREADS](allocation, out)
    return allocation, out


def test_numbas_shared_array_gives_two_threads_of_a_block_different_arrays(numbas_own, monkeypatch):
    allocation, out = launch_widened(monkeypatch)
    assert len(allocation.made) > 1  # two threads passed the look-up before an insert
    assert all((made >= 0).any() for made in allocation.made)  # each used by its thread
    assert not np.array_equal(out, np.arange(THREADS)[::-1])


def test_the_locked_shared_array_gives_every_thread_of_a_block_the_one_array(monkeypatch):
    allocation, out = launch_widened(monkeypatch)
    assert allocation.arrived == THREADS
    assert len(allocation.made) == 1  # the others waited at the lock, then found it
    np.testing.assert_array_equal(out, np.arange(THREADS)[::-1])


# -- the block runner: spinning or waiting ------------------------------------------------


class RunnerWatch:
    """Counts the block runner's looks at its threads (`is_alive`) and its waits for one of
    them (`join`) while thread 0 of the block waits (`hold`) for the release: the runner's
    WAITS-th wait or its LOOKS-th look, whichever comes first."""

    def __init__(self):
        self._changed = threading.Condition()
        self.looks = 0
        self.waits = 0
        self.looks_at_release = None  # the looks when thread 0 was released

    def count(self, looks: int, waits: int) -> None:
        with self._changed:
            self.looks += looks
            self.waits += waits
            if self.looks_at_release is None and (self.waits >= WAITS or self.looks >= LOOKS):
                self.looks_at_release = self.looks
                self._changed.notify_all()

    def hold(self) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.looks_at_release is not None, GUARD_S)


@cuda.jit
def thread_0_holds(watch):
    """Thread 0 waits in `watch.hold`; the block's other threads return at once."""
    if cuda.threadIdx.x == 0:
        watch.hold()


def launch_watched(monkeypatch) -> RunnerWatch:
    """One block of thread_0_holds under a RunnerWatch."""
    from numba.cuda.simulator.kernel import BlockThread

    watch = RunnerWatch()
    own_is_alive, own_join = BlockThread.is_alive, BlockThread.join

    def is_alive(thread) -> bool:
        watch.count(looks=1, waits=0)
        return own_is_alive(thread)

    def join(thread, timeout=None) -> None:
        watch.count(looks=0, waits=1)
        own_join(thread, timeout)

    with monkeypatch.context() as patch:
        patch.setattr(BlockThread, "is_alive", is_alive)
        patch.setattr(BlockThread, "join", join)
        thread_0_holds[1, THREADS](watch)
    return watch


def test_numbas_block_runner_looks_at_its_threads_without_ever_waiting(numbas_own, monkeypatch):
    watch = launch_watched(monkeypatch)
    assert watch.waits == 0  # it never blocks between two looks, so it keeps the GIL
    assert watch.looks_at_release == LOOKS


def test_the_waiting_block_runner_waits_between_any_two_looks(monkeypatch):
    watch = launch_watched(monkeypatch)
    assert watch.waits >= WAITS
    assert watch.looks <= THREADS * watch.waits  # a look at each live thread after a wait
    assert watch.looks_at_release <= THREADS * WAITS
    assert watch.looks_at_release * 100 < LOOKS  # orders of magnitude below numba's runner


def test_install_swaps_numbas_own_in_and_uninstall_puts_it_back(numbas_own):
    from numba.cuda.simulator.kernel import BlockManager
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    def in_place():
        return FakeCUDAShared.array, BlockManager.run, sys.getswitchinterval()

    numbas = in_place()
    assert not simulator.is_installed()
    simulator.install()
    fixed = in_place()
    simulator.install()  # a second call changes nothing
    assert in_place() == fixed
    assert simulator.is_installed()
    assert fixed[0] is not numbas[0] and fixed[1] is not numbas[1]
    assert fixed[2] == simulator.SWITCH_INTERVAL_S
    simulator.uninstall()
    assert in_place() == numbas
    assert not simulator.is_installed()


# -- the rules the fixed runner keeps ------------------------------------------------------


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
