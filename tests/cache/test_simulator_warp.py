"""The warp primitives numbakv gives numba's CUDA simulator (`numbakv.cache.simulator_warp`,
installed with `numbakv.cache.simulator`'s fixes): each against results worked out by hand
from numba-cuda's GPU semantics, in blocks of 16, 32 and 64 threads and in 2-D blocks; the
choices where a GPU is undefined (absent lanes, sources outside the mask); and the errors
that replace a hang, each launched under a watchdog so that a hang fails the test instead.
"""

import threading

import numpy as np
import pytest

from numbakv.cache import simulator
from numbakv.cache.cuda import IS_SIMULATOR, cuda

pytestmark = pytest.mark.skipif(
    not IS_SIMULATOR, reason="numbakv's warp primitives for numba's CUDA simulator"
)
FULL = 0xFFFFFFFF
GUARD_S = 30.0  # a launch that has not ended by then hangs, seconds
LANES = np.arange(32)
IDX, UP, DOWN, XOR = range(4)  # one_shuffle's kinds


def launch(kernel, blocks, threads, *args) -> BaseException | None:
    """Launches `kernel` in a thread of its own and returns what it raised (None when
    nothing); fails the test when the launch has not ended within GUARD_S."""
    raised = []

    def run():
        try:
            kernel[blocks, threads](*args)
        except BaseException as error:  # the launch's error is the test's to check
            raised.append(error)

    launcher = threading.Thread(target=run, daemon=True)
    launcher.start()
    launcher.join(GUARD_S)
    assert not launcher.is_alive(), f"the launch hangs (still running after {GUARD_S} s)"
    return raised[0] if raised else None


@cuda.jit
def one_shuffle(kind, x, operand, out):
    """out[i] = one shuffle of x[i] with lane i's operand[i] and the full mask."""
    i = cuda.threadIdx.x
    if kind == IDX:
        out[i] = cuda.shfl_sync(FULL, x[i], operand[i])
    elif kind == UP:
        out[i] = cuda.shfl_up_sync(FULL, x[i], operand[i])
    elif kind == DOWN:
        out[i] = cuda.shfl_down_sync(FULL, x[i], operand[i])
    else:
        out[i] = cuda.shfl_xor_sync(FULL, x[i], operand[i])


def shuffled(kind: int, x: np.ndarray, operand) -> np.ndarray:
    """one_shuffle's out in a block of len(x) threads, every lane with `operand`."""
    out = np.zeros_like(x)
    operands = np.full(len(x), operand, np.int32)
    assert launch(one_shuffle, 1, len(x), kind, x, operands, out) is None
    return out


@cuda.jit
def xor_butterfly(x, first, out):
    """out[i] = x[i] summed over rounds of shfl_xor_sync with first, first / 2, ..., 1."""
    i = cuda.threadIdx.x
    v = x[i]
    offset = first
    while offset > 0:
        v += cuda.shfl_xor_sync(FULL, v, offset)
        offset //= 2
    out[i] = v


@cuda.jit
def down_reduction(x, out):
    """out[i] = x[i] + shfl_down_sync by 16, 8, 4, 2, 1: lane 0 holds the warp's sum."""
    i = cuda.threadIdx.x
    v = x[i]
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(FULL, v, offset)
        offset //= 2
    out[i] = v


@cuda.jit
def up_scan(x, out):
    """out[i] = x[0] + ... + x[i] of the lane's warp (Hillis-Steele with shfl_up_sync)."""
    i = cuda.threadIdx.x
    lane = cuda.laneid
    v = x[i]
    offset = 1
    while offset < 32:
        below = cuda.shfl_up_sync(FULL, v, offset)
        if lane >= offset:
            v += below
        offset *= 2
    out[i] = v


def test_xor_butterfly_gives_every_lane_the_sum_of_32():
    x = np.arange(32, dtype=np.float32) * 0.5
    out = np.zeros_like(x)
    assert launch(xor_butterfly, 1, 32, x, 16, out) is None
    np.testing.assert_array_equal(out, np.full(32, 248.0, np.float32))  # 0.5 * (0 + ... + 31)
    np.testing.assert_array_equal(shuffled(XOR, x, 5), x[LANES ^ 5])


