"""Hostile arguments on both caches: each raises the error of docs/contract.md §6, its
message names the bad value, and the whole state after the refusal equals the state before
(the step stays valid, a pending declaration stays pending)."""

import numpy as np
import pytest

from numbakv.core.errors import ConfigError, SequenceError, StepError

from helpers import full_state, step_with

A, B, DEAD = 0, 1, 3  # a holds 2 positions, b 1; id 3 was never handed out
K = np.ones((3, 1, 4), np.float32)  # the step's [width, n_kv_heads, head_dim]
Q = np.ones((3, 2, 4), np.float32)  # 2 query heads over 1 KV head
RAGGED = [[[1.0] * 4], [[1.0] * 3], [[1.0] * 4]]


class BadIndex:
    """An integer-like whose __index__ raises something other than TypeError."""

    def __index__(self):
        raise ValueError("no index today")

    def __repr__(self):
        return "BadIndex()"


class BadArray:
    def __array__(self, dtype=None, copy=None):
        raise KeyError("no array today")


class ForeignDeviceArray:
    """What a CuPy array or a torch CUDA tensor shows: the interface, no copy_to_host."""

    shape, dtype = (3, 1, 4), np.dtype(np.float32)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": "<f4", "data": (0, False), "version": 3}


# (id, call(cache, step), error, a piece of the message that names the bad value)
CASES = [
    # ids, positions: integers only, live only
    ("rm-bool", lambda c, s: c.seq_rm(True), SequenceError, "True"),
    ("rm-float", lambda c, s: c.seq_rm(1.0), SequenceError, "1.0"),
    ("rm-str", lambda c, s: c.seq_rm("0"), SequenceError, "'0'"),
    ("rm-none", lambda c, s: c.seq_rm(None), SequenceError, "None"),
    ("rm-array", lambda c, s: c.seq_rm(np.array([0])), SequenceError, "array([0])"),
    ("rm-np-bool", lambda c, s: c.seq_rm(np.True_), SequenceError, "True"),
    ("rm-dead", lambda c, s: c.seq_rm(DEAD), SequenceError, "sequence 3"),
    ("rm-negative", lambda c, s: c.seq_rm(-1), SequenceError, "sequence -1"),
    ("rm-huge", lambda c, s: c.seq_rm(2**70), SequenceError, str(2**70)),
    ("rm-bad-index", lambda c, s: c.seq_rm(BadIndex()), SequenceError, "BadIndex()"),
    ("mask-bad-index", lambda c, s: s.mask(BadIndex()), StepError, "BadIndex()"),
    ("clone-str", lambda c, s: c.seq_clone("a"), SequenceError, "'a'"),
    ("clone-upto-bool", lambda c, s: c.seq_clone(A, upto=True), SequenceError, "True"),
    ("clone-upto-float", lambda c, s: c.seq_clone(A, upto=2.0), SequenceError, "2.0"),
    ("clone-upto-past", lambda c, s: c.seq_clone(A, upto=3), SequenceError, "upto=3"),
    ("clone-upto-negative", lambda c, s: c.seq_clone(A, upto=-1), SequenceError, "upto=-1"),
    ("rewind-none", lambda c, s: c.rewind(A, None), SequenceError, "None"),
    ("rewind-bool", lambda c, s: c.rewind(A, False), SequenceError, "False"),
    ("rewind-past", lambda c, s: c.rewind(A, 3), SequenceError, "position=3"),
    ("rewind-dead", lambda c, s: c.rewind(np.int64(DEAD), 0), SequenceError, "sequence 3"),
    ("pos-bool", lambda c, s: c.pos(True), SequenceError, "True"),
    # declarations: a list or 1-d array of live ids, 1 to max_width of them
    ("declare-int", lambda c, s: c.declare_step(5), StepError, "got 5"),
    ("declare-none", lambda c, s: c.declare_step(None), StepError, "got None"),
    ("declare-str", lambda c, s: c.declare_step("ab"), StepError, "'ab'"),
    ("declare-bytearray", lambda c, s: c.declare_step(bytearray(1)), StepError, "bytearray"),
    ("declare-memoryview", lambda c, s: c.declare_step(memoryview(b"")), StepError, "memory"),
    ("declare-iterator", lambda c, s: c.declare_step(iter([A])), StepError, "iterator"),
    ("declare-2d", lambda c, s: c.declare_step(np.zeros((1, 1), int)), StepError, "array"),
    ("declare-empty", lambda c, s: c.declare_step([]), StepError, "got 0"),
    ("declare-wide", lambda c, s: c.declare_step([A] * 9), StepError, "got 9"),
    ("declare-nested", lambda c, s: c.declare_step([[A]]), SequenceError, "[0]"),
    ("declare-float-id", lambda c, s: c.declare_step([A, 1.0]), SequenceError, "1.0"),
    ("declare-bool-id", lambda c, s: c.declare_step([True]), SequenceError, "True"),
    ("declare-float-array", lambda c, s: c.declare_step(np.zeros(2)), SequenceError, "0.0"),
    ("declare-dead", lambda c, s: c.declare_step([A, DEAD]), SequenceError, "sequence 3"),
    # the step's accessors
    ("mask-list", lambda c, s: s.mask([0]), StepError, "[0]"),
    ("mask-none", lambda c, s: s.mask(None), StepError, "None"),
    ("mask-bool", lambda c, s: s.mask(True), StepError, "True"),
    ("mask-unknown", lambda c, s: s.mask(7), StepError, "window 7"),
    # write: a layer, then real float arrays of the step's shape; K is never written alone
    ("write-layer-bool", lambda c, s: c.write(True, K, K), StepError, "True"),
    ("write-layer-float", lambda c, s: c.write(0.0, K, K), StepError, "0.0"),
    ("write-layer-past", lambda c, s: c.write(2, K, K), StepError, "layer=2"),
    ("write-v-shape", lambda c, s: c.write(0, K, K[:2]), StepError, "(2, 1, 4)"),
    ("write-v-rank", lambda c, s: c.write(0, K, K[0]), StepError, "(1, 4)"),
    ("write-v-int", lambda c, s: c.write(0, K, K.astype(np.int64)), StepError, "int64"),
    ("write-v-bits", lambda c, s: c.write(0, K, K.view(np.uint16)[..., :4]), StepError, "uint16"),
    ("write-v-bool", lambda c, s: c.write(0, K, K > 0), StepError, "bool"),
    ("write-v-complex", lambda c, s: c.write(0, K, K + 1j), StepError, "complex64"),
    ("write-v-object", lambda c, s: c.write(0, K, K.astype(object)), StepError, "object"),
    ("write-v-str", lambda c, s: c.write(0, K, "abc"), StepError, "<U3"),
    ("write-v-none", lambda c, s: c.write(0, K, None), StepError, "object"),
    ("write-v-ragged", lambda c, s: c.write(0, K, RAGGED), StepError, "list"),
    ("write-k-int", lambda c, s: c.write(0, K.astype(np.int32), K), StepError, "int32"),
    ("write-v-raising", lambda c, s: c.write(0, K, BadArray()), StepError, "no array today"),
    ("write-v-foreign", lambda c, s: c.write(0, K, ForeignDeviceArray()), StepError, "Foreign"),
    # attend: a layer, a real float query, a finite positive scale, a mode
    ("attend-layer-str", lambda c, s: c.attend("0", Q), StepError, "'0'"),
    ("attend-q-int", lambda c, s: c.attend(0, Q.astype(np.int8)), StepError, "int8"),
    ("attend-q-complex", lambda c, s: c.attend(0, Q + 0j), StepError, "complex"),
    ("attend-q-shape", lambda c, s: c.attend(0, Q[:, :1, :3]), StepError, "(3, 1, 3)"),
    ("attend-q-dim", lambda c, s: c.attend(0, np.ones((3, 2, 5))), StepError, "(3, 2, 5)"),
    ("attend-q-rank", lambda c, s: c.attend(0, Q[0]), StepError, "(2, 4)"),
    ("scale-str", lambda c, s: c.attend(0, Q, scale="2"), StepError, "'2'"),
    ("scale-nan", lambda c, s: c.attend(0, Q, scale=float("nan")), StepError, "nan"),
    ("scale-inf", lambda c, s: c.attend(0, Q, scale=np.inf), StepError, "inf"),
    ("scale-zero", lambda c, s: c.attend(0, Q, scale=0.0), StepError, "0.0"),
    ("scale-negative", lambda c, s: c.attend(0, Q, scale=-0.5), StepError, "-0.5"),
    ("scale-bool", lambda c, s: c.attend(0, Q, scale=True), StepError, "True"),
    ("scale-complex", lambda c, s: c.attend(0, Q, scale=1 + 0j), StepError, "(1+0j)"),
    ("scale-underflow", lambda c, s: c.attend(0, Q, scale=1e-50), StepError, "1e-50"),
    ("scale-overflow", lambda c, s: c.attend(0, Q, scale=1e39), StepError, "1e+39"),
    ("scale-huge-int", lambda c, s: c.attend(0, Q, scale=10**400), StepError, "scale=1000"),
    ("scale-timedelta", lambda c, s: c.attend(0, Q, scale=np.timedelta64(1)), StepError, "1"),
    ("remove-observer", lambda c, s: c.remove_observer(print), ConfigError, "print"),
    ("mode-int", lambda c, s: c.attend(0, Q, mode=1), StepError, "mode=1"),
    ("mode-case", lambda c, s: c.attend(0, Q, mode="MASKED"), StepError, "'MASKED'"),
    ("mode-array", lambda c, s: c.attend(0, Q, mode=np.array(["a", "b"])), StepError, "array"),
]


