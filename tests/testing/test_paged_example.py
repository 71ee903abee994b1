"""examples/paged_cache.py against the reference: the same random workloads give the same
ids, positions, errors, capacity and attention; each planted bug shows on a short script
(an op script run by `run_script`, or direct calls beside the reference where the op
format cannot say it) and, but for two, on the random workload."""

import numpy as np
import pytest
from example_caches import load_example

from numbakv.core.config import TOLERANCE, CacheConfig
from numbakv.core.errors import CacheError, ConfigError, StepError
from numbakv.reference import CellCache
from numbakv.testing import Divergence, Op, run_script
from numbakv.testing.protocol import CacheUnderTest, StepLike

N_HEADS = 4  # query heads: GQA with 2 per KV head


paged = load_example("paged_cache.py")


def make_config(dtype: str = "float32", **fields) -> CacheConfig:
    shape = dict(n_layers=2, n_kv_heads=2, head_dim=8, capacity=40, max_width=6, max_seqs=4)
    return CacheConfig(**{**shape, "windows": (0, 3), "max_seq_len": 24, "dtype": dtype, **fields})


class Pair:
    """A PagedCache and the reference, driven by the same ops and compared after each."""

    def __init__(self, config: CacheConfig, block_size: int, bugs=frozenset(), seed: int = 0):
        self.paged = paged.PagedCache(config, block_size=block_size, bugs=frozenset(bugs))
        self.ref = CellCache(config)
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.steps: list = []  # (paged step, reference step) of every prepared step

    def both(self, call):
        """call(cache) on both caches: the same error class, or both succeed; the results."""
        results, errors = [], []
        for cache in (self.paged, self.ref):
            try:
                results.append(call(cache))
                errors.append(None)
            except CacheError as error:
                results.append(None)
                errors.append(type(error))
        assert errors[0] == errors[1], f"paged raised {errors[0]}, the reference {errors[1]}"
        return None if errors[0] else results

    def run(self, op: tuple) -> None:
        kind, *args = op
        if kind == "step":
            self.step(*args)
        else:
            results = self.both(lambda cache: getattr(cache, kind)(*args))
            if results is not None:
                assert results[0] == results[1], f"{op}: {results[0]} != {results[1]}"
        self.check_state()

    def step(self, seq_ids, width) -> None:
        if self.both(lambda cache: cache.declare_step(seq_ids)) is None:
            return
        steps = self.both(lambda cache: cache.prepare_step(width))
        if steps is None:
            return
        self.steps.append(steps)
        for name in ("positions", "seq_ids"):
            a, b = (getattr(step, name) for step in steps)
            np.testing.assert_array_equal(a, b, err_msg=name)
        assert steps[0].width == steps[1].width and steps[0].n_tokens == steps[1].n_tokens
        width = steps[0].width
        kv_shape = (width, self.config.n_kv_heads, self.config.head_dim)
        for layer in range(self.config.n_layers):
            k, v = self.rng.standard_normal((2, *kv_shape), dtype=np.float32)
            q = self.rng.standard_normal((width, N_HEADS, self.config.head_dim))
            self.both(lambda cache, k=k, v=v, layer=layer: cache.write(layer, k, v))
            mode = ("gathered", "masked")[layer % 2]
            outs = self.both(
                lambda cache, q=q, layer=layer, mode=mode: cache.attend(layer, q, mode=mode)
            )
            assert outs[0].dtype == np.float32 and outs[0].shape == outs[1].shape
            # the same stored K/V (float16 too), attended in float32 by both
            np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=TOLERANCE["float32"])

    def check_state(self) -> None:
        if not self.paged.bugs:
            self.paged.check_invariants()
        assert self.paged.live_seqs == self.ref.live_seqs
        for seq in self.ref.live_seqs:
            assert self.paged.pos(seq) == self.ref.pos(seq), f"pos({seq})"
        assert self.paged.used_cells == self.ref.used_cells
        assert self.paged.free_cells == self.ref.free_cells
        for mine, theirs in self.steps[-2:]:
            assert mine.is_stale == theirs.is_stale


def random_op(rng: np.random.Generator, ref: CellCache) -> tuple:
    """One op, often a refused one: a verb on a random id, or a decode or prefill step."""
    config, live = ref.config, ref.live_seqs
    r = rng.random()
    if not live or r < 0.08:
        return ("seq_new",)
    seq = int(rng.choice(live))
    n = ref.pos(seq)
    if r < 0.22:
        return ("seq_clone", seq) if r < 0.10 else ("seq_clone", seq, int(rng.integers(0, n + 2)))
    if r < 0.30:
        return ("seq_rm", int(rng.integers(0, config.max_seqs + 1)) if r < 0.23 else seq)
    if r < 0.42:
        return ("rewind", seq, int(rng.integers(0, n + 2)))
    if r < 0.43:
        return ("clear",)
    if r < 0.72:  # decode: up to one token per live sequence, in any order
        ids = rng.permutation(live)[: rng.integers(1, len(live) + 1)].tolist()
    else:  # prefill of one sequence, maybe beside decodes; may be too wide
        ids = [seq] * int(rng.integers(2, config.max_width + 1)) + live[: rng.integers(0, 3)]
        ids = rng.permutation(ids).tolist() if rng.random() < 0.5 else ids
    if rng.random() < 0.03:
        ids = [*ids, config.max_seqs]  # not live
    width = None if rng.random() < 0.4 else len(ids) + int(rng.integers(0, 3))
    return ("step", ids, width)


