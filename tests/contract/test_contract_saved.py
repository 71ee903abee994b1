"""Saved sequences (docs/contract.md §13) on both caches: `seq_save` / `seq_load` round trips
in every storage format, into fragmented pools and through growth, with windows shorter
than the sequence; the restored sequence attends as the original, bit for bit; every
refusal changes nothing.

The reports of other runtimes' users this holds numbakv to: a round trip of a sliding-window
cache that breaks once the prompt is longer than the window; a restore into a fragmented
cache refused although enough cells are free; a failed restore that leaves corrupted K/V.
"""

import numpy as np
import pytest

from numbakv.core.arrays import as_host
from numbakv.core.errors import (
    AllocationError,
    CapacityError,
    ConfigError,
    SequenceError,
    StateError,
)
from numbakv.core.formats import FORMATS
from numbakv.core.seq_state import SeqState

from helpers import full_state, step_with

HEAD_DIM = 32  # the smallest head_dim of q8_0 and q4_0 blocks
WINDOWS = (0, 3)  # the second layer's window is shorter than every saved sequence here
SCALES = (((0.5,), (2.0,)), ((0.25,), (1.0,)))  # fp8's per-layer (K, V) scales


def config_of(k_dtype: str, v_dtype: str | None = None, **overrides) -> dict:
    fields = dict(head_dim=HEAD_DIM, windows=WINDOWS, k_dtype=k_dtype, v_dtype=v_dtype or k_dtype,
                  capacity=24, initial_cells=2, max_width=6)  # fmt: skip
    if "fp8_e4m3" in (k_dtype, v_dtype):
        fields["fp8_scales"] = SCALES
    fields.update(overrides)
    return fields


