"""`examples/cow_cache.py`, pages of 16 shared by forks and copied on the first write into a
page another table holds, off a LIFO free list, with saved sequences: each of its planted
bugs is caught by a hand-written witness of at most 6 ops and by its hazard of
`check_cache` (kind "reload", `block_size=16`); the correct cache passes the kit's default
run, a long random walk of forks, rewinds and reloads, and trades states with the
reference. `python -m benchmarks.kit_power` measures the kit on it under five seeds."""

import numpy as np
import pytest
from example_caches import assert_witness, load_example, step

from numbakv.core.config import CacheConfig
from numbakv.core.errors import ConfigError
from numbakv.reference import CellCache
from numbakv.testing import KINDS, CacheUnderTest, Divergence, Op, Runner, check_cache
from numbakv.testing.ops import apply

cow = load_example("cow_cache.py")
RELOAD = (*KINDS, "reload")
KIT = dict(kinds=RELOAD, block_size=16)  # its saved sequences, its pages' hazard spans


def make_config(**fields) -> CacheConfig:
    shape = dict(n_layers=1, n_kv_heads=2, head_dim=4, capacity=40, max_width=16, max_seqs=3)
    return CacheConfig(**{**shape, **fields})


BASE = make_config()  # a whole page in one step
WINDOWED = make_config(windows=(2,))


NEW, ONE, CLONE = Op("seq_new"), step([0]), Op("seq_clone", (0, None))
WITNESSES = {  # bug: (config, ops), the bug showing at the last op
    # a whole-page fork sets no flag: the parent's rewound token lands in the clone's page
    "cow_by_flag": (BASE, [NEW, step([0] * 16), CLONE, Op("rewind", (0, 5)), ONE, step([1])]),
    "cow_copies_k_only": (BASE, [NEW, step([0, 0]), Op("seq_clone", (0, 1)), step([1])]),
    "window_whole_blocks": (WINDOWED, [NEW, step([0, 0, 0])]),
    "clone_upto_zero_all": (BASE, [NEW, ONE, Op("seq_clone", (0, 0))]),
    # the freed page, still sequence 0's, is the next one handed out: sequence 1 writes it
    "rm_frees_shared": (BASE, [NEW, NEW, ONE, CLONE, Op("seq_rm", (2,)), step([1, 0])]),
    # the tail (positions 1, 2) lands in slots 0, 1 of the clone's copy of page 0
    "load_tail_misplaced": (BASE, [NEW, step([0, 0, 0]), Op("reload", (0, 1)), step([1])]),
}


CATCHERS = {  # bug: the hazard that catches it first in a default run (benchmarks.kit_power)
    "cow_by_flag": "rewind-into-shared",  # a whole-page fork, the parent rewound into it
    "cow_copies_k_only": "fork-partial-then-append",
    "window_whole_blocks": "fork-partial-then-append",
    "clone_upto_zero_all": "fork-partial-then-append",
    "rm_frees_shared": "id-reuse-after-removal",
    "load_tail_misplaced": "reload-into-holes",
}


def test_every_planted_bug_has_one_witness_and_one_catcher():
    assert sorted(WITNESSES) == sorted(CATCHERS) == sorted(cow.BUGS)


@pytest.mark.parametrize("bug", sorted(WITNESSES))
def test_each_op_script_witness_catches_its_bug(bug):
    assert_witness(cow.CowCache, *WITNESSES[bug], bug)


@pytest.mark.parametrize("bug", sorted(CATCHERS))
def test_the_kit_catches_each_bug_by_its_hazard(bug):
    hazard = CATCHERS[bug]
    with pytest.raises(Divergence, match=f"^hazard '{hazard}'") as caught:
        check_cache(lambda config: cow.CowCache(config, bugs=frozenset({bug})),
                    hazards=[hazard], max_examples=0, **KIT)  # fmt: skip
    assert len(caught.value.ops) <= 6


def test_the_correct_cache_passes_the_kit_and_reaches_every_refusal():
    coverage = check_cache(cow.CowCache, report=True, **KIT)
    assert coverage.verbs["reload"] > 0 and not coverage.etiquette  # strict=True would pass
    assert coverage.unexplained == [] and coverage.unreached == []


