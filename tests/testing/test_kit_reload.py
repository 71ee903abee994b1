"""The kit's power over saved sequences (docs/contract.md §13): `check_cache` with the opt-in
kind "reload" (seq_save, then seq_load onto the sequence when the state starts past 0)
passes the reference, reaches every reload refusal, and catches each bug planted below in
a cache whose saved sequences are otherwise the reference's: the bugs other runtimes'
users reported (a restore that loses the tail, a restore into a fragmented pool refused
although cells are free, a failed restore that leaves a sequence behind) and a restore
that scrambles the order."""

import pytest

from numbakv.core.errors import CapacityError
from numbakv.core.seq_state import SeqState
from numbakv.reference import CellCache
from numbakv.testing import Divergence, check_cache
from numbakv.testing.workloads import KINDS

RELOAD = (*KINDS, "reload")
RUN = dict(kinds=RELOAD, hazards=("reload-into-holes",), max_examples=40)


class DropsTheLastPosition(CellCache):
    """seq_save saves one position short (an off-by-one at the end)."""

    def seq_save(self, seq, start=0):
        state = super().seq_save(seq, start)
        if state.n_tokens == 0:
            return state
        k, v = (tuple(x[:-1] for x in xs) for xs in (state.k, state.v))
        return SeqState(state.geometry, state.positions[:-1], k, v, state.start)


class ReversedEntries(CellCache):
    """seq_load writes the entries in reverse position order."""

    def seq_load(self, state, onto=None, convert=False):
        k, v = (tuple(x[::-1] for x in xs) for xs in (state.k, state.v))
        flipped = SeqState(state.geometry, state.positions, k, v, state.start)
        return super().seq_load(flipped, onto, convert)


class NotIntoHoles(CellCache):
    """seq_load refuses unless the cells past read_len suffice, holes left unused (the
    "failed to find available cells" of a fragmented pool)."""

    def seq_load(self, state, onto=None, convert=False):
        if state.n_tokens > self.capacity - self.read_len:
            raise CapacityError("no contiguous run of free cells")
        return super().seq_load(state, onto, convert)


class LeavesAnIdBehind(CellCache):
    """A refused seq_load leaves the new sequence it opened live."""

    def seq_load(self, state, onto=None, convert=False):
        if state.n_tokens > self.free_cells and len(self.live_seqs) < self.config.max_seqs:
            self.seq_new()
        return super().seq_load(state, onto, convert)


PLANTED = [DropsTheLastPosition, ReversedEntries, NotIntoHoles, LeavesAnIdBehind]


def test_the_reference_passes_and_reaches_every_reload_refusal():
    coverage = check_cache(CellCache, report=True, **RUN)
    assert coverage.verbs["reload"] > 0 and coverage.unexplained == []
    reload_refusals = [name for name in coverage.reachable if name.startswith("reload")]
    assert len(reload_refusals) == 4
    assert not [name for name in coverage.unreached if name.startswith("reload")]


def test_reload_is_opt_in_and_the_default_mixes_stay_as_they_were():
    default = check_cache(CellCache, report=True, hazards=False, max_examples=20)
    assert default.verbs["reload"] == 0
    assert not [name for name in default.reachable if name.startswith("reload")]
    again = check_cache(CellCache, report=True, hazards=False, max_examples=20,
                        kinds=KINDS)  # fmt: skip
    assert again.verbs == default.verbs


@pytest.mark.parametrize("cls", PLANTED, ids=lambda cls: cls.__name__)
def test_each_planted_reload_bug_is_caught(cls):
    with pytest.raises(Divergence) as caught:
        check_cache(cls, compare="table", **RUN)
    assert "hazard 'reload-into-holes'" in str(caught.value) or "reload" in str(caught.value)
    assert any(op.verb == "reload" for op in caught.value.ops)


def test_a_trace_with_loads_replays_as_clones_and_steps():
    """`trace_ops` turns a recorded seq_load into the ops that place what it placed: the
    replayed table equals the recorded one, frame by frame of the verbs."""
    from numbakv import Recorder
    from numbakv.core.config import CacheConfig
    from numbakv.testing.from_trace import trace_ops

    config = CacheConfig(n_layers=1, n_kv_heads=1, head_dim=4, capacity=24, max_width=3,
                         max_seqs=4)  # fmt: skip
    cache = CellCache(config)
    recorder = Recorder(cache, every_verb=True)
    a, b = cache.seq_new(), cache.seq_new()
    for ids in ([a, b, a], [b, a, a], [a, b]):
        cache.declare_step(ids)
        cache.prepare_step()
    cache.seq_rm(b)
    whole = cache.seq_load(cache.seq_save(a))  # 5 positions: steps of 3 and 2
    tail = cache.seq_load(cache.seq_save(a, start=4), onto=whole)
    ops = trace_ops(recorder.trace())
    shapes = [op.args[:2] if op.verb == "step" else op.args for op in ops[-6:]]  # no seeds
    assert [op.verb for op in ops[-6:]] == ["seq_rm", "seq_new", "step", "step", "seq_clone",
                                            "step"]  # fmt: skip
    assert shapes == [(b,), (), ((b,) * 3, 3), ((b,) * 2, 2), (whole, 4), ((tail,), 1)]
    replayed = CellCache(config)
    for op in ops:
        if op.verb == "step":
            replayed.declare_step(list(op.args[0]))
            replayed.prepare_step()
        else:
            getattr(replayed, op.verb)(*op.args)
    assert replayed.snapshot() == cache.snapshot() and tail in replayed.live_seqs
