"""Hazards that scale with the layout (docs/contract.md §12.2): the fork, rewind and reload
hazards cut at 0, 1, N-1, N, N+1, 2N-1, 2N and 2N+1 positions of a block size N (16 and 32
by default, `check_cache(block_size=N)` for another) wherever a config has room, and the
default configs have room for 32; so a block-16 cache that copies on write by a flag set
at partial forks is caught. The reload hazard appends after its onto-reload in every
default config, and a reload onto a sequence that misplaces the tail is caught by it."""

import numpy as np
import pytest
from example_caches import load_example

from numbakv.core.config import CacheConfig
from numbakv.core.seq_state import SeqState
from numbakv.reference import CellCache
from numbakv.testing import DEFAULT_CONFIGS, KINDS, Divergence, check_cache
from numbakv.testing.hazards import edges, reload_into_holes, scripts
from numbakv.testing.ops import apply

LONG = CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, capacity=133, max_width=64,
                   max_seqs=3, max_seq_len=131)  # fmt: skip
FORKS = ("fork-partial-then-append", "fork-whole-then-append", "rewind-into-shared")


def cut(config: CacheConfig, block_size=None) -> dict[str, set]:
    """What the fork hazards cut at: the offsets of partial forks, the lengths of whole
    ones, and (length, position) of each rewind into a whole fork."""
    found = {name: set() for name in FORKS}
    for name, _, ops in scripts(config, names=FORKS, block_size=block_size):
        clone = next(i for i, op in enumerate(ops) if op.verb == "seq_clone")
        length = sum(len(op.args[0]) for op in ops[:clone] if op.verb == "step")
        upto = ops[clone].args[1]
        if name == "rewind-into-shared":
            found[name].add((length, ops[clone + 1].args[1]))
        else:
            found[name].add(length if upto is None else upto)
    return found


@pytest.mark.parametrize(("config", "block_size", "sizes"),
                         [(DEFAULT_CONFIGS[4], None, (16, 32)), (LONG, 24, (24,)),
                          (LONG, 64, (64,))])  # fmt: skip
def test_the_fork_hazards_cut_at_the_edges_of_each_block_size(config, block_size, sizes):
    found = cut(config, block_size)
    for n in sizes:
        assert edges(n) <= found["fork-partial-then-append"]
        assert edges(n) <= found["fork-whole-then-append"]
        for length in (2 * n, 2 * n + 1):  # two whole blocks, and a partial third
            inside = {(length, p) for p in (n - 1, n, n + 1, 2 * n - 1, 2 * n)}
            assert inside <= found["rewind-into-shared"]
    assert set(range(18)) <= found["fork-partial-then-append"]  # every block size to 8


def test_the_default_configs_have_room_for_blocks_of_16_and_32():
    reached = set().union(*(cut(config)["fork-whole-then-append"] for config in DEFAULT_CONFIGS))
    assert edges(16) | edges(32) <= reached


def test_a_block_size_without_room_or_not_an_int_is_refused():
    with pytest.raises(ValueError, match="max_seq_len >= 131 and capacity >= 133"):
        check_cache(CellCache, block_size=64)
    for bad in (0, "16", 2.0, True):
        with pytest.raises(ValueError, match="block_size="):
            check_cache(CellCache, block_size=bad)
    check_cache(CellCache, configs=[LONG], block_size=64, hazards=["fork-whole-then-append"],
                max_examples=0)  # fmt: skip


def test_a_block_16_cache_that_copies_on_write_by_a_flag_is_caught_at_the_defaults():
    """A whole fork of two pages sets no flag: the rewound side writes into a page its
    clone still reads. Only a fork of whole blocks of 16 shows it."""
    cow = load_example("cow_cache.py")
    with pytest.raises(Divergence) as caught:
        check_cache(lambda config: cow.CowCache(config, bugs={"cow_by_flag"}),
                    hazards=["rewind-into-shared"], max_examples=0)  # fmt: skip
    assert str(caught.value).startswith("hazard 'rewind-into-shared' parent of 32 to ")
    check_cache(cow.CowCache, hazards=["rewind-into-shared"], max_examples=0)


@pytest.mark.parametrize("config", DEFAULT_CONFIGS)
def test_the_reload_hazard_appends_after_its_onto_reload_in_every_default_config(config):
    made = list(reload_into_holes(config))
    assert made
    for label, ops in made:
        cache, outcomes = CellCache(config), []
        for op in ops:
            try:
                result = apply(cache, op, config)
                outcomes.append(result[0].positions if op.verb == "step" else result)
            except Exception as error:
                outcomes.append(error)
        onto = max(i for i, op in enumerate(ops) if op.verb == "reload")
        assert ops[onto].args[1] > 0 and ops[onto + 1 :] == ops[-2:], label
        assert not any(isinstance(x, Exception) for x in outcomes[onto:]), label
        if 0 in config.windows:  # the reloaded one's step reads its whole tail
            assert outcomes[onto + 1][0] == cache.pos(1) - 2 > ops[onto].args[1], label


class TailHeadSwapped(CellCache):
    """seq_load(state, onto=...) writes the first two entries of a tail of three or more
    into each other's slots: only a read of the whole tail (a global layer) shows it."""

    def seq_load(self, state, onto=None, convert=False):
        if onto is not None and state.n_tokens > 2:
            order = np.r_[1, 0, 2 : state.n_tokens]
            k, v = (tuple(x[order] for x in xs) for xs in (state.k, state.v))
            state = SeqState(state.geometry, state.positions, k, v, state.start)
        return super().seq_load(state, onto, convert)


def test_a_reload_onto_that_misplaces_the_tail_is_caught_by_the_hazard():
    with pytest.raises(Divergence, match=r"^hazard 'reload-into-holes' of \d+, then the tail"):
        check_cache(TailHeadSwapped, kinds=(*KINDS, "reload"), hazards=["reload-into-holes"],
                    max_examples=0)  # fmt: skip