def test_shfl_down_reduces_to_lane_0_and_keeps_its_own_value_past_lane_31():
    x = np.arange(1, 33, dtype=np.int32)
    out = np.zeros_like(x)
    assert launch(down_reduction, 1, 32, x, out) is None
    assert out[0] == 528  # 1 + ... + 32
    expected = x.copy()  # the same rounds in NumPy: lane i + offset > 31 reads its own
    for offset in (16, 8, 4, 2, 1):
        expected = expected + np.where(LANES + offset < 32, np.roll(expected, -offset), expected)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(shuffled(DOWN, x, 3), np.r_[x[3:], x[29:]])


def test_shfl_up_scans_and_keeps_its_own_value_below_lane_0():
    x = np.arange(1, 33, dtype=np.int64)
    out = np.zeros_like(x)
    assert launch(up_scan, 1, 32, x, out) is None
    np.testing.assert_array_equal(out, np.cumsum(x))
    np.testing.assert_array_equal(shuffled(UP, x, 5), np.r_[x[:5], x[:27]])
    np.testing.assert_array_equal(shuffled(UP, x, 32), x)  # delta's low 5 bits: 0


def test_shfl_sync_broadcasts_lane_k_and_takes_src_lane_modulo_32():
    x = np.arange(100, 132, dtype=np.int32)
    np.testing.assert_array_equal(shuffled(IDX, x, 7), np.full(32, 107))
    np.testing.assert_array_equal(shuffled(IDX, x, 7 + 32), np.full(32, 107))
    np.testing.assert_array_equal(shuffled(IDX, x, 33), np.full(32, 101))
    out = np.zeros_like(x)
    assert launch(one_shuffle, 1, 32, IDX, x, (LANES + 1) % 32, out) is None  # rotate
    np.testing.assert_array_equal(out, np.roll(x, -1))


@cuda.jit
def votes(x, ballots, flags, counts):
    """Lane i's ballot of odd x, all/any/eq of x >= 0, x > 30, x > 99 and all of x > 1,
    and popc of the ballot."""
    i = cuda.threadIdx.x
    ballot = cuda.ballot_sync(FULL, x[i] % 2 == 1)
    ballots[i] = ballot
    flags[0, i] = cuda.all_sync(FULL, x[i] >= 0)
    flags[1, i] = cuda.any_sync(FULL, x[i] > 30)
    flags[2, i] = cuda.eq_sync(FULL, x[i] > 99)
    flags[3, i] = cuda.all_sync(FULL, x[i] > 1)
    counts[i] = cuda.popc(ballot)


@cuda.jit
def ballot_into(out):
    """out[i] = the ballot of odd lanes, stored into an array of out's type."""
    i = cuda.threadIdx.x
    out[i] = cuda.ballot_sync(FULL, i % 2)


def test_ballot_of_lane_parity_and_the_votes():
    x = np.arange(32, dtype=np.int32)  # odd on odd lanes, lane 31 among them
    ballots = np.zeros(32, np.int64)
    flags = np.zeros((4, 32), np.bool_)
    counts = np.zeros(32, np.int32)
    assert launch(votes, 1, 32, x, ballots, flags, counts) is None
    np.testing.assert_array_equal(ballots, -0x55555556)  # 0xAAAAAAAA as numba's int32
    np.testing.assert_array_equal(flags.T, [[True, True, True, False]] * 32)
    np.testing.assert_array_equal(counts, 16)  # numba's own popc counts 1 (bin(-...))
    x[:] = 0x55555555 >> LANES & 1  # odd on even lanes: no sign bit
    assert launch(votes, 1, 32, x, ballots, flags, counts) is None
    np.testing.assert_array_equal(ballots, 0x55555555)
    for dtype, expected in ((np.uint32, 0xAAAAAAAA), (np.int32, -0x55555556)):
        out = np.zeros(32, dtype)
        assert launch(ballot_into, 1, 32, out) is None
        np.testing.assert_array_equal(out, expected)


@cuda.jit
def warp_masks(out):
    """out[:, i]: lane i's ballot of True, activemask and lanemask_lt."""
    i = cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x
    out[0, i] = cuda.ballot_sync(FULL, True)
    out[1, i] = cuda.activemask()
    out[2, i] = cuda.lanemask_lt()


