"""The device step as a GPU runtime uses it: the step's stream, `out=`, masks written only
when read, and the bindings a recorded step depends on (docs/contract.md §3, §4). Counts of
launches, copies and allocations are in test_launch_budget.py."""

import numpy as np
import pytest
from test_device_cache import ForeignStream, foreign_stream

import numbakv
from numbakv.cache.cuda import IS_SIMULATOR, cuda
from numbakv.cache.kernels import step_buffer
from numbakv.core.errors import BindingError, StepError
from numbakv.reference import CellCache as RefCache

from helpers import full_state, small_config, step_with

POISON = 0xAB  # what the masks hold before a step that must not write them


def two_sequences(cache, width=None):
    a, b = cache.seq_new(), cache.seq_new()
    return step_with(cache, [a, a, b], width)


def kv(width: int, cfg, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = (width, cfg.n_kv_heads, cfg.head_dim)
    return rng.standard_normal((2, *shape)).astype(np.float32)


class TorchLike:  # torch.cuda.Stream before it had __cuda_stream__
    def __init__(self, handle: int):
        self.cuda_stream = handle


class CupyLike:  # cupy.cuda.Stream
    def __init__(self, handle: int):
        self.ptr = handle


class BadProtocol:
    def __cuda_stream__(self):
        raise RuntimeError("no stream today")


@pytest.mark.parametrize(
    "stream",
    ["stream", True, -3, 2.5, BadProtocol(), ForeignStream("not a handle")],
    ids=["str", "bool", "negative", "float", "raising", "bad-handle"],
)
def test_a_bad_stream_is_refused_and_changes_nothing(stream):
    cache = numbakv.CellCache(small_config())
    two_sequences(cache)
    cache.declare_step([0, 1])
    before, own = full_state(cache), cache.stream
    with pytest.raises(StepError, match="stream"):
        cache.prepare_step(stream=stream)
    assert full_state(cache) == before
    assert cache.stream is own
    assert cache.prepare_step().n_tokens == 2  # the declaration is still pending


def test_each_step_runs_on_its_stream_and_verbs_follow_it():
    cache = numbakv.CellCache(small_config())
    own = cache.stream
    assert two_sequences(cache).stream is own
    mine = cuda.stream()
    cache.declare_step([0, 1])
    step = cache.prepare_step(stream=mine)
    assert step.stream is mine and cache.stream is mine
    cache.rewind(0, 1)  # verbs run on the stream in use
    assert cache.stream is mine
    foreign = foreign_stream()
    cache.declare_step([0])
    first = cache.prepare_step(stream=foreign).stream
    cache.declare_step([1])
    assert cache.prepare_step(stream=ForeignStream(foreign.handle)).stream is first
    for other in (TorchLike(foreign.handle), CupyLike(foreign.handle), foreign.handle):
        cache.declare_step([1])
        assert cache.prepare_step(stream=other).stream is first
    cache.declare_step([1])
    assert cache.prepare_step().stream is own
    cache.check_invariants()


def test_results_are_the_same_on_every_stream():
    cfg = small_config(n_kv_heads=2)
    outs = []
    for stream in (None, cuda.stream(), foreign_stream()):
        cache = numbakv.CellCache(cfg)
        step = two_sequences(cache, width=4)
        cache.declare_step([0, 1])
        step = cache.prepare_step(width=3, stream=stream)
        k, v = kv(step.width, cfg)
        cache.write(0, k, v)
        outs.append(cache.attend(0, np.concatenate([k, k], axis=1)).copy_to_host())
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])


def test_attend_writes_into_out_and_returns_it():
    cfg = small_config()
    device, reference = numbakv.CellCache(cfg), RefCache(cfg)
    for cache in (device, reference):
        step = two_sequences(cache)
    k, v = kv(step.width, cfg)
    device.write(1, cuda.to_device(k), cuda.to_device(v))
    reference.write(1, k, v)
    out = cuda.to_device(np.full((3, 1, 4), np.nan, np.float32))
    for mode in ("gathered", "masked"):
        assert device.attend(1, cuda.to_device(k), mode=mode, out=out) is out
        np.testing.assert_allclose(out.copy_to_host(), reference.attend(1, k), atol=1e-6)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: np.zeros((3, 1, 4), np.float32), "out is a ndarray"),
        (lambda: cuda.device_array((2, 1, 4), np.float32), r"out has shape \(2, 1, 4\)"),
        (lambda: cuda.device_array((3, 1, 4), np.float64), "float64"),
        (lambda: cuda.device_array((3, 4, 1), np.float32).T.T[:, :, :1], "shape"),
        (lambda: cuda.device_array((4, 3, 1), np.float32).T, "strides"),
    ],
    ids=["host", "shape", "dtype", "heads", "strided"],
)
def test_a_bad_out_is_refused_and_nothing_is_written(make, match):
    cfg = small_config()
    cache = numbakv.CellCache(cfg)
    step = two_sequences(cache)
    cache.write(0, *kv(step.width, cfg))
    out = make()
    before = full_state(cache)
    with pytest.raises(StepError, match=match):
        cache.attend(0, np.ones((3, 1, 4), np.float32), out=out)
    assert full_state(cache) == before


