"""The device cache against the reference, rule by rule (simulator in CI, GPU when lent).

After every rule: the host table, the device mirror copied back, the step's arrays,
every window's mask region and every occupied cell's K/V bytes must equal the
reference's; a refused call must raise the same error on both and change neither; the
bindings taken earlier hold until the pool grows, then raise BindingError. Steps run on the
cache's own stream, an explicit numba stream or a foreign (`__cuda_stream__`) one; K/V and
q come from the host or the device; attend writes a new array or `out=`.
"""

import numpy as np
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import numbakv
from numbakv.cache.cuda import cuda, device_address
from numbakv.cache.kernels.step_buffer import (
    CELLS,
    POSITIONS,
    SCALARS,
    SEQ_IDS,
    columns,
    host_step,
)
from numbakv.errors import (
    AllocationError,
    BindingError,
    CacheError,
    CapacityError,
    ConfigError,
    SequenceError,
    StepError,
)
from numbakv.reference import CellCache as RefCache
from numbakv.snapshot import Snapshot
from numbakv.trace import Recorder

from helpers import assert_close, churn, full_state, small_config, step_with


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
    for seq in range(len(expect.live)):
        cells = [c for c in range(expect.read_len) if seq in expect.owners_of(c)]
        cells.sort(key=lambda c: expect.pos[c])
        assert seq_len[seq] == len(cells), seq
        assert seq_cells[seq, : len(cells)].tolist() == cells, seq


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


