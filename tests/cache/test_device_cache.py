"""The device cache against the reference on the conformance kit's random workloads
(`numbakv.testing.check_cache`; simulator in CI, GPU when lent).

`check_cache(VariedCache, compare="table", ...)` compares after every op: the outcome (the
same refusal), ids, live ids, pos, used and free cells, the host table's snapshot, each
step's cells, positions, seq_ids, width, read_len and every window's mask, attention of
every layer in the step's mode (gathered or masked), every occupied cell's K/V bytes, the
device unchanged by a refusal, the staleness of the last step, and the device's
`check_invariants()` (its mirror included). The hook (`device_state`) adds the reference's
invariants and what only the device has: the mirror copied back (free past read_len),
seq_table, rows / growth_count / generation / allocated_bytes, the full state of both
caches (pool storage and mirror included) unchanged by a refusal, attention within 1e-5 of
the reference's element by element, masks read before any write, and the bindings taken
earlier holding until the pool grows, then raising BindingError.

`VariedCache` runs each step on the cache's own stream, a numba stream or a foreign
(`__cuda_stream__`) one, with K/V and q from the host or the device, attend writing a new
array or `out=`; 64 ids are parked first when max_seqs > 64, so that ids past 63 carry
tokens.
"""

import re
from collections import Counter
from typing import ClassVar

import numpy as np
import pytest

import numbakv
from numbakv import Recorder
from numbakv.cache.cuda import cuda, device_address
from numbakv.cache.kernels.step_buffer import (
    CELLS,
    POSITIONS,
    SCALARS,
    SEQ_IDS,
    columns,
    host_step,
)
from numbakv.core.config import TOLERANCE
from numbakv.core.errors import (
    AllocationError,
    BindingError,
    CapacityError,
    ConfigError,
    SequenceError,
    StepError,
)
from numbakv.core.snapshot import Snapshot
from numbakv.reference import CellCache as RefCache
from numbakv.testing import Op, check_cache

from helpers import assert_close, churn, full_state, small_config, step_with
from table_pair import cells_by_seq


def mirror_snapshot(cache) -> tuple[np.ndarray, np.ndarray]:
    """The device mirror copied back, trimmed to read_len, and the part past it."""
    cell_pos, cell_owners = cache.mirror()
    r = cache.read_len
    return (cell_pos[:r], cell_owners[:r]), (cell_pos[r:], cell_owners[r:])


def assert_same(device, reference) -> None:
    """Table, mirror, pool bookkeeping and occupied K/V bytes of the two caches agree."""
    expect = reference.snapshot()
    assert device.snapshot() == expect
    (pos, owners), (pos_past, owners_past) = mirror_snapshot(device)
    np.testing.assert_array_equal(pos, expect.pos)
    np.testing.assert_array_equal(owners, expect.owners)
    assert (pos_past == -1).all() and (owners_past == 0).all()
    for seq in reference.live_seqs:
        assert device.pos(seq) == reference.pos(seq)
    assert_seq_table(device, expect)
    assert (device.rows, device.growth_count, device.generation, device.allocated_bytes) == (
        reference.rows, reference.growth_count, reference.generation, reference.allocated_bytes
    )  # fmt: skip
    occupied = np.flatnonzero(expect.pos >= 0)
    for layer in range(reference.config.n_layers):
        for got, want in zip(device.pool_kv(layer), reference.pool_kv(layer), strict=True):
            assert got[occupied].tobytes() == want[occupied].tobytes(), layer


def assert_seq_table(device, expect: Snapshot) -> None:
    """seq_cells rows and seq_len equal each sequence's cells in position order."""
    seq_cells, seq_len = device.seq_table()
    for seq, cells in enumerate(cells_by_seq(expect)):
        assert seq_len[seq] == len(cells), seq
        assert seq_cells[seq, : len(cells)].tolist() == cells.tolist(), seq


def assert_same_step(got, expect) -> None:
    np.testing.assert_array_equal(got.cells, expect.cells)
    np.testing.assert_array_equal(got.positions, expect.positions)
    np.testing.assert_array_equal(got.seq_ids, expect.seq_ids)
    assert (got.width, got.read_len, got.windows) == (expect.width, expect.read_len, expect.windows)
    for window in expect.windows:
        np.testing.assert_array_equal(got.mask(window), expect.mask(window))


class ForeignStream:
    """A stream of another library: only `__cuda_stream__` (the simulator gives it a stream
    of its own; a GPU wraps its handle). Holds what owns the handle, so it stays alive."""

    def __init__(self, handle: int, owner=None):
        self.handle, self.owner = handle, owner

    def __cuda_stream__(self):
        return 0, self.handle