def prepared(cache):
    """a at positions 0, 1 and b at 0, placed and written in both layers; the step valid."""
    a, b = cache.seq_new(), cache.seq_new()
    step = step_with(cache, [a, a, b])
    k = np.arange(12, dtype=np.float32).reshape(K.shape)
    for layer in range(2):
        cache.write(layer, k, -k)
    return step


@pytest.mark.parametrize(
    ("call", "error", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_hostile_call_is_refused_and_changes_nothing(cache, call, error, named):
    step = prepared(cache)
    before = full_state(cache)
    with pytest.raises(error) as refused:
        call(cache, step)
    assert named in str(refused.value)
    assert full_state(cache) == before
    assert not step.is_stale and step.cells.tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    ("width", "named"), [(True, "True"), (2.5, "2.5"), ("4", "'4'"), (1, "width=1"), (9, "width=9")]
)
def test_bad_width_keeps_the_declaration(cache, width, named):
    a = cache.seq_new()
    cache.declare_step([a, a])
    before = full_state(cache)
    with pytest.raises(StepError, match=named.replace(".", r"\.")):
        cache.prepare_step(width)
    assert full_state(cache) == before
    assert cache.prepare_step().positions.tolist() == [0, 1]


def test_refused_verbs_keep_the_declaration(cache):
    a = cache.seq_new()
    cache.declare_step([a, a, a])
    verbs = [c for c in CASES if c[0].split("-")[0] in ("rm", "clone", "rewind", "pos")]
    assert len(verbs) == 20
    for _, call, error, _ in verbs:  # the refused verbs of the table
        with pytest.raises(error):
            call(cache, None)
    assert cache.prepare_step().positions.tolist() == [0, 1, 2]


def test_a_dead_id_lists_a_few_live_ids(impl):
    cache = impl.cache(max_seqs=1000, capacity=1000)
    for _ in range(1000):
        cache.seq_new()
    cache.seq_rm(500)
    with pytest.raises(SequenceError) as refused:
        cache.seq_rm(500)
    message = str(refused.value)
    assert "live ids: 0, 1, 2, 3, 4, 5, 6, 7, … (999 live)" in message
    assert len(message) < 200


def test_no_live_id_says_so(cache):
    with pytest.raises(SequenceError, match="no sequence is live"):
        cache.pos(0)


@pytest.mark.parametrize("accessor", ["cells", "positions", "seq_ids", "width", "read_len",
                                      "n_tokens", "windows"])  # fmt: skip
def test_a_stale_step_refuses_every_accessor(cache, accessor):
    a = cache.seq_new()
    step = step_with(cache, [a])
    cache.rewind(a, 0)
    assert step.is_stale
    with pytest.raises(StepError, match="stale"):
        getattr(step, accessor)
    with pytest.raises(StepError, match="stale"):
        step.mask(0)