def test_a_16_thread_block_is_a_partial_warp_whose_absent_lanes_are_left_out():
    x = np.arange(16, dtype=np.float32)
    out = np.zeros_like(x)
    assert launch(xor_butterfly, 1, 16, x, 8, out) is None  # the full mask: 16 lanes meet
    np.testing.assert_array_equal(out, np.full(16, 120.0, np.float32))
    np.testing.assert_array_equal(shuffled(XOR, x, 16), x)  # lane ^ 16 is absent: its own
    np.testing.assert_array_equal(shuffled(DOWN, x, 4), np.r_[x[4:], x[12:]])
    np.testing.assert_array_equal(shuffled(IDX, x, 20), x)  # lane 20 is absent
    masks = np.zeros((3, 16), np.int64)
    assert launch(warp_masks, 1, 16, masks) is None
    np.testing.assert_array_equal(masks[0], 0xFFFF)  # ballot of every lane present
    np.testing.assert_array_equal(masks[1], 0xFFFF)  # activemask
    np.testing.assert_array_equal(masks[2], (1 << np.arange(16)) - 1)  # lanemask_lt


def test_a_64_thread_block_has_two_warps_that_exchange_independently():
    x = np.arange(64, dtype=np.int32)
    out = np.zeros_like(x)
    assert launch(xor_butterfly, 1, 64, x, 16, out) is None
    np.testing.assert_array_equal(out, np.repeat([496, 1520], 32))  # 0..31, 32..63
    np.testing.assert_array_equal(shuffled(IDX, x, 3), np.repeat([3, 35], 32))
    np.testing.assert_array_equal(shuffled(DOWN, x, 1), np.r_[x[1:32], 31, x[33:], 63])