def foreign_stream() -> ForeignStream:
    """A real stream's handle behind the protocol on a GPU, a made-up one on the simulator."""
    if numbakv.device_info()["mode"] == "sim":
        return ForeignStream(0x5EED)
    owner = cuda.stream()
    return ForeignStream(int(owner), owner)


class VariedCache:
    """`numbakv.CellCache` whose steps vary with what they are, so that a script replays
    alike: the n-th prepared step runs on stream n % 3 (its own, a numba one, a foreign
    one), and bits of a key made of its cells and width choose K/V from the device, a
    device q attended into `out=`, and every mask read before the writes. What it sees go
    wrong goes to `problems`; the variants run are counted in `VariedCache.runs`, over
    every cache made."""

    runs: ClassVar[Counter] = Counter()

    def __init__(self, config: numbakv.CacheConfig):
        self.cache = numbakv.CellCache(config)
        self.streams = [None, cuda.stream(), foreign_stream()]
        self.n_steps, self.key, self.early_masks, self.problems = 0, 0, {}, []
        self.bindings = self.cache.bindings()
        self.last_state = None  # full state of (the reference, the cache) after the last op

    def __getattr__(self, name: str):
        return getattr(self.cache, name)

    def variant(self, bit: int) -> int:
        return self.key >> bit & 1

    def prepare_step(self, width: int | None = None):
        stream = self.n_steps % 3
        step = self.cache.prepare_step(width, stream=self.streams[stream])
        self.n_steps += 1
        self.key = int(step.cells.sum()) * 5 + step.width
        self.runs[("stream", ("own", "numba", "foreign")[stream])] += 1
        self.runs["ids past 63"] += int(step.seq_ids.max() >= 64)
        self.early_masks = {}
        if self.variant(2):
            self.early_masks = {window: step.mask(window) for window in step.windows}
            self.runs["masks read before the writes"] += 1
        return step

    def write(self, layer: int, k, v) -> None:
        if self.variant(0):
            k, v = cuda.to_device(k), cuda.to_device(v)
        self.runs["K/V from the device" if self.variant(0) else "K/V from the host"] += 1
        self.cache.write(layer, k, v)

    def attend(self, layer: int, q, scale: float | None = None, mode: str = "gathered"):
        self.runs[("attend", mode)] += 1
        if not self.variant(1):
            return self.cache.attend(layer, q, scale, mode)
        out = cuda.device_array(q.shape, np.float32)
        returned = self.cache.attend(layer, cuda.to_device(q), scale, mode, out=out)
        self.runs["attend out="] += 1
        if returned is not out:
            self.problems.append(f"attend({layer}, out=out) returned another array")
        return returned


def device_state(reference, device: VariedCache, op, expected, got) -> None:
    """The hook of `check_cache`: what the kit cannot see of the device (the module
    docstring), asserted after every op."""
    cache = device.cache
    state = full_state(reference), full_state(cache), cache.mirror()
    if got[1] is not None and device.last_state is not None:  # refused: nothing changed
        assert state[:2] == device.last_state[:2], "a refusal changed the full state"
        for now, was in zip(state[2], device.last_state[2], strict=True):
            np.testing.assert_array_equal(now, was)
    device.last_state = state
    assert not device.problems, device.problems
    assert_same(cache, reference)
    reference.check_invariants()
    if cache.generation == device.bindings.generation:
        cache.check_bindings(device.bindings)
    else:
        try:
            cache.check_bindings(device.bindings)
        except BindingError as error:
            assert re.search(r"pool grew from \d+ to \d+ rows", str(error)), error
        else:
            raise AssertionError("bindings taken before the pool grew still hold")
        device.bindings = cache.bindings()
        device.runs["bindings refused after growth"] += 1
    if op.verb == "step" and got[1] is None:
        (step, outs), (their_step, their_outs) = expected[0], got[0]
        assert their_step.windows == step.windows
        for window, mask in device.early_masks.items():
            np.testing.assert_array_equal(mask, step.mask(window))
        for their_out, out in zip(their_outs, outs, strict=True):
            assert_close(their_out, out)


CONFIGS = [  # (max_seqs, windows, dtype, capacity, initial_cells, max_width, max_seq_len)
    small_config(n_layers=len(windows), windows=windows, n_kv_heads=2, head_dim=3,
                 dtype=dtype, max_seqs=max_seqs, capacity=capacity, initial_cells=initial,
                 max_width=max_width, max_seq_len=max_seq_len)
    for max_seqs, windows, dtype, capacity, initial, max_width, max_seq_len in (
        (3, (0,), "float32", 10, 1, 1, 6),
        (66, (0, 2), "float16", 24, 4, 6, 10),
        (3, (1, 3), "bfloat16", 16, 2, 4, 8),
        (66, (1, 3), "float32", 12, 1, 3, 7),
        (3, (0, 2), "bfloat16", 20, 3, 5, 9),
        (66, (0,), "float16", 18, 2, 2, 6),
        (3, (1, 3), "float16", 24, 4, 6, 10),
        (66, (0, 2), "bfloat16", 14, 3, 4, 8),
    )
]  # fmt: skip


