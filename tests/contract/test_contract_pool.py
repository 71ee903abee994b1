"""The pool of docs/contract.md §4 on both implementations: the growth rule, bit-exact live rows,
transactional growth."""

import numpy as np
import pytest

from numbakv.core.errors import AllocationError

from helpers import as_storage, full_state, step_with


def decode(cache, seq: int, n: int, rows_seen: list[int]) -> None:
    for _ in range(n):
        step_with(cache, [seq])
        rows_seen.append(cache.rows)


def test_growth_rule_doubles_and_caps(impl):
    cache = impl.cache(capacity=20, max_width=8, initial_cells=4)
    a = cache.seq_new()
    rows_seen = []
    decode(cache, a, 20, rows_seen)
    assert sorted(set(rows_seen)) == [4, 8, 16, 20]
    assert rows_seen[:5] == [4, 4, 4, 4, 8]
    assert cache.growth_count == 3 and cache.generation == 4


def test_first_allocation_takes_what_the_step_needs(impl):
    cache = impl.cache(capacity=64, max_width=16, initial_cells=4)
    a = cache.seq_new()
    step_with(cache, [a] * 10)
    assert (cache.rows, cache.growth_count, cache.generation) == (10, 0, 1)


def test_wide_step_jumps_straight_to_what_it_needs(impl):
    cache = impl.cache(capacity=64, max_width=16, initial_cells=4)
    a = cache.seq_new()
    step_with(cache, [a] * 3)
    step_with(cache, [a] * 16)  # needs 3 + 16 = 19 > 2 * 4
    assert (cache.rows, cache.growth_count) == (19, 1)
    step_with(cache, [a] * 16)  # needs 35 < 2 * 19
    assert cache.rows == 38


def test_growth_reaches_for_declared_tokens_not_padding(impl):
    cache = impl.cache(capacity=64, max_width=16, initial_cells=4)
    a = cache.seq_new()
    step_with(cache, [a], width=16)
    assert cache.rows == 4


def test_no_growth_while_holes_are_enough_but_reach_counts(impl):
    # growth is decided before placement: it reaches read_len + n even if holes would do
    cache = impl.cache(capacity=64, max_width=8, initial_cells=8)
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a] * 4 + [b] * 4)
    cache.seq_rm(a)
    step_with(cache, [b] * 4)  # lands in the holes 0..3, but the pool grew to reach 12
    assert cache.read_len == 8 and cache.rows == 16


def test_allocated_bytes(impl):
    cache = impl.cache(n_layers=3, n_kv_heads=2, head_dim=5, windows=None, dtype="float16")
    a = cache.seq_new()
    step_with(cache, [a] * 3)
    assert cache.allocated_bytes == cache.rows * 3 * 2 * 2 * 5 * 2


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_live_rows_survive_growth_bit_exact(impl, dtype):
    rng = np.random.default_rng(0)
    cache = impl.cache(capacity=64, initial_cells=2, dtype=dtype)
    a, b = cache.seq_new(), cache.seq_new()
    written = {}
    for step_no in range(12):
        step = step_with(cache, [a, b] if step_no % 3 else [a, b, a, b, b])
        for layer in range(2):
            k, v = rng.standard_normal((2, step.width, 1, 4)).astype(np.float32)
            cache.write(layer, k, v)
            for t, cell in enumerate(step.cells.tolist()):
                written[layer, cell] = (as_storage(k[t], dtype), as_storage(v[t], dtype))
    assert cache.growth_count >= 3
    for (layer, cell), (k, v) in written.items():
        k_pool, v_pool = cache.pool_kv(layer)
        assert k_pool.dtype == cache.config.storage_dtype
        assert k_pool[cell].tobytes() == k.tobytes() and v_pool[cell].tobytes() == v.tobytes()


@pytest.mark.parametrize("error", [MemoryError, AllocationError])
@pytest.mark.parametrize("fail_after", [0, 1, 3])  # first K, a later K, a V array
def test_failed_growth_changes_nothing_and_may_be_retried(impl, error, fail_after):
    allocator = impl.flaky_allocator(error)
    cache = impl.cache(allocator, capacity=32, initial_cells=4)
    a = cache.seq_new()
    step_with(cache, [a] * 4)
    x = np.arange(16, dtype=np.float32).reshape(4, 1, 4)
    cache.write(0, x, x)
    cache.declare_step([a] * 3)
    before = full_state(cache)
    allocator.fail_after = fail_after
    with pytest.raises(AllocationError, match="retry"):
        cache.prepare_step()
    assert full_state(cache) == before
    allocator.fail_after = None
    step = cache.prepare_step()  # the declaration survived the refusal
    assert step.cells.tolist() == [4, 5, 6] and cache.rows == 8
    np.testing.assert_array_equal(cache.pool_kv(0)[0][:4], x)


def test_first_allocation_failure_changes_nothing(impl):
    allocator = impl.flaky_allocator()
    allocator.fail_after = 0
    cache = impl.cache(allocator)
    a = cache.seq_new()
    cache.declare_step([a])
    before = full_state(cache)
    with pytest.raises(AllocationError):
        cache.prepare_step()
    assert full_state(cache) == before and cache.generation == 0


def test_allocation_happens_only_when_growing(impl):
    allocator = impl.flaky_allocator()
    cache = impl.cache(allocator, n_layers=2, capacity=16, initial_cells=8)
    a = cache.seq_new()
    for _ in range(8):
        step_with(cache, [a])
    assert allocator.calls == 2 * 2  # one K and one V per layer, once
