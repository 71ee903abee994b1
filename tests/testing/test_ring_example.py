"""`examples/ring_cache.py`, a llama.cpp-style unified ring of cells: each of its planted
bugs is caught by a hand-written witness of at most 6 ops (or by direct calls compared with
the reference), the correct cache passes every witness and a long random walk that wraps
round; the kit's default run on it is tests/testing/test_bug_corpus.py's."""

import numpy as np
import pytest
from example_caches import (
    agree,
    assert_witness,
    load_example,
    pending_declaration,
    scaled_attention,
    step,
)

from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.reference import CellCache
from numbakv.testing import CacheUnderTest, Op, Runner
from numbakv.testing.ops import apply

ring = load_example("ring_cache.py")


def make_config(**fields) -> CacheConfig:
    shape = dict(n_layers=1, n_kv_heads=2, head_dim=4, capacity=8, max_width=4, max_seqs=3)
    return CacheConfig(**{**shape, **fields})


BASE = make_config()
WINDOWED = make_config(windows=(2,))
SMALL = make_config(capacity=4)  # a ring short enough to wrap within a few ops
RING = make_config(n_layers=2, capacity=6, max_width=3, windows=(0, 2), dtype="float16")


NEW, ONE = Op("seq_new"), step([0])
WITNESSES = {  # bug: (config, ops), the bug showing at the last op
    "reused_id_inherits": (BASE, [NEW, ONE, Op("seq_clone", (0, None)), Op("seq_rm", (0,)), NEW]),
    "rm_frees_shared": (BASE, [NEW, ONE, Op("seq_clone", (0, None)), Op("seq_rm", (0,))]),
    "clone_one_short": (BASE, [NEW, step([0, 0]), Op("seq_clone", (0, 2))]),
    "rewind_to_zero_noop": (BASE, [NEW, ONE, Op("rewind", (0, 0))]),
    # cells 0-2, head 3; cells 1-2 freed; two tokens: cells 3 and 1, not 3 and (owned) 0
    "head_wrap_overwrite": (SMALL, [NEW, step([0, 0, 0]), Op("rewind", (0, 1)), step([0, 0])]),
    "capacity_off_by_one": (SMALL, [NEW, step([0] * 4)]),
    # the token goes into cell 3, the ring's last; the padding row's cell -1 is cell 3 too
    "padding_kv_written": (SMALL, [NEW, step([0, 0, 0]), step([0], 2)]),
    "window_off_by_one_at_edge": (WINDOWED, [NEW, step([0, 0, 0])]),
    "gqa_mapping": (BASE, [NEW, step([0], None, 2)]),
    "masked_mode_differs": (WINDOWED, [NEW, step([0, 0, 0], None, 1, "masked")]),
    "clear_keeps_owners": (BASE, [NEW, ONE, Op("clear")]),
    "step_never_stale": (BASE, [NEW, ONE, Op("seq_clone", (0, None))]),
}


DIRECT = {  # bugs no op script of today's kit can show: a verb between declare and prepare,
    "decl_survives_rm": pending_declaration,  # attend with a scale
    "scale_ignored": scaled_attention,
}


def test_every_planted_bug_has_one_witness():
    assert len(ring.BUGS) >= 9
    assert sorted({*WITNESSES, *DIRECT}) == sorted(ring.BUGS)
    assert not set(WITNESSES) & set(DIRECT)


def random_op(rng: np.random.Generator, reference) -> Op:
    """A verb or a whole step (so every placed position is written) on a small ring: the
    ring fills, frees cells behind its head and wraps round over them."""
    live, r = reference.live_seqs, rng.random()
    if not live or r < 0.1:
        return Op("seq_new")
    seq = int(rng.choice(live))
    if r < 0.2:
        return Op("seq_clone", (seq, int(rng.integers(0, reference.pos(seq) + 1))))
    if r < 0.3:
        return Op("seq_rm", (seq,))
    if r < 0.45:
        return Op("rewind", (seq, int(rng.integers(0, reference.pos(seq) + 1))))
    ids = rng.choice(live, int(rng.integers(1, 4))).tolist()
    return step(ids, len(ids) + int(rng.integers(0, 2)), int(rng.choice([1, 2])),
                *(("masked",) if r < 0.7 else ()))  # fmt: skip


def test_the_ring_wraps_round_and_still_holds_to_the_reference():
    wraps = []

    class Watched(ring.RingCache):
        def _find_cells(self, n: int) -> list[int]:
            cells = super()._find_cells(n)
            wraps.append(cells != sorted(cells) or cells[0] < self.head)
            return cells

    runner = Runner(Watched, RING)
    rng = np.random.default_rng(7)
    for _ in range(600):
        runner.run(random_op(rng, runner.reference))
    assert sum(wraps) >= 20, f"{sum(wraps)} of {len(wraps)} placements wrapped"


@pytest.mark.parametrize("bug", sorted(WITNESSES))
def test_each_op_script_witness_catches_its_bug(bug):
    assert_witness(ring.RingCache, *WITNESSES[bug], bug)


@pytest.mark.parametrize("bug", sorted(DIRECT))
def test_each_direct_witness_catches_its_bug(bug):
    assert agree(ring.RingCache, BASE, DIRECT[bug])
    assert not agree(ring.RingCache, BASE, DIRECT[bug], frozenset({bug}))


def test_the_ring_places_round_from_its_head_unlike_the_reference():
    config, ops = WITNESSES["head_wrap_overwrite"]
    cells = []
    for cache in (CellCache(config), ring.RingCache(config)):
        for op in ops[:-1]:
            apply(cache, op, config)
        cache.declare_step([0, 0])
        cells.append(cache.prepare_step().cells.tolist())
        assert cache.used_cells == 3 and cache.pos(0) == 3
    assert cells == [[1, 2], [3, 1]]


def test_the_example_satisfies_the_protocol_and_refuses_what_it_cannot_do():
    cache = ring.RingCache(make_config(dtype="float16"))
    assert isinstance(cache, CacheUnderTest) and cache.k.dtype == np.float16
    cache.declare_step([cache.seq_new()])
    assert cache.prepare_step(width=2).positions.tolist() == [0, -1]
    cache.cell_pos[5] = 3  # a position without an owner
    with pytest.raises(AssertionError, match="cells \\[5\\]"):
        cache.check_invariants()
    with pytest.raises(ConfigError):
        ring.RingCache(BASE, frozenset({"no_such_bug"}))
    with pytest.raises(ConfigError):
        ring.RingCache(make_config(dtype="bfloat16"))
    with pytest.raises(ConfigError, match="formats"):  # one format for every K and V, or none
        ring.RingCache(make_config(v_dtype="float16"))