def poison_masks(cache) -> None:
    for mask in cache.buffers.masks.values():
        mask.copy_to_device(np.full(mask.shape, POISON, np.uint8))


def poisoned_windows(cache) -> set[int]:
    return {w for w, mask in cache.buffers.masks.items() if (mask.copy_to_host() == POISON).all()}


def test_gathered_steps_write_no_mask_and_the_first_read_writes_all_once():
    cfg = small_config(n_layers=3, windows=(0, 2, 0))
    cache = numbakv.CellCache(cfg)
    reference = RefCache(cfg)
    two_sequences(reference)
    poison_masks(cache)
    step = two_sequences(cache)
    for layer in range(cfg.n_layers):
        cache.write(layer, *kv(step.width, cfg))
        cache.attend(layer, np.ones((3, 1, 4), np.float32))
    assert poisoned_windows(cache) == {0, 2}  # gathered: no mask written
    np.testing.assert_array_equal(step.mask(2), reference._step.mask(2))
    assert poisoned_windows(cache) == set()  # one launch wrote every window's mask
    poison_masks(cache)  # ... once per step: later reads and masked attends write none
    cache.attend(0, np.ones((3, 1, 4), np.float32), mode="masked")
    assert (step.mask(0) == POISON).all()
    assert poisoned_windows(cache) == {0, 2}


def test_a_new_step_writes_its_masks_again():
    cfg = small_config()
    cache, reference = numbakv.CellCache(cfg), RefCache(cfg)
    for c in (cache, reference):
        two_sequences(c).mask(0)  # the first step writes window 0's mask
        step_with(c, [1, 0])
    poison_masks(cache)
    assert cache._stepper.progress.current().mask(0).tolist() == reference._step.mask(0).tolist()


def test_bindings_name_the_growth_and_refuse_another_cache():
    cfg = small_config(initial_cells=4, capacity=16)
    cache = numbakv.CellCache(cfg)
    empty = cache.bindings()
    assert empty.rows == 0 and set(empty.pool) == {0}
    two_sequences(cache)
    bindings = cache.bindings()
    cache.check_bindings(bindings)
    step_with(cache, [0])
    cache.seq_clone(0)
    cache.check_bindings(bindings)  # steps and verbs move nothing
    with pytest.raises(BindingError, match="pool grew from 0 to 4 rows at generation 1"):
        cache.check_bindings(empty)
    step_with(cache, [0, 1, 2])
    with pytest.raises(BindingError, match="pool grew from 4 to 8 rows at generation 2"):
        cache.check_bindings(bindings)
    with pytest.raises(BindingError, match="another cache"):
        numbakv.CellCache(cfg).check_bindings(cache.bindings())
    with pytest.raises(BindingError, match="got dict"):
        cache.check_bindings({})


def test_returned_arrays_carry_the_step_stream():
    # on a GPU they export it through __cuda_array_interface__ (torch, CuPy wrap them without
    # a copy); the simulator's arrays have no interface, but the same stream
    cfg = small_config()
    cache = numbakv.CellCache(cfg)
    two_sequences(cache)
    mine = cuda.stream()
    cache.declare_step([0, 1])
    step = cache.prepare_step(stream=mine)
    cache.write(0, *kv(step.width, cfg))
    out = cache.attend(0, np.ones((2, 1, 4), np.float32))
    assert out.stream is mine
    if not IS_SIMULATOR:
        assert out.__cuda_array_interface__["stream"] == int(mine)


def test_the_host_table_places_into_the_step_buffer_rows():
    # HostTable.place writes a step's cells, positions and ids into rows 0, 1, 2 of the
    # pinned slot: the step buffer's layout must keep them there
    assert (step_buffer.CELLS, step_buffer.POSITIONS, step_buffer.SEQ_IDS) == (0, 1, 2)
