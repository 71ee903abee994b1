"""What `numbakv.testing` holds a cache to besides "the same as the reference", each shown by a
planted bug caught with a short script: a refusal that changes the cache, a broken
`check_invariants()`, K/V bytes off the reference's in an occupied cell, a step that stays
valid (stale fields that answer are etiquette: test_kit_etiquette.py), attention that is
not float32 or whose padding is not exactly 0, a mask that is not uint8, free_cells off;
the hook, the prefix, the step op's attention mode (in scripts and op logs), and what
`decode` draws."""

import json
from itertools import pairwise

import numpy as np
import pytest

from numbakv.reference import CellCache
from numbakv.testing import DEFAULT_CONFIGS, Divergence, Op, check_cache, decode, run_script
from numbakv.testing.oplog_file import load_ops
from numbakv.testing.ops import VERBS
from numbakv.testing.workloads import ALL_KINDS, CODES, GROUPS, Swarm, hostile_ids

CONFIG = DEFAULT_CONFIGS[1]  # 2 layers (windows 0 and 3), 2 KV heads, 4 ids, 24 cells
TWO_STEPS = [Op("seq_new"), Op("step", ((0, 0), None, 1, 1)), Op("seq_new"), Op("rewind", (0, 1))]


class RefusedRmOpens(CellCache):
    """A refused seq_rm opens a sequence first."""

    def seq_rm(self, seq):
        if seq not in self.live_seqs:
            self.seq_new()
        return super().seq_rm(seq)


class InvariantsBroken(CellCache):
    """Its own invariants fail once two ids are live."""

    def check_invariants(self):
        super().check_invariants()
        if len(self.live_seqs) > 1:
            raise AssertionError("two ids live")


class PoolOff(CellCache):
    """pool_kv shows cell 0's K one off."""

    def pool_kv(self, layer):
        k, v = super().pool_kv(layer)
        k[:1] += 1
        return k, v


class NeverStale(CellCache):
    """Its steps never go stale."""

    def prepare_step(self, width=None):
        step = super().prepare_step(width)
        step.expire = lambda: None
        return step


class Float64Attention(CellCache):
    def attend(self, layer, q, scale=None, mode="gathered"):
        return super().attend(layer, q, scale, mode).astype(np.float64)


class PaddingAlmostZero(CellCache):
    """Padding rows within any tolerance of 0, but not 0."""

    def attend(self, layer, q, scale=None, mode="gathered"):
        out = super().attend(layer, q, scale, mode)
        out[self._step.n_tokens :] = 1e-9
        return out


class BoolMasks(CellCache):
    def prepare_step(self, width=None):
        step = super().prepare_step(width)
        mask = step.mask
        step.mask = lambda window: mask(window).astype(bool)
        return step


class FreeOffByOne(CellCache):
    @property
    def free_cells(self):
        return super().free_cells + 1


@pytest.mark.parametrize(
    "broken, ops, compare, complaint",
    [
        (RefusedRmOpens, [Op("seq_rm", (2,))], "semantic",
         "the cache's live ids changed, though it refused the op"),
        (RefusedRmOpens, [Op("seq_rm", (2,))], "table",
         "the cache's snapshot changed, though it refused the op"),
        (InvariantsBroken, TWO_STEPS, "semantic", "check_invariants() failed: two ids live"),
        (PoolOff, TWO_STEPS, "table", r"pool_kv(0) K differs from the reference's in cells [0]"),
        (NeverStale, TWO_STEPS, "semantic",
         "after rewind, the cache's last step is still valid, the reference's is not"),
        (Float64Attention, TWO_STEPS, "semantic", "attend(0) returned float64, not float32"),
        (PaddingAlmostZero, [Op("seq_new"), Op("step", ((0,), 3, 1, 1))], "semantic",
         "attend(0) gave padding rows [1, ...) that are not 0"),
        (BoolMasks, TWO_STEPS, "table", "step.mask(0) is bool [2, 2], not uint8"),
        (FreeOffByOne, [Op("seq_new")], "semantic", "free_cells = 25, the reference's 24"),
    ],
)  # fmt: skip
def test_a_planted_bug_is_caught(broken, ops, compare, complaint):
    with pytest.raises(Divergence) as caught:
        run_script(broken, CONFIG, ops, compare)
    assert complaint in str(caught.value)
    assert caught.value.ops == ops[: caught.value.index + 1]
    run_script(CellCache, CONFIG, ops, compare)


def test_the_pool_is_compared_only_under_compare_table():
    run_script(PoolOff, CONFIG, TWO_STEPS, "semantic")


def test_the_hook_sees_every_op_with_both_outcomes_and_its_problem_stops_the_run():
    seen = []

    def hook(reference, cache, op, expected, got):
        seen.append((op, expected[1] is None, got[1] is None))
        if op.verb == "step":
            (step, _), (their_step, their_outs) = expected[0], got[0]
            assert step.n_tokens == their_step.n_tokens == 2
            assert [out.shape for out in their_outs] == [(2, 2, 8)] * 2
        return "the third op" if len(seen) == 3 else None

    with pytest.raises(Divergence, match="differs from the reference: the third op") as caught:
        run_script(CellCache, CONFIG, TWO_STEPS, check=hook)
    assert seen == [(op, True, True) for op in TWO_STEPS[:3]] and caught.value.index == 2
    assert str(caught.value).endswith("run_script(factory, config, ops, check=check)")

    def asserting(reference, cache, op, expected, got):
        assert op.verb != "rewind", "no rewinds here"

    with pytest.raises(Divergence, match=r"check\(\.\.\.\) failed: no rewinds here"):
        run_script(CellCache, CONFIG, TWO_STEPS, check=asserting)