def run(cache, seq_ids, seed: int, same: bool = False, attend: bool = True) -> list[np.ndarray]:
    """One step of `seq_ids` with K/V and q drawn from `seed` (one row for every token when
    `same`); per layer the host output (none unless `attend`)."""
    step = step_with(cache, seq_ids)
    rng = np.random.default_rng(seed)
    c = cache.config
    rows = 1 if same else step.width
    outs = []
    for layer in range(c.n_layers):
        k, v, q = (
            np.repeat(rng.standard_normal((rows, c.n_kv_heads, c.head_dim)), step.width // rows, 0)
            .astype(np.float32) for _ in range(3)
        )  # fmt: skip
        cache.write(layer, k, v)
        if attend:
            outs.append(as_host(cache.attend(layer, q)))
    return outs


def fragmented(cache) -> int:
    """A sequence of 7 positions written across holes left by two removed ones; returns it."""
    a, b, c = cache.seq_new(), cache.seq_new(), cache.seq_new()
    run(cache, [a, b, a, c, b, a], seed=1, attend=False)
    run(cache, [c, a, b], seed=2, attend=False)
    cache.seq_rm(b)
    run(cache, [a, a, c, a], seed=3, attend=False)
    cache.seq_rm(c)
    return a


def test_a_round_trip_restores_every_byte_and_the_attention(impl):
    pairs = tuple((k, FORMATS[(i + 1) % len(FORMATS)]) for i, k in enumerate(FORMATS))
    fields = config_of("float32", n_layers=len(pairs), windows=WINDOWS * 3, layer_dtypes=pairs,
                       fp8_scales=0.5)  # fmt: skip
    cache = impl.cache(**fields)  # every format as K and as V, K and V apart
    seq = fragmented(cache)
    state = cache.seq_save(seq)
    assert (state.start, state.end) == (0, cache.pos(seq)) and state.end > max(WINDOWS)
    assert state.geometry.formats == pairs
    copy = cache.seq_load(state)  # into the holes first, then past read_len
    assert cache.pos(copy) == cache.pos(seq)
    assert cache.seq_save(copy) == state
    cache.check_invariants()
    # the next step of both: same K/V and q rows for each, so the same attention, bit for bit
    outs = run(cache, [seq, copy], seed=4, same=True)
    for out in outs:
        np.testing.assert_array_equal(out[0], out[1])


def test_a_partial_state_appends_to_a_clone_of_its_prefix(impl):
    cache = impl.cache(**config_of("q8_0"))
    seq = fragmented(cache)
    tail = cache.seq_save(seq, start=4)
    assert (tail.start, tail.n_tokens) == (4, cache.pos(seq) - 4)
    copy = cache.seq_load(tail, onto=seq)
    assert cache.seq_save(copy) == cache.seq_save(seq)
    shared = set(cache.snapshot().owners_of(0))
    assert {seq, copy} <= shared or cache.snapshot().n_owners.max() == 2
    outs = run(cache, [seq, copy], seed=5, same=True)
    for out in outs:
        np.testing.assert_array_equal(out[0], out[1])


def test_a_load_grows_the_pool_first(impl):
    source = impl.cache(**config_of("float16"))
    seq = fragmented(source)
    state = source.seq_save(seq)
    cache = impl.cache(**config_of("float16", initial_cells=1))
    cache.seq_new()
    run(cache, [0], seed=6, attend=False)
    assert cache.rows == 1
    copy = cache.seq_load(state)
    assert cache.rows >= 1 + state.n_tokens and cache.growth_count >= 1
    assert cache.seq_save(copy) == state


def test_an_empty_sequence_saves_and_loads(impl):
    cache = impl.cache(**config_of("float32"))
    state = cache.seq_save(cache.seq_new())
    assert state.n_tokens == 0 and state.nbytes == 0
    copy = cache.seq_load(state)
    assert cache.pos(copy) == 0 and cache.seq_save(copy) == state


@pytest.mark.parametrize("target", ["float16", "bfloat16", "q8_0", "q4_0", "fp8_e4m3"])
def test_convert_re_stores_a_float32_state_as_a_write_would(impl, target):
    source = impl.cache(**config_of("float32"))
    seq = source.seq_new()
    rng = np.random.default_rng(7)
    c = source.config
    step_with(source, [seq] * 5)
    kv = [rng.standard_normal((5, c.n_kv_heads, HEAD_DIM)).astype(np.float32) for _ in range(4)]
    for layer in range(c.n_layers):
        source.write(layer, kv[2 * layer], kv[2 * layer + 1])
    state = source.seq_save(seq)
    cache = impl.cache(**config_of(target))
    with pytest.raises(ConfigError, match="convert=True"):
        cache.seq_load(state)
    copy = cache.seq_load(state, convert=True)
    written = impl.cache(**config_of(target))
    step_with(written, [written.seq_new()] * 5)
    for layer in range(c.n_layers):
        written.write(layer, kv[2 * layer], kv[2 * layer + 1])
    assert cache.seq_save(copy) == written.seq_save(0)


def test_a_quantized_state_never_converts(impl):
    cache = impl.cache(**config_of("q8_0"))
    seq = cache.seq_new()
    run(cache, [seq] * 3, seed=8, attend=False)
    state = cache.seq_save(seq)
    other = impl.cache(**config_of("float16"))
    before = full_state(other)
    with pytest.raises(ConfigError, match="quantized K/V loads only into its own format"):
        other.seq_load(state, convert=True)
    assert full_state(other) == before


def refusals(impl):
    """(name, the cache, a call that must be refused, its error, a pattern of its message)."""
    cache = impl.cache(**config_of("q4_0", "float16"))
    seq = fragmented(cache)
    state = cache.seq_save(seq)
    tail = cache.seq_save(seq, start=5)
    foreign = {
        "n_kv_heads": config_of("q4_0", "float16", n_kv_heads=2),
        "head_dim": config_of("q4_0", "float16", head_dim=64),
        "windows": config_of("q4_0", "float16", windows=(0, 4)),
        "n_layers": config_of("q4_0", "float16", n_layers=3, windows=(0, 3, 0)),
        "formats": config_of("q8_0", "float16"),
    }
    cases = [(f"geometry {name}", impl.cache(**fields), state, {}, ConfigError, name.rstrip("s"))
             for name, fields in foreign.items()]  # fmt: skip
    cases += [
        ("a start past the end", cache, None, {"start": 8}, SequenceError, "start"),
        ("a tail without onto", cache, tail, {}, SequenceError, "onto="),
        ("onto too short", cache, tail, {"onto": cache.seq_new()}, SequenceError, "onto="),
        ("onto not live", cache, tail, {"onto": 3}, SequenceError, "3"),
        ("convert not a bool", cache, state, {"convert": 1}, ConfigError, "convert"),
        ("not a state", cache, "state.npz", {}, ConfigError, "SeqState"),
    ]
    full = impl.cache(**config_of("q4_0", "float16", capacity=8))
    full.seq_new()
    run(full, [0] * 5, seed=9, attend=False)
    cases.append(("too few free cells", full, state, {}, CapacityError, "free"))
    ids = impl.cache(**config_of("q4_0", "float16", max_seqs=1))
    ids.seq_new()
    cases.append(("no free id", ids, state, {}, CapacityError, "ids are live"))
    short = impl.cache(**config_of("q4_0", "float16", max_seq_len=6))
    cases.append(("past max_seq_len", short, state, {}, CapacityError, "max_seq_len"))
    damaged = cache.seq_save(seq)
    object.__setattr__(damaged, "k", damaged.k[:1])
    cases.append(("a damaged state", cache, damaged, {}, StateError, "tuple of 2"))
    return [(name, c, seq, s, kw, e, m) for name, c, s, kw, e, m in cases]


def test_every_refused_load_or_save_changes_nothing(impl):
    for name, cache, seq, state, keywords, error, pattern in refusals(impl):
        before = full_state(cache)
        with pytest.raises(error, match=pattern):
            if state is None:
                cache.seq_save(seq, **keywords)
            else:
                cache.seq_load(state, **keywords)
        assert full_state(cache) == before, name


def test_a_refused_growth_changes_nothing(impl):
    source = impl.cache(**config_of("bfloat16"))
    state = source.seq_save(fragmented(source))
    allocator = impl.flaky_allocator()
    cache = impl.cache(allocator, **config_of("bfloat16", initial_cells=1))
    cache.seq_new()
    run(cache, [0], seed=10, attend=False)
    before = full_state(cache)
    allocator.fail_after = 0
    with pytest.raises(AllocationError):
        cache.seq_load(state)
    assert full_state(cache) == before
    allocator.fail_after = None
    assert cache.seq_save(cache.seq_load(state)) == state


def test_a_state_is_read_only_and_equal_by_bytes(impl):
    cache = impl.cache(**config_of("fp8_e4m3"))
    seq = fragmented(cache)
    state = cache.seq_save(seq)
    assert isinstance(state, SeqState) and state == cache.seq_save(seq)
    with pytest.raises(ValueError):
        state.k[0][0, 0, 0] = 1
    assert state != cache.seq_save(seq, start=1)