# the hook holds the whole pool to the reference's, so every placed cell must be written:
# whole steps and saved sequences reloaded (seq_save then seq_load, docs/contract.md §13)
# only (tests/testing/test_check_cache.py runs the step protocol's hazards)
TABLE_AND_STEPS = ("step", "seq_new", "seq_clone", "rewind", "seq_rm", "clear", "reload")


def parked_and_two_open(config) -> list[Op]:
    """64 ids parked when max_seqs > 64 (the ids under test are past 63), then two open."""
    return [Op("seq_new")] * ((64 if config.max_seqs > 64 else 0) + 2)


def test_the_device_cache_holds_to_the_reference():
    VariedCache.runs.clear()
    coverage = check_cache(VariedCache, compare="table", configs=CONFIGS,
                           prefix=parked_and_two_open, tolerance=TOLERANCE["float32"],
                           check=device_state, hazards=False, kinds=TABLE_AND_STEPS,
                           max_examples=40, max_ops=30, report=True)  # fmt: skip
    assert coverage.verbs["reload"] and coverage.refusals["reload: every id live"]
    ran = set(VariedCache.runs)
    assert {("stream", s) for s in ("own", "numba", "foreign")} <= ran
    assert {("attend", "gathered"), ("attend", "masked"), "attend out="} <= ran
    assert {"K/V from the device", "K/V from the host", "masks read before the writes"} <= ran
    assert VariedCache.runs["bindings refused after growth"] and VariedCache.runs["ids past 63"]


# -- focused cases ---------------------------------------------------------------------


def test_fixed_buffers_never_move():
    cache = numbakv.CellCache(small_config(capacity=32, initial_cells=1))
    before = {name: device_address(buf) for name, buf in cache.buffers.all().items()}
    a = cache.seq_new()
    for _ in range(6):
        step_with(cache, [a] * 5)
    cache.clear()
    after = {name: device_address(buf) for name, buf in cache.buffers.all().items()}
    assert cache.growth_count >= 3
    assert after == before


def test_the_step_buffer_holds_the_step_and_its_rows_are_the_step_arrays():
    # one [4, columns] int32 buffer: the cells, positions and seq_ids views are its rows,
    # and a prepared step leaves its tokens (-1 past them) and width, read_len in it
    cfg = small_config(capacity=32, initial_cells=8)
    cache = numbakv.CellCache(cfg)
    b = cache.buffers
    assert "step" in b.all() and not {"cells", "positions", "seq_ids", "read_len"} & set(b.all())
    assert b.step.shape == (4, columns(cfg.max_width)) and b.step.dtype == np.int32
    row_bytes = b.step.shape[1] * 4
    for row, view in ((CELLS, b.cells), (POSITIONS, b.positions), (SEQ_IDS, b.seq_ids)):
        assert view.shape == (cfg.max_width,)
        assert device_address(view) == device_address(b.step) + row * row_bytes
    a, s = cache.seq_new(), cache.seq_new()
    step_with(cache, [a] * 3)
    step = step_with(cache, [s, a], width=3)
    cuda.synchronize()
    got = b.step.copy_to_host()
    expect = host_step(step.cells, step.positions, step.seq_ids, step.read_len, cfg.max_width)
    np.testing.assert_array_equal(got[:SCALARS], expect[:SCALARS])  # -1 past the width
    assert got[SCALARS, :2].tolist() == [3, step.read_len] == [step.width, cache.read_len]
    np.testing.assert_array_equal(b.cells.copy_to_host()[:3], step.cells)


def test_failed_growth_changes_nothing_on_either_side():
    calls = {"fail": False}

    def flaky(shape, dtype):
        if calls["fail"]:
            raise MemoryError("no device memory")
        return cuda.device_array(shape, dtype)

    cache = numbakv.CellCache(small_config(capacity=32, initial_cells=4), allocator=flaky)
    a = cache.seq_new()
    step_with(cache, [a] * 4)
    cache.write(0, np.ones((4, 1, 4), np.float32), np.ones((4, 1, 4), np.float32))
    cache.declare_step([a] * 3)
    before, mirror_before = full_state(cache), cache.mirror()
    calls["fail"] = True
    with pytest.raises(AllocationError):
        cache.prepare_step()
    assert full_state(cache) == before
    for got, want in zip(cache.mirror(), mirror_before, strict=True):
        np.testing.assert_array_equal(got, want)
    calls["fail"] = False
    assert cache.prepare_step().cells.tolist() == [4, 5, 6]
    np.testing.assert_array_equal(cache.pool_kv(0)[0][:4], 1)