def test_the_prefix_runs_first_and_again_after_every_clear():
    """Its ops but the last are compared by outcome only (`Runner.setup`); the last runs as
    any op (the hook sees it), first and after every clear."""
    prefix = [Op("seq_new"), Op("seq_new")] + [Op("step", ((0, 0, 1, 1), None, 1, 0))] * 3
    runs = []  # (cache, [the ops the hook saw])

    def hook(reference, cache, op, expected, got):
        if not runs or runs[-1][0] is not cache:
            runs.append((cache, []))
        runs[-1][1].append(op)

    check_cache(CellCache, configs=[CONFIG], prefix=lambda config: prefix, max_examples=20,
                check=hook)  # fmt: skip
    assert len(runs) >= 20
    clears = 0
    for _, ops in runs:
        assert ops[0] == prefix[-1]
        for op, after in pairwise(ops):
            if op.verb == "clear":
                clears += 1
                assert after == prefix[-1]
    assert clears


def test_a_step_op_may_name_its_attention_mode():
    modes = []

    class Modes(CellCache):
        def attend(self, layer, q, scale=None, mode="gathered"):
            modes.append(mode)
            return super().attend(layer, q, scale, mode)

    ops = [Op("seq_new"), Op("step", ((0, 0), 3, 2, 5, "masked")), Op("step", ((0,), None, 1, 6))]
    run_script(Modes, CONFIG, ops, "table")
    assert modes == ["masked", "masked", "gathered", "gathered"]


def test_an_op_log_with_a_mode_loads_and_a_bad_mode_is_refused(tmp_path):
    config = {"n_layers": 1, "n_kv_heads": 1, "head_dim": 4, "capacity": 8, "max_width": 4,
              "max_seqs": 2}  # fmt: skip
    ops = [["seq_new", []], ["step", [[0, 0], None, 1, 0, "masked"]]]
    document = {"format": "numbakv-oplog", "version": 1, "config": config, "ops": ops}
    path = tmp_path / "log.json"
    path.write_text(json.dumps(document))
    loaded, ops = load_ops(path)
    assert ops[1] == Op("step", ((0, 0), None, 1, 0, "masked"))
    run_script(CellCache, loaded, ops, "table")
    document["ops"][1][1][4] = "sideways"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"op 1 \(step\) needs .* a mode of"):
        load_ops(path)


def test_decode_draws_every_kind_of_op_and_each_prints_as_a_script():
    cache = CellCache(CONFIG)  # ids 0, 1, 2 live at 6, 3, 3 positions; 12 of 24 cells used
    for _ in range(3):
        cache.seq_new()
    for _ in range(3):
        cache.declare_step([0, 0, 1, 2])
        cache.prepare_step()
    rng = np.random.default_rng(0)
    ops = [decode(int(code), cache, CONFIG) for code in rng.integers(0, CODES, 3000, np.uint64)]
    assert all(eval(repr(op), {"Op": Op}) == op for op in ops)
    assert {op.verb for op in ops} == set(VERBS) - {"reload", "save", "load"}  # opt-in; logs
    reloads = Swarm(weights=(1,) + (0,) * (len(ALL_KINDS) - 2) + (1,))
    codes = rng.integers(0, CODES, 2000, np.uint64)
    drawn = [decode(int(code), cache, CONFIG, reloads) for code in codes]
    assert {op.verb for op in drawn} == {"step", "reload"}
    assert {op.args[1] for op in drawn if op.verb == "reload" and op.args[0] == 0} >= {0, 3, 6, 7}
    targets = {op.args[0] for op in ops if op.verb in ("seq_rm", "rewind", "seq_clone")}
    assert {*hostile_ids(CONFIG), *range(CONFIG.max_seqs + 1)} <= targets
    positions = {op.args[1] for op in ops if op.verb == "rewind" and op.args[0] == 0}
    assert {-1, 0.5, *range(8)} <= positions  # 7: one past the end
    steps = [op.args for op in ops if op.verb == "step"]
    assert {len(args[0]) for args in steps} == set(range(CONFIG.max_width + 2))  # 0: empty
    pads = {None if args[1] is None else args[1] - len(args[0]) for args in steps}
    assert {None, -1, 0, 1, 2} <= pads  # too narrow, exact, padded
    assert any(args[1] is not None and args[1] > CONFIG.max_width for args in steps)
    assert {args[2] for args in steps} == set(GROUPS)
    assert {args[4:] for args in steps} == {(), ("masked",)}
    assert any(len(set(ids)) == 2 and len(ids) > 2 for ids, *_ in steps)  # a prefill beside