def test_forks_share_every_page_and_copy_one_on_its_first_write():
    cache = cow.CowCache(BASE)
    assert isinstance(cache, CacheUnderTest)
    for op in (NEW, step([0] * 16), step([0] * 4)):
        apply(cache, op, BASE)
    a = cache.seq_clone(0, 18)  # pages 0 and 1, the partial one too
    assert cache._tables[a] == cache._tables[0] == [0, 1]
    assert cache._pages.refs.tolist()[:2] == [2, 2]
    apply(cache, step([a]), BASE)  # the clone's position 18 goes into a copy of page 1
    assert cache._tables[a] == [0, 2] and cache._pages.refs.tolist()[:3] == [2, 1, 1]
    apply(cache, step([0]), BASE)  # page 1 is the parent's alone again: written in place
    assert cache._tables[0] == [0, 1]
    cache.seq_rm(a)  # page 2 freed; LIFO: the next page handed out
    b = cache.seq_new()
    apply(cache, step([b]), BASE)
    assert cache._tables[b] == [2]
    cache.check_invariants()
    cache._pages.free.append(0)  # a held page on the free list
    with pytest.raises(AssertionError, match="free list"):
        cache.check_invariants()


def random_op(rng: np.random.Generator, reference: CellCache) -> Op:
    """A verb, a reload or a whole step on the present state: forks at any offset (inside
    pages), rewinds into shared pages, prefills of whole pages beside decodes."""
    live, r = reference.live_seqs, rng.random()
    if not live or r < 0.08:
        return Op("seq_new")
    seq = int(rng.choice(live))
    n = reference.pos(seq)
    if r < 0.25:
        return Op("seq_clone", (seq, int(rng.integers(0, n + 1))))
    if r < 0.32:
        return Op("seq_rm", (seq,))
    if r < 0.45:
        return Op("rewind", (seq, int(rng.integers(0, n + 1))))
    if r < 0.55:
        return Op("reload", (seq, int(rng.integers(0, n + 1))))
    ids = rng.choice(live, int(rng.integers(1, 4))).tolist()
    if r < 0.7:
        ids += [seq] * int(rng.integers(4, 12))
    return step(ids, len(ids) + int(rng.integers(0, 2)), int(rng.choice([1, 2])),
                *(("masked",) if r < 0.8 else ()))  # fmt: skip


@pytest.mark.parametrize("block_size", [16, 3])
def test_a_random_walk_of_forks_rewinds_and_reloads_holds_to_the_reference(block_size):
    copies, config = [], make_config(n_layers=2, windows=(0, 5), capacity=64, max_seqs=4,
                                     max_seq_len=40, initial_cells=8, dtype="float16")  # fmt: skip

    class Watched(cow.CowCache):
        def _place(self, seq: int) -> tuple[int, int]:
            table = self._tables[seq]
            last = table[-1] if table else None
            page, slot = super()._place(seq)
            copies.append(slot > 0 and page != last)
            return page, slot

    runner = Runner(lambda c: Watched(c, block_size=block_size), config)
    rng = np.random.default_rng(block_size)
    for _ in range(500):
        runner.run(random_op(rng, runner.reference))
    assert sum(copies) >= 15, f"{sum(copies)} copies on write"
    assert len(runner.cache._pages.refs) > -(-8 // block_size)  # the pool grew


def test_saved_sequences_cross_to_the_reference_and_back():
    config = make_config(n_layers=2, windows=(0, 2), capacity=64, max_seqs=4, dtype="float16")
    cache, reference = cow.CowCache(config), CellCache(config)
    for target in (cache, reference):
        for op in (NEW, step([0] * 12), Op("seq_clone", (0, 7)), step([1] * 11)):
            apply(target, op, config)
    state = cache.seq_save(1, start=5)
    assert state == reference.seq_save(1, start=5)
    for target in (cache, reference):  # a tail onto its prefix, then a whole sequence
        assert target.seq_load(state, onto=1) == 2 and target.seq_load(reference.seq_save(0)) == 3
    assert cache.seq_save(2) == reference.seq_save(2) and cache.seq_save(3) == reference.seq_save(3)
    whole, wide = cache.seq_save(0), make_config(n_layers=2, windows=(0, 2))  # float32
    loaded = [target(wide) for target in (cow.CowCache, CellCache)]
    for target in loaded:  # float16 entries re-stored as float32
        assert target.seq_load(whole, convert=True) == 0
    assert loaded[0].seq_save(0) == loaded[1].seq_save(0)
    with pytest.raises(ConfigError, match="convert=True"):
        loaded[0].seq_load(whole)


def test_the_example_refuses_what_it_cannot_do():
    with pytest.raises(ConfigError):
        cow.CowCache(BASE, frozenset({"no_such_bug"}))
    with pytest.raises(ConfigError):
        cow.CowCache(make_config(dtype="bfloat16"))
    with pytest.raises(ConfigError, match="formats"):
        cow.CowCache(make_config(v_dtype="float16"))
    with pytest.raises(ConfigError):
        cow.CowCache(BASE, block_size=0)