def test_poisoned_buffers_do_not_change_results():
    """Garbage in every unwritten mask place and NaN in every pool row past read_len."""
    cfg = small_config(windows=(0, 2), capacity=24, initial_cells=24)
    device, reference = numbakv.CellCache(cfg), RefCache(cfg)
    kv = np.random.default_rng(2).standard_normal((5, 1, 4)).astype(np.float32)
    for cache in (device, reference):
        a, b = cache.seq_new(), cache.seq_new()
        step_with(cache, [a, b, a, b, a])
        for layer in range(cfg.n_layers):
            cache.write(layer, kv, -kv)
        cache.seq_rm(b)
    for mask in device.buffers.masks.values():
        mask.copy_to_device(np.full(mask.shape, 1, np.uint8))
    for layer in range(cfg.n_layers):
        for pool in (device._pool.k[layer], device._pool.v[layer]):
            poisoned = pool.copy_to_host()
            poisoned[device.read_len :] = np.nan
            pool.copy_to_device(poisoned)
    got, expect = step_with(device, [0, 0], width=4), step_with(reference, [0, 0], width=4)
    assert_same_step(got, expect)
    k = np.arange(4 * 4, dtype=np.float32).reshape(4, 1, 4) / 16
    q = np.random.default_rng(3).standard_normal((4, 2, 4)).astype(np.float32)
    for cache in (device, reference):
        for layer in range(cfg.n_layers):
            cache.write(layer, k, -k)
    assert_same(device, reference)
    for layer in range(cfg.n_layers):
        expect = reference.attend(layer, q)
        for mode in ("masked", "gathered"):
            got = device.attend(layer, q, mode=mode).copy_to_host()
            assert np.isfinite(got).all() and not got[2:].any()  # padding rows give 0
            assert_close(got, expect, mode)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_write_takes_device_arrays_and_casts(dtype):
    cfg = small_config(dtype=dtype)
    device, reference = numbakv.CellCache(cfg), RefCache(cfg)
    rng = np.random.default_rng(1)
    k, v = rng.standard_normal((2, 3, 1, 4)).astype(np.float32)
    for cache in (device, reference):
        step_with(cache, [cache.seq_new()] * 3)
    device.write(0, cuda.to_device(k), cuda.to_device(v))
    reference.write(0, k, v)
    device.write(1, k.astype(np.float64), v.astype(np.float16))
    reference.write(1, k.astype(np.float64), v.astype(np.float16))
    assert_same(device, reference)


def test_bad_write_refused_like_the_reference():
    device, reference = numbakv.CellCache(small_config()), RefCache(small_config())
    for cache in (device, reference):
        step_with(cache, [cache.seq_new()] * 2)
    for args in (
        (0, np.ones((3, 1, 4)), np.ones((2, 1, 4))),
        (5, np.ones((2, 1, 4)), np.ones((2, 1, 4))),
    ):
        for cache in (device, reference):
            with pytest.raises(StepError):
                cache.write(*args)


def test_verbs_refused_like_the_reference():
    device, reference = numbakv.CellCache(small_config()), RefCache(small_config())
    for call, error in (
        (lambda c: c.seq_rm(0), SequenceError),
        (lambda c: c.declare_step([]), StepError),
        (lambda c: c.prepare_step(), StepError),
        (lambda c: [c.seq_new() for _ in range(5)], CapacityError),
    ):
        for cache in (device, reference):
            with pytest.raises(error):
                call(cache)
    assert device.snapshot() == reference.snapshot()
    assert isinstance(device.snapshot(), Snapshot)


def test_recorder_traces_the_device_cache_as_the_reference():
    cfg = small_config(max_seqs=5, capacity=24, initial_cells=2)
    device, reference = numbakv.CellCache(cfg), RefCache(cfg)
    recorders = [Recorder(cache, every_verb=True) for cache in (device, reference)]
    for cache in (device, reference):
        churn(cache, list(range(2, 300, 7)))
    got, expect = (recorder.trace() for recorder in recorders)
    assert got.n_frames == expect.n_frames > 20
    for name, array in expect.arrays.items():
        np.testing.assert_array_equal(got.arrays[name], array, err_msg=name)


def test_a_head_dim_past_the_kernels_is_refused_up_front():
    with pytest.raises(ConfigError, match=r"head_dim=129.*<= 128"):
        numbakv.CellCache(small_config(head_dim=129))
    RefCache(small_config(head_dim=129))  # the reference takes any