def test_the_example_satisfies_the_protocol():
    cache = paged.PagedCache(make_config())
    assert isinstance(cache, CacheUnderTest)
    cache.declare_step([cache.seq_new()])
    step = cache.prepare_step(width=2)
    assert (step.width, step.n_tokens, step.positions.tolist()) == (2, 1, [0, -1])
    assert isinstance(step, StepLike) and not step.is_stale
    cache.seq_new()  # keeps the step
    assert not step.is_stale
    cache.seq_clone(0)
    assert step.is_stale
    with pytest.raises(StepError):
        _ = step.positions
    with pytest.raises(ConfigError):
        paged.PagedCache(make_config(), bugs=frozenset({"no_such_bug"}))
    with pytest.raises(ConfigError):
        paged.PagedCache(make_config("bfloat16"))


Q = np.zeros((1, N_HEADS, 8))
REFUSALS = [  # each op refused, or not, like the reference: the order of the contract's checks
    ("seq_new",),
    ("seq_new",),
    ("seq_new",),  # every id live
    ("seq_clone", 0, 1),  # upto past pos(0) comes before "every id live"
    ("seq_clone", 5),
    ("step", [0] * 6, None),
    ("step", [0], None),  # past max_seq_len
    ("step", [1] * 4, None),  # the cache is full
    ("step", [0] * 8, None),  # too wide comes before full
    ("step", [1], None),
    ("step", [7], None),
    ("step", [1, 7], None),
    ("step", "ab", None),
    ("step", np.zeros((1, 1), dtype=int), None),
    ("step", [], None),
    ("step", [True], None),
    ("step", [0.0], None),
    ("rewind", 0, 7),
    ("rewind", 0, 1.0),
    ("rewind", 0, -1),
    ("rewind", 0, 6),  # allowed, changes nothing
    ("seq_rm", 2),
    ("seq_rm", True),
    ("attend", 0, Q),  # the step is stale
    ("prepare_step",),  # nothing declared
    ("rewind", 1, 0),
    ("declare_step", [1]),
    ("rewind", 0, 2),  # drops the declaration
    ("prepare_step",),
    ("step", np.array([0, 1], dtype=np.int64), None),
    ("step", (1,), None),
    ("step", range(2), None),
    ("step", [0], 8),
    ("step", [0, 0], 1),
    ("seq_clone", 0, 2),  # every id live
    ("seq_rm", 1),
    ("seq_clone", 0, 2),
    ("step", [1, 0, 1], 5),
]


def test_refusals_come_in_the_reference_order():
    pair = Pair(make_config(capacity=10, max_seq_len=6, max_width=7, max_seqs=2), 4)
    for op in REFUSALS:
        pair.run(op)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_random_workload_matches_the_reference(block_size, dtype):
    pair = Pair(make_config(dtype), block_size, seed=block_size)
    rng = np.random.default_rng([block_size, dtype == "float16"])
    for _ in range(400):
        pair.run(random_op(rng, pair.ref))
    assert len(pair.steps) > 50


def test_a_fork_copies_the_partial_block_and_shares_the_full_ones():
    cache = paged.PagedCache(make_config(), block_size=4)
    a = cache.seq_new()
    cache.declare_step([a] * 6)
    cache.prepare_step()
    b = cache.seq_clone(a)  # positions 0-3 in a shared page, 4-5 copied
    c = cache.seq_clone(b, upto=4)  # exactly one full page: nothing copied
    tables = [cache.block_table(s) for s in (a, b, c)]
    assert tables[0][0] == tables[1][0] == tables[2][0] and len(tables[2]) == 1
    assert tables[0][1] != tables[1][1]
    assert cache.used_cells == 6  # copies count once, like the reference's shared cells
    cache.rewind(a, 2)  # ends inside the shared page: a gets its own copy
    assert cache.block_table(a)[0] not in (tables[1][0],) and cache.used_cells == 6


def test_the_page_pool_doubles_when_full_and_reuses_the_lowest_free_page():
    pool = paged.PagePool(make_config(), block_size=4, n_pages=2)
    assert [pool.alloc(), pool.alloc()] == [0, 1]
    pool.k[:, 1] = 7
    assert pool.alloc() == 2 and pool.refs.tolist() == [1, 1, 1, 0]
    assert (pool.k[:, 1] == 7).all() and pool.k.shape[1] == 4
    assert pool.copy(1, 3) == 3 and (pool.k[:, 3, :3] == 7).all() and (pool.k[:, 3, 3] == 0).all()
    pool.release([0, 3])
    assert pool.alloc() == 0