@cuda.jit
def lanes_2d(x, out, lanes):
    """A 2-D block: lane (x + y * bx) % 32 reads the linear id one above (shfl_down_sync by
    1) and lane 9's (shfl_sync); lanes[0] holds laneid, lanes[1] the linear id."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    v = x[ty, tx]
    out[0, ty, tx] = cuda.shfl_down_sync(FULL, v, 1)
    out[1, ty, tx] = cuda.shfl_sync(FULL, v, 9)
    lanes[0, ty, tx] = cuda.laneid
    lanes[1, ty, tx] = tx + ty * cuda.blockDim.x


@pytest.mark.parametrize("shape", [(8, 8), (5, 7)])  # (x, y): 64 threads, and 32 + 3
def test_2d_blocks_take_lanes_in_linear_order(shape):
    linear = np.arange(shape[0] * shape[1]).reshape(shape[::-1])  # [y, x]: x + y * bx
    x = (10 * linear).astype(np.int32)
    out = np.zeros((2, *x.shape), np.int32)
    lanes = np.zeros((2, *x.shape), np.int32)
    assert launch(lanes_2d, 1, shape, x, out, lanes) is None
    np.testing.assert_array_equal(lanes[1], linear)
    np.testing.assert_array_equal(lanes[0], linear % 32)
    present = lambda lane: (lane < linear.size) & (lane // 32 == linear // 32)  # noqa: E731
    above = np.where(present(linear + 1), linear + 1, linear)  # its own past its warp's end
    np.testing.assert_array_equal(out[0], 10 * above)
    lane_9 = linear // 32 * 32 + 9
    np.testing.assert_array_equal(out[1], 10 * np.where(present(lane_9), lane_9, linear))
    masks = np.zeros((3, 12), np.int64)
    assert launch(warp_masks, 1, (4, 3), masks) is None  # a 4 x 3 block: 12 lanes
    np.testing.assert_array_equal(masks[:2], 0xFFF)


@cuda.jit
def shuffle_types(x, seen):
    """seen[i] = (the types of lane i's shfl_sync result and of its value)."""
    i = cuda.threadIdx.x
    r = cuda.shfl_xor_sync(FULL, x[i], 1)
    seen[i] = type(r), type(x[i])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_a_shuffle_keeps_the_values_type(dtype):
    x = (np.arange(32) * 1.25).astype(dtype)
    seen = [None] * 32  # the simulator runs a kernel as Python: it may fill a list
    assert launch(shuffle_types, 1, 32, x, seen) is None
    assert seen == [(dtype, dtype)] * 32
    np.testing.assert_array_equal(shuffled(XOR, x, 1), x[LANES ^ 1])


@cuda.jit
def half_warp(x, out, upper_mask):
    """Lanes 0-15 sum x over themselves with mask 0x0000ffff (a round of xor 16 first:
    lane ^ 16 is not in the mask, so it reads its own); lanes 16-31 do the same with
    `upper_mask` when it is not 0, and otherwise return without a warp primitive."""
    i = cuda.threadIdx.x
    mask = 0x0000FFFF
    if i >= 16:
        if upper_mask == 0:
            return
        mask = upper_mask
    v = x[i]
    v = cuda.shfl_xor_sync(mask, v, 16)
    offset = 8
    while offset > 0:
        v += cuda.shfl_xor_sync(mask, v, offset)
        offset //= 2
    out[i] = v


def test_a_mask_of_half_the_warp_meets_only_those_lanes():
    x = np.arange(32, dtype=np.int32)
    out = np.full(32, -1, np.int32)
    assert launch(half_warp, 1, 32, x, out, 0) is None  # lanes 16-31 return at once
    np.testing.assert_array_equal(out, np.r_[np.full(16, 120), np.full(16, -1)])
    assert launch(half_warp, 1, 32, x, out, 0xFFFF0000) is None  # two halves at once
    np.testing.assert_array_equal(out, np.repeat([120, 376], 16))


@cuda.jit
def divergent(out, gone):
    """Lanes from `gone` on return at once; the others write activemask in one of two
    branches (even and odd lanes), then activemask, a ballot and match_any_sync of
    lane % 3 under that mask, and syncwarp."""
    i = cuda.threadIdx.x
    if i >= gone:
        return
    if i % 2 == 0:
        out[0, i] = cuda.activemask()
    else:
        out[0, i] = cuda.activemask()
    mask = cuda.activemask()
    out[1, i] = mask
    out[2, i] = cuda.ballot_sync(mask, True)
    out[3, i] = cuda.match_any_sync(mask, i % 3)
    cuda.syncwarp(mask)


def test_activemask_gives_each_branch_its_lanes_and_leaves_out_lanes_that_returned():
    out = np.zeros((4, 32), np.int64)
    assert launch(divergent, 1, 32, out, 32) is None
    np.testing.assert_array_equal(out[0], np.tile([0x55555555, 0xAAAAAAAA], 16))
    np.testing.assert_array_equal(out[1], FULL)
    np.testing.assert_array_equal(out[2], -1)  # int32
    by_lane_mod_3 = [0x49249249, 0x92492492 - 2**32, 0x24924924]  # int32: lane 31's is < 0
    np.testing.assert_array_equal(out[3], np.tile(by_lane_mod_3, 11)[:32])
    out[:] = 0
    assert launch(divergent, 1, 32, out, 20) is None  # lanes 20-31 return first
    np.testing.assert_array_equal(out[1, :20], 0xFFFFF)
    np.testing.assert_array_equal(out[0, :20], np.tile([0x55555, 0xAAAAA], 10))


@cuda.jit
def match_all(x, out):
    i = cuda.threadIdx.x
    mask, same = cuda.match_all_sync(FULL, x[i])
    out[0, i] = mask
    out[1, i] = same


def test_match_all_sync_compares_the_values_bits():
    x = np.zeros(32, np.float32)
    out = np.zeros((2, 32), np.int64)
    assert launch(match_all, 1, 32, x, out) is None
    np.testing.assert_array_equal(out, [[-1] * 32, [1] * 32])
    x[5] = -0.0  # == 0.0, but not its bits
    assert launch(match_all, 1, 32, x, out) is None
    np.testing.assert_array_equal(out, 0)


@cuda.jit
def warp_then_block_sum(x, out):
    """out[0] = the sum of x over a 64-thread block: each warp sums by shfl_down_sync, its
    lane 0 writes a shared slot, a syncthreads, thread 0 adds the two slots."""
    partial = cuda.shared.array(2, np.int32)
    i = cuda.threadIdx.x
    v = x[i]
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(FULL, v, offset)
        offset //= 2
    if cuda.laneid == 0:
        partial[i // 32] = v
    cuda.syncthreads()
    if i == 0:
        out[0] = partial[0] + partial[1]


def test_shuffles_shared_memory_and_syncthreads_together():
    x = np.arange(64, dtype=np.int32)
    out = np.zeros(1, np.int32)
    assert launch(warp_then_block_sum, 2, 64, x, out) is None
    assert out[0] == 2016


# -- errors instead of hangs ---------------------------------------------------------------


@cuda.jit
def lane_31_returns(out):
    i = cuda.threadIdx.x
    if i == 31:
        return
    out[i] = cuda.shfl_down_sync(FULL, i, 1)


@cuda.jit
def half_in_syncthreads(out):
    i = cuda.threadIdx.x
    if i < 16:
        cuda.syncthreads()
    else:
        out[i] = cuda.shfl_down_sync(FULL, i, 1)


@cuda.jit
def upper_lanes_outside_their_mask(out):
    i = cuda.threadIdx.x
    out[i] = cuda.shfl_sync(0x0000FFFF, i, 0)


@cuda.jit
def two_primitives_one_mask(out):
    i = cuda.threadIdx.x
    if i % 2:
        out[i] = cuda.ballot_sync(FULL, True)
    else:
        out[i] = cuda.shfl_sync(FULL, i, 0)


@cuda.jit
def masks_in_a_ring(out):
    """Lane i of a 3-thread block waits for lane i + 1 with mask {i, i + 1}: no mask meets."""
    i = cuda.threadIdx.x
    out[i] = cuda.ballot_sync((1 << i) | (1 << (i + 1) % 3), True)


@cuda.jit
def lane_3_fails(out):
    i = cuda.threadIdx.x
    if i == 3:
        out[40] = 0  # past the end, before the shuffle the other lanes wait at
    out[i] = cuda.shfl_sync(FULL, i, 0)


def test_a_lane_of_the_mask_that_returns_early_is_an_error_not_a_hang():
    error = launch(lane_31_returns, 1, 32, np.zeros(32, np.int32))
    assert isinstance(error, RuntimeError)
    assert "shfl_down_sync(mask=0xffffffff) in warp 0 of block (0, 0, 0): " in str(error)
    assert "lane 31 (returned from the kernel)" in str(error)  # others may not have come yet
    test_xor_butterfly_gives_every_lane_the_sum_of_32()  # the next launch works


def test_a_lane_waiting_in_syncthreads_is_an_error_raised_in_the_launch():
    error = launch(half_in_syncthreads, 1, 32, np.zeros(32, np.int32))
    assert isinstance(error, RuntimeError)
    assert str(error) == (
        "warp primitives deadlocked: shfl_down_sync(mask=0xffffffff) in warp 0 of block "
        "(0, 0, 0): lanes 16-31 wait for lanes 0-15 (waiting in syncthreads)"
    )
    test_shuffles_shared_memory_and_syncthreads_together()


def test_a_caller_outside_its_mask_and_two_primitives_on_one_mask_are_errors():
    error = launch(upper_lanes_outside_their_mask, 1, 32, np.zeros(32, np.int32))
    assert isinstance(error, RuntimeError)
    assert "shfl_sync: lane 16 of warp 0 calls it with mask 0x0000ffff" in str(error)
    error = launch(two_primitives_one_mask, 1, 32, np.zeros(32, np.int64))
    assert isinstance(error, RuntimeError)
    assert "call different primitives: " in str(error)
    assert "lanes 0, 2, 4" in str(error) and "shfl_sync" in str(error)


def test_lanes_waiting_at_meetings_of_different_masks_are_an_error_raised_in_the_launch():
    error = launch(masks_in_a_ring, 1, 3, np.zeros(3, np.int32))
    assert isinstance(error, RuntimeError)
    assert str(error) == "warp primitives deadlocked: " + "; ".join(
        f"ballot_sync(mask={mask:#010x}) in warp 0 of block (0, 0, 0): lane {lane} waits for "
        f"lane {(lane + 1) % 3} (waiting at ballot_sync, mask {next_mask:#010x})"
        for mask, lane, next_mask in sorted(
            [(0b011, 0, 0b110), (0b110, 1, 0b101), (0b101, 2, 0b011)]
        )
    )


def test_a_threads_exception_reaches_the_launch_while_the_others_wait_at_a_shuffle():
    error = launch(lane_3_fails, 1, 32, np.zeros(32, np.int32))
    assert isinstance(error, IndexError)
    assert "tid=[3, 0, 0]" in str(error)


# -- install and uninstall -----------------------------------------------------------------


@cuda.jit
def calls_shfl_sync(out):
    out[0] = cuda.shfl_sync(FULL, 1, 0)


def test_uninstall_takes_the_primitives_off_and_install_puts_them_back():
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    from numbakv.cache import simulator_warp

    fixed_popc = FakeCUDAModule.popc
    simulator.uninstall()
    try:
        for name in set(simulator_warp.PATCHES) - {"popc"}:
            assert not hasattr(FakeCUDAModule, name), name
        assert FakeCUDAModule.popc is not fixed_popc  # numba's own
        with pytest.raises(AttributeError, match="shfl_sync"):
            calls_shfl_sync[1, 1](np.zeros(1, np.int32))
    finally:
        simulator.install()
    for name, function in simulator_warp.PATCHES.items():
        assert getattr(FakeCUDAModule, name) is function
    out = np.zeros(1, np.int32)
    calls_shfl_sync[1, 1](out)
    assert out[0] == 1
