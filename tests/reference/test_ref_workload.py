"""Random workloads against the reference CellCache, held to two independent oracles.

1. A naive table model written here (dicts, lists and sets, nothing shared with
   `reference/`): each live sequence's cells in position order, each occupied cell's
   position and owners. Placement, ids, clone/rm/rewind/clear and the mask rule follow
   SPEC §2-§3 word for word. After every rule the model must equal `cache.snapshot()`,
   `cache.pos(s)`, `used_cells`, `free_cells` and `read_len`; after every step also the
   step's cells, positions, seq_ids, read_len and the mask of every distinct window.
2. The solo oracle `solo_attention`: each sequence's K/V history by position, as the
   values actually stored (cast to the storage dtype and back). Every real token's
   attention output must equal solo attention over its own history; padded rows must
   be exactly 0, and their garbage K/V must land nowhere.

Refused calls must raise the exact error class of `numbakv.errors` and leave the
snapshot equal to the one before.

The config is drawn per example: windows 0, 1, 2, odd, even and wider than any
history; GQA ratios 1, 2, 4; head_dim 12, 16, 20; float32 and float16; small capacity
with a tiny first allocation so the pool grows often; max_seqs 3, and 65 (two owner
words) with nearly every id live so ids past 63 carry tokens.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from numbakv.errors import CapacityError, SequenceError, StepError
from numbakv.reference import CellCache, solo_attention

from helpers import as_stored, pool_values
from workload_model import TOL, TableModel, assert_matches, configs


class WorkloadMachine(RuleBasedStateMachine):
    """Drives one reference cache, the table model and the K/V histories in lockstep."""

    MAX_SEQS = 3
    INITIAL_SEQS = st.integers(0, 3)  # sequences created before the first rule

    @initialize(data=st.data())
    def setup(self, data):
        self.cfg, self.n_heads = data.draw(configs(self.MAX_SEQS), label="config")
        # reference
        self.cache = CellCache(self.cfg)
        # model
        self.model = TableModel(self.cfg.capacity, self.cfg.max_seqs)
        # oracle: seq -> per layer, per position, (k, v) as stored, float32
        self.hist: dict[int, list[list[tuple[np.ndarray, np.ndarray]]]] = {}
        self.pending = False  # a declaration not yet prepared (after a refused prepare)
        self.last_step = None  # (Step, expected cells) of the last step
        self.step_valid = False
        for _ in range(data.draw(self.INITIAL_SEQS, label="initial seqs")):
            self._new()

    # -- helpers ---------------------------------------------------------------

    def _new(self) -> None:
        got = self.cache.seq_new()
        expect = self.model.seq_new()
        assert got == expect
        self.hist[expect] = [[] for _ in range(self.cfg.n_layers)]

    def _expire(self) -> None:
        self.step_valid = False

    def _some_dead(self, data) -> int:
        """An id that is not live: a released one, or one outside [0, max_seqs)."""
        return data.draw(st.sampled_from([*self.model.dead, self.cfg.max_seqs, -1]), label="dead")

    def _has_live(self) -> bool:
        return bool(self.model.seqs)

    def _has_free_id(self) -> bool:
        return len(self.model.seqs) < self.cfg.max_seqs

    # -- table verbs -------------------------------------------------------------

    @precondition(lambda self: self._has_free_id())
    @rule()
    def seq_new(self):
        self._new()

    @precondition(lambda self: self._has_free_id())
    @rule(n=st.integers(2, 70))
    def seq_new_burst(self, n):
        for _ in range(min(n, self.cfg.max_seqs - len(self.model.seqs))):
            self._new()

    @precondition(lambda self: self._has_live() and self._has_free_id())
    @rule(data=st.data())
    def seq_clone(self, data):
        src = data.draw(st.sampled_from(self.model.live), label="src")
        n = len(self.model.seqs[src])
        upto = data.draw(st.one_of(st.none(), st.integers(0, n)), label="upto")
        # reference
        got = self.cache.seq_clone(src, upto)
        # model
        upto = n if upto is None else upto
        expect = self.model.seq_clone(src, upto)
        self.hist[expect] = [layer[:upto] for layer in self.hist[src]]
        self._expire()
        # compare
        assert got == expect
        assert self.cache.pos(got) == upto

    @precondition(lambda self: self._has_live())
    @rule(data=st.data())
    def seq_rm(self, data):
        seq = data.draw(st.sampled_from(self.model.live), label="seq")
        # reference
        self.cache.seq_rm(seq)
        # model
        self.model.seq_rm(seq)
        del self.hist[seq]
        self._expire()

    @precondition(lambda self: self._has_live())
    @rule(data=st.data())
    def rewind(self, data):
        seq = data.draw(st.sampled_from(self.model.live), label="seq")
        position = data.draw(st.integers(0, len(self.model.seqs[seq])), label="position")
        # reference
        self.cache.rewind(seq, position)
        # model
        self.model.rewind(seq, position)
        self.hist[seq] = [layer[:position] for layer in self.hist[seq]]
        self._expire()

    # rarely: only once the cache is at least half full
    @precondition(lambda self: self.model.used_cells * 2 >= self.cfg.capacity)
    @rule()
    def clear(self):
        rows = self.cache.rows
        # reference
        self.cache.clear()
        # model
        self.model.clear()
        self.hist.clear()
        self.pending = False
        self._expire()
        # compare: the pool keeps its storage
        assert self.cache.rows == rows

    # -- steps -------------------------------------------------------------------

    def _ids(self) -> st.SearchStrategy[int]:
        """A live id; half the draws come from the two highest (past 63 when live)."""
        live = self.model.live
        return st.one_of(st.sampled_from(live), st.sampled_from(live[-2:]))

    def _limit(self) -> int:
        return min(self.cfg.max_width, self.model.free_cells)

    def _can_step(self) -> bool:
        return self._has_live() and self.model.free_cells > 0

    @precondition(lambda self: self._can_step())
    @rule(data=st.data())
    def step_mixed(self, data):
        """Any live ids, repeats allowed."""
        seq_ids = data.draw(
            st.lists(self._ids(), min_size=1, max_size=self._limit()), label="seq_ids"
        )
        self._step(data, seq_ids)

    @precondition(lambda self: self._can_step())
    @rule(data=st.data())
    def step_prefill(self, data):
        """A long prefill of one sequence, mixed with one decode token of some others."""
        focus = data.draw(self._ids(), label="focus")
        n_prefill = data.draw(st.integers(1, self._limit()), label="prefill")
        others = [s for s in self.model.live if s != focus]
        room = self._limit() - n_prefill
        decodes = []
        if others and room:
            decodes = data.draw(
                st.lists(st.sampled_from(others), max_size=room, unique=True), label="decodes"
            )
        seq_ids = [focus] * n_prefill + decodes
        seq_ids = data.draw(st.one_of(st.just(seq_ids), st.permutations(seq_ids)), label="order")
        self._step(data, seq_ids)

    def _step(self, data, seq_ids: list[int]) -> None:
        cfg = self.cfg
        n = len(seq_ids)
        width = data.draw(st.one_of(st.none(), st.integers(n, cfg.max_width)), label="width")
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="kv seed"))

        # reference
        self.cache.declare_step(seq_ids)
        step = self.cache.prepare_step(width)
        # model
        width = n if width is None else width
        pad = [-1] * (width - n)
        cells, positions = self.model.place(seq_ids)
        self.pending = False
        self.step_valid = True
        expect_cells = cells + pad
        self.last_step = (step, expect_cells)

        # compare: the step buffers
        assert step.width == width
        assert step.cells.tolist() == expect_cells
        assert step.positions.tolist() == positions + pad
        assert step.seq_ids.tolist() == seq_ids + pad
        assert step.read_len == self.model.read_len == self.cache.read_len
        for window in cfg.distinct_windows:
            expect = self.model.mask(seq_ids, positions, width, window)
            got = step.mask(window)
            assert got.dtype == np.uint8
            assert got.shape == (width, self.model.read_len)
            assert got.tolist() == expect, f"mask of window {window}"

        # oracle: random K/V for every row (padded rows too), then solo attention per sequence
        by_seq: dict[int, list[int]] = {}
        for t, seq in enumerate(seq_ids):
            by_seq.setdefault(seq, []).append(t)
        kv_shape = (width, cfg.n_kv_heads, cfg.head_dim)
        for layer, window in enumerate(cfg.windows):
            k = rng.standard_normal(kv_shape, dtype=np.float32)
            v = rng.standard_normal(kv_shape, dtype=np.float32)
            q = rng.standard_normal((width, self.n_heads, cfg.head_dim), dtype=np.float32)
            # reference
            self.cache.write(layer, k, v)
            got = self.cache.attend(layer, q)
            # oracle
            stored_k = as_stored(k, cfg.dtype)
            stored_v = as_stored(v, cfg.dtype)
            for t, (seq, p) in enumerate(zip(seq_ids, positions, strict=True)):
                assert len(self.hist[seq][layer]) == p
                self.hist[seq][layer].append((stored_k[t], stored_v[t]))
            # compare
            assert got.dtype == np.float32
            assert got.shape == (width, self.n_heads, cfg.head_dim)
            assert (got[n:] == 0).all(), "padded rows must attend to nothing"
            for seq, rows in by_seq.items():
                k_hist = np.stack([kv[0] for kv in self.hist[seq][layer]])
                v_hist = np.stack([kv[1] for kv in self.hist[seq][layer]])
                expect = solo_attention(
                    q[rows], k_hist, v_hist, np.array([positions[t] for t in rows]), window
                )
                np.testing.assert_allclose(
                    got[rows], expect, **TOL, err_msg=f"layer {layer} window {window} seq {seq}"
                )

    # -- refusals ----------------------------------------------------------------

    @rule(data=st.data())
    def refused(self, data):
        """One invalid call: the exact error class, and the snapshot as it was."""
        cfg, model, cache = self.cfg, self.model, self.cache
        live = model.live
        kinds = ["rm dead", "rewind dead", "clone dead", "declare empty", "declare dead"]
        if live:
            kinds += ["rewind past pos", "clone bad upto", "declare too many"]
            if model.free_cells >= 1:
                kinds.append("prepare too wide")
            if model.free_cells < cfg.max_width:
                kinds.append("declare no room")
            if min(cfg.max_width, model.free_cells) >= 2:
                kinds.append("prepare narrow")
        if not self._has_free_id():
            kinds += ["new no id", "clone no id"]
        if not self.pending:
            kinds.append("prepare nothing")
        if self.last_step is not None and not self.step_valid:
            kinds.append("stale step")
        kind = data.draw(st.sampled_from(kinds), label="kind")
        seq = data.draw(st.sampled_from(live), label="seq") if live else None
        n = len(model.seqs[seq]) if live else 0
        beyond = st.one_of(st.integers(n + 1, n + 4), st.integers(-3, -1))

        dead = self._some_dead(data)

        if kind == "rm dead":
            error, call = SequenceError, lambda: cache.seq_rm(dead)
        elif kind == "rewind dead":
            error, call = SequenceError, lambda: cache.rewind(dead, 0)
        elif kind == "clone dead":
            error, call = SequenceError, lambda: cache.seq_clone(dead)
        elif kind == "rewind past pos":
            position = data.draw(beyond, label="position")
            error, call = SequenceError, lambda: cache.rewind(seq, position)
        elif kind == "clone bad upto":
            upto = data.draw(beyond, label="upto")
            error, call = SequenceError, lambda: cache.seq_clone(seq, upto)
        elif kind == "clone no id":
            upto = data.draw(st.one_of(st.none(), st.integers(0, n)), label="upto")
            error, call = CapacityError, lambda: cache.seq_clone(seq, upto)
        elif kind == "new no id":
            error, call = CapacityError, cache.seq_new
        elif kind == "declare empty":
            error, call = StepError, lambda: cache.declare_step([])
        elif kind == "declare too many":
            many = data.draw(st.integers(cfg.max_width + 1, cfg.max_width + 3), label="n")
            error, call = StepError, lambda: cache.declare_step([seq] * many)
        elif kind == "declare dead":
            seq_ids = (
                data.draw(st.lists(st.sampled_from(live), max_size=2), label="ids") if live else []
            )
            seq_ids.insert(data.draw(st.integers(0, len(seq_ids)), label="at"), dead)
            error, call = SequenceError, lambda: cache.declare_step(seq_ids)
        elif kind == "declare no room":
            many = data.draw(st.integers(model.free_cells + 1, cfg.max_width), label="n")
            error, call = CapacityError, lambda: cache.declare_step([seq] * many)
        elif kind == "prepare nothing":
            error, call = StepError, cache.prepare_step
        elif kind == "stale step":
            error, call = StepError, lambda: self.last_step[0].cells
        else:  # prepare narrow / too wide: a valid declaration, then a bad width
            limit = min(cfg.max_width, model.free_cells)
            if kind == "prepare narrow":
                many = data.draw(st.integers(2, limit), label="n")
                width = data.draw(st.integers(0, many - 1), label="width")
            else:
                many = data.draw(st.integers(1, limit), label="n")
                width = data.draw(st.integers(cfg.max_width + 1, cfg.max_width + 3), label="width")
            before = cache.snapshot()
            cache.declare_step([seq] * many)
            assert cache.snapshot() == before  # declaring claims nothing
            self.pending = True
            self._expire()
            error, call = StepError, lambda: cache.prepare_step(width)

        before = cache.snapshot()
        # reference
        with pytest.raises(error) as raised:
            call()
        # compare: the exact class, and nothing changed
        assert type(raised.value) is error, f"{kind}: {type(raised.value).__name__}"
        assert cache.snapshot() == before, kind
        if self.last_step is not None and self.step_valid:
            step, expect_cells = self.last_step
            assert step.cells.tolist() == expect_cells, "a refused call expired the step"

    # -- compare after every rule ----------------------------------------------------

    @invariant()
    def table_keeps_its_invariants(self):
        self.cache.check_invariants()

    @invariant()
    def table_matches_model(self):
        assert_matches(self.model, self.cache)

    @invariant()
    def pool_holds_every_history(self):
        """Every live sequence's cells hold its stored K/V: nothing moved, no padded row landed."""
        for layer in range(self.cfg.n_layers):
            pool_k, pool_v = self.cache.pool_kv(layer)
            for seq, cells in self.model.seqs.items():
                if not cells:
                    continue
                # oracle
                expect_k = np.stack([kv[0] for kv in self.hist[seq][layer]])
                expect_v = np.stack([kv[1] for kv in self.hist[seq][layer]])
                # compare
                got_k = pool_values(pool_k[cells], self.cfg.dtype)
                got_v = pool_values(pool_v[cells], self.cfg.dtype)
                np.testing.assert_array_equal(got_k, expect_k)
                np.testing.assert_array_equal(got_v, expect_v)


class ManySeqsMachine(WorkloadMachine):
    """65 ids (two owner words), nearly all live from the start: ids past 63 carry tokens."""

    MAX_SEQS = 65
    INITIAL_SEQS = st.integers(63, 65)


SETTINGS = settings(
    max_examples=80,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

TestWorkloadThreeSeqs = WorkloadMachine.TestCase
TestWorkloadThreeSeqs.settings = SETTINGS

TestWorkloadSixtyFiveSeqs = ManySeqsMachine.TestCase
TestWorkloadSixtyFiveSeqs.settings = SETTINGS