class DeviceMachine(RuleBasedStateMachine):
    """Same random verbs and steps on the device cache and the reference."""

    @initialize(
        max_seqs=st.sampled_from([3, 66]),
        windows=st.sampled_from([(0,), (0, 2), (1, 3)]),
        dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
        capacity=st.integers(10, 24),
        initial_cells=st.integers(1, 4),
        max_width=st.integers(1, 6),
        max_seq_len=st.integers(6, 10),
    )
    def setup(self, max_seqs, windows, dtype, capacity, initial_cells, max_width, max_seq_len):
        self.cfg = small_config(
            n_layers=len(windows), windows=windows, n_kv_heads=2, head_dim=3, dtype=dtype,
            max_seqs=max_seqs, capacity=capacity, initial_cells=initial_cells, max_width=max_width,
            max_seq_len=max_seq_len,
        )  # fmt: skip
        self.device, self.reference = numbakv.CellCache(self.cfg), RefCache(self.cfg)
        self.rng = np.random.default_rng(0)
        self.streams = [None, cuda.stream(), foreign_stream()]
        self.park_and_start()
        self.bindings = self.device.bindings()

    def park_and_start(self):
        """Parks ids 0..63 when max_seqs > 64, so the sequences under test have ids past
        63, then starts two sequences."""
        for _ in range(64 if self.cfg.max_seqs > 64 else 0):
            self.both(lambda c: c.seq_new())
        for _ in range(2):
            self.both(lambda c: c.seq_new())

    def both(self, verb) -> tuple[bool, object]:
        """Runs `verb` on both caches: (True, the equal results), or (False, None) after the
        same refusal on both with nothing changed."""
        before = full_state(self.reference), full_state(self.device), self.device.mirror()
        try:
            expect = verb(self.reference)
        except CacheError as error:
            with pytest.raises(type(error)):
                verb(self.device)
            assert full_state(self.reference) == before[0]
            assert full_state(self.device) == before[1]
            for got, want in zip(self.device.mirror(), before[2], strict=True):
                np.testing.assert_array_equal(got, want)
            return False, None
        got = verb(self.device)
        assert got == expect
        return True, got

    def live(self) -> list[int]:
        return [s for s in self.reference.live_seqs if self.cfg.max_seqs <= 64 or s >= 64]

    @rule()
    def seq_new(self):
        self.both(lambda c: c.seq_new())

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def seq_clone(self, data):
        src = data.draw(st.sampled_from(self.live()))
        upto = data.draw(st.integers(-1, self.reference.pos(src) + 1))
        self.both(lambda c: c.seq_clone(src, upto))

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def seq_rm(self, data):
        seq = data.draw(st.sampled_from(self.live()))
        self.both(lambda c: c.seq_rm(seq))

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def rewind(self, data):
        seq = data.draw(st.sampled_from(self.live()))
        position = data.draw(st.integers(-1, self.reference.pos(seq) + 1))
        self.both(lambda c: c.rewind(seq, position))

    @rule(seq=st.integers(-2, 70))
    def verb_on_any_id(self, seq):
        self.both(lambda c: c.seq_rm(seq) if seq % 2 else c.rewind(seq, 0))

    @precondition(lambda self: self.reference.used_cells >= self.cfg.capacity // 2)
    @rule()
    def clear(self):
        self.both(lambda c: c.clear())
        self.park_and_start()

    @precondition(lambda self: self.live())
    @rule(data=st.data())
    def step(self, data):
        live = self.live()
        n = data.draw(st.integers(1, self.cfg.max_width + 1))
        seq_ids = data.draw(st.lists(st.sampled_from(live), min_size=n, max_size=n))
        pad = data.draw(st.integers(-1, 2))  # -1: width=None; else a width past the declared
        self.both(lambda c: c.declare_step(seq_ids))
        width = len(seq_ids) + pad if pad >= 0 else None
        prepared, width = self.both(lambda c: self.prepare(c, data, width).width)
        if not prepared:
            return
        self.check_and_write(width, data)
        event("mixed step prepared")

    def prepare(self, cache, data, width):
        """prepare_step(width), on the device on a drawn stream (its own, numba's, foreign)."""
        if cache is self.reference:
            return cache.prepare_step(width)
        choice = data.draw(st.sampled_from(range(len(self.streams))), label="stream")
        event(f"stream {['own', 'numba', 'foreign'][choice]}")
        return cache.prepare_step(width, stream=self.streams[choice])

    def check_and_write(self, width: int, data) -> None:
        """Compares the two steps, then writes the same random K/V (padded rows too), to the
        device from the host or from device arrays."""
        assert_same_step(self.device._step, self.reference._step)
        k, v = self.rng.standard_normal((2, width, self.cfg.n_kv_heads, self.cfg.head_dim))
        k, v = k.astype(np.float32), v.astype(np.float32)
        on_device = data.draw(st.booleans(), label="K/V on the device")
        for layer in range(self.cfg.n_layers):
            if on_device:
                self.device.write(layer, cuda.to_device(k), cuda.to_device(v))
            else:
                self.device.write(layer, k, v)
            self.reference.write(layer, k, v)

    @precondition(lambda self: self.reference._step is not None)
    @rule(data=st.data())
    def attend(self, data):
        """Attention of the current step, one layer, one mode, against the reference."""
        layer = data.draw(st.integers(0, self.cfg.n_layers - 1))
        mode = data.draw(st.sampled_from(["masked", "gathered"]))
        group = data.draw(st.sampled_from([1, 2]))
        width = self.reference._step.width
        q = self.rng.standard_normal((width, group * self.cfg.n_kv_heads, self.cfg.head_dim))
        q = q.astype(np.float32)
        expect = self.reference.attend(layer, q)
        if data.draw(st.booleans(), label="q and out on the device"):
            out = cuda.device_array(q.shape, np.float32)
            returned = self.device.attend(layer, cuda.to_device(q), mode=mode, out=out)
            assert returned is out
            event("attend out=")
        else:
            out = self.device.attend(layer, q, mode=mode)
        assert_close(out.copy_to_host(), expect)
        event(f"attend {mode}")

    @precondition(lambda self: self.reference._step is not None)
    @rule(data=st.data())
    def read_mask(self, data):
        """step.mask(w) in any step, gathered or masked, before or after its attends."""
        windows = self.reference._step.windows
        window = data.draw(st.sampled_from(windows))
        np.testing.assert_array_equal(
            self.device._step.mask(window), self.reference._step.mask(window)
        )

    @precondition(lambda self: self.live())
    @rule(width=st.integers(0, 2), data=st.data())
    def decode_all(self, width, data):
        """One token for each live sequence under test, padded by `width` rows."""
        seq_ids = self.live()[: self.cfg.max_width]
        self.both(lambda c: c.declare_step(seq_ids))
        width = len(seq_ids) + width
        prepared, width = self.both(lambda c: self.prepare(c, data, width).width)
        if prepared:
            self.check_and_write(width, data)
            event("decode step prepared")

    @invariant()
    def same_state(self):
        if hasattr(self, "device"):
            assert_same(self.device, self.reference)
            self.device.check_invariants()
            self.reference.check_invariants()

    @invariant()
    def bindings_hold_until_the_pool_moves(self):
        if not hasattr(self, "device"):
            return
        if self.device.generation == self.bindings.generation:
            self.device.check_bindings(self.bindings)
            return
        with pytest.raises(BindingError, match=r"pool grew from \d+ to \d+ rows"):
            self.device.check_bindings(self.bindings)
        self.bindings = self.device.bindings()
        event("bindings refused after growth")


TestDeviceMachine = DeviceMachine.TestCase
TestDeviceMachine.settings = settings(max_examples=60, stateful_step_count=30)


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