SCRIPTS = {  # bug: (config fields, block size, ops on which it differs from the reference)
    "window_off_by_one": ({}, 4, [("seq_new",), ("step", [0] * 5, None)]),
    "shared_partial_block": (
        {},
        4,
        [("seq_new",), ("step", [0] * 6, None), ("seq_clone", 0), ("step", [0, 1], None)],
    ),
    "rewind_keeps_one": ({}, 4, [("seq_new",), ("step", [0] * 3, None), ("rewind", 0, 1)]),
    "clone_one_too_many": ({}, 4, [("seq_new",), ("step", [0] * 3, None), ("seq_clone", 0, 1)]),
    "padding_nonzero": ({}, 4, [("seq_new",), ("step", [0], 2)]),
    "gqa_mapping": ({}, 4, [("seq_new",), ("step", [0, 0], None)]),
    # a verb between declare_step and prepare_step: the reference refuses the prepare
    "decl_survives_rm": (
        {},
        4,
        [("seq_new",), ("declare_step", [0] * 3), ("seq_rm", 0), ("seq_new",), ("prepare_step",)],
    ),
    # the pool (ceil(11 / 4) + 4 = 7 pages) grows only once copies hold more pages than
    # that: four sequences each copy the page they shared, then take a page each; the last
    # step's writes to pages 4-6 are lost, so its attention differs
    "stale_table_after_growth": (
        {"capacity": 11, "max_seq_len": 11},
        4,
        [("seq_new",), ("step", [0] * 4, None), *[("seq_clone", 0)] * 3]
        + [("rewind", seq, 3) for seq in range(4)]
        + [("step", [0, 1, 2, 3], None)] * 2,
    ),
}
RANDOM_MISSES = ("decl_survives_rm", "stale_table_after_growth")  # random_op never reaches

# bug: (block size, an op script of at most 6 ops on which it differs from the reference)
WITNESSES = {
    "rewind_to_zero_noop": (4, [Op("seq_new"), Op("step", ((0, 0), None, 1, 0)),
                                Op("rewind", (0, 0))]),
    # used_cells differs once the source is gone: the clone's hold outlived it
    "refcount_leak_on_remove": (4, [Op("seq_new"), Op("step", ((0,) * 4, None, 1, 0)),
                                    Op("seq_clone", (0,)), Op("seq_rm", (1,)),
                                    Op("seq_rm", (0,))]),
    # the new sequence 0 reads position 0 from the old table's page 0, which seq 1 holds
    "reused_id_inherits": (1, [Op("seq_new"), Op("step", ((0, 0), None, 1, 0)),
                               Op("seq_clone", (0,)), Op("seq_rm", (0,)), Op("seq_new"),
                               Op("step", ((0,), None, 1, 1))]),
    "window_off_by_one_at_edge": (4, [Op("seq_new"), Op("step", ((0, 0, 0), None, 1, 0))]),
    "decl_survives_rm": (4, [Op("seq_new"), Op("declare", ((0, 0, 0),)), Op("seq_rm", (0,)),
                             Op("seq_new"), Op("prepare", (None,))]),
}  # fmt: skip


class Opaque(paged.PagedCache):
    """The paged cache without its `check_invariants`: only the protocol shows a bug."""

    check_invariants = None


def test_every_bug_has_a_script():
    assert set(SCRIPTS) | set(WITNESSES) == set(paged.BUGS)
    assert all(len(ops) <= 6 for _, ops in WITNESSES.values())


@pytest.mark.parametrize("bug", sorted(WITNESSES))
def test_each_witness_passes_without_its_bug_and_diverges_with_it(bug):
    block_size, ops = WITNESSES[bug]
    config = make_config()
    run_script(lambda config: paged.PagedCache(config, block_size), config, ops)
    with pytest.raises(Divergence) as caught:
        run_script(lambda config: Opaque(config, block_size, frozenset({bug})), config, ops)
    assert caught.value.index == len(ops) - 1  # at the script's last op, not before


def test_the_pool_grows_in_the_growth_script():
    fields, block_size, ops = SCRIPTS["stale_table_after_growth"]
    pair = Pair(make_config(**fields), block_size)
    before = pair.paged.n_pages
    for op in ops:
        pair.run(op)
    config = pair.config
    assert before == -(-config.initial_cells // block_size) < pair.paged.n_pages
    assert pair.paged.used_cells == 11


@pytest.mark.parametrize("bug", sorted(SCRIPTS))
def test_each_planted_bug_shows(bug):
    fields, block_size, ops = SCRIPTS[bug]
    correct = Pair(make_config(**fields), block_size)
    for op in ops:
        correct.run(op)
    buggy = Pair(make_config(**fields), block_size, bugs={bug})
    with pytest.raises(AssertionError):
        for op in ops:
            buggy.run(op)


@pytest.mark.parametrize("bug", sorted(set(paged.BUGS) - set(RANDOM_MISSES)))
def test_the_random_workload_finds_each_bug(bug):
    pair = Pair(make_config(), 3, bugs={bug}, seed=3)
    rng = np.random.default_rng([3, 7])
    with pytest.raises(AssertionError):
        for _ in range(400):
            pair.run(random_op(rng, pair.ref))
