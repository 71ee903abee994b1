"""`OpLog` records a serving workload, `replay` runs it beside the reference and shrinks a
divergence by delta debugging (`shrink_ops`), and `numbakv replay` on the command line."""

import json

import numpy as np
import pytest
from example_caches import load_example

import numbakv
from numbakv.cli import main
from numbakv.core.errors import SequenceError, StepError
from numbakv.reference import CellCache
from numbakv.serve.batch import Input
from numbakv.serve.engine import Engine
from numbakv.serve.executor import Executor
from numbakv.serve.sampling import Sampling
from numbakv.testing.op import Op
from numbakv.testing.oplog import OpLog
from numbakv.testing.oplog_file import load_ops
from numbakv.testing.ops import Divergence
from numbakv.testing.replay import replay
from numbakv.testing.shrink import shrink_ops

from helpers import tiny_model

MODEL = tiny_model(seed=3)  # layers: global, window 4
CONFIG = MODEL.config.cache_config(capacity=96, max_width=8, max_seqs=6, initial_cells=8)


class RewindKeepsOneMore(CellCache):
    """Planted bug: a rewind that drops anything keeps one position too many."""

    def rewind(self, seq, position):
        super().rewind(seq, position + 1 if position < self.pos(seq) else position)


class CloneSharesOneMore(CellCache):
    """Planted bug: a clone with `upto` short of the end shares one position too many."""

    def seq_clone(self, src, upto=None):
        short = upto is not None and upto < self.pos(src)
        return super().seq_clone(src, upto + 1 if short else upto)


def serve(log: OpLog) -> None:
    """A workload through the engine (prompts, two samples each: clones, closes), then
    regenerations through the executor (rewinds), a clone of a prefix and a refusal."""
    executor = Executor(MODEL, log, max_sessions=4, max_session_tokens=24)
    engine = Engine(executor)
    prompts = ["Hi", "a cell cache", "abc", "shared cells", "x"]
    engine.generate(prompts, max_new_tokens=6, sampling=Sampling(0.8, seed=1), n=2)
    session = executor.open_session()
    executor.execute([Input(session, 0, [5, 6, 7, 8, 9])])
    executor.execute([Input(session, 2, [11, 12])])  # rewinds to 2, then appends
    clone = executor.clone(session, 3)
    executor.execute([Input(clone, 3, [13])])
    with pytest.raises(SequenceError):
        log.seq_rm(5)  # never opened: a refusal, recorded
    executor.close_session(session)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """(path of the saved log, the OpLog) of `serve` on the reference."""
    log = OpLog(CellCache(CONFIG))
    serve(log)
    path = tmp_path_factory.mktemp("oplog") / "oplog.json"
    log.save(path)
    return path, log


def test_the_log_records_every_verb_and_step(recorded):
    path, log = recorded
    verbs = {op.verb for op in log.ops}
    assert verbs == {"seq_new", "seq_clone", "seq_rm", "rewind", "step"}
    assert Op("seq_rm", (5,)) in log.ops
    steps = [(i, op) for i, op in enumerate(log.ops) if op.verb == "step"]
    assert all(op.args[3] == i and op.args[2] == 1 for i, op in steps)  # seed: the index
    assert log.live_seqs == log.cache.live_seqs  # attributes pass through
    config, ops = load_ops(path)
    assert config == CONFIG and ops == log.ops


def test_refused_calls_are_recorded():
    log = OpLog(CellCache(CONFIG))
    with pytest.raises(SequenceError):
        log.rewind(0, 0)
    with pytest.raises(SequenceError):
        log.declare_step([3])
    a = log.seq_new()
    log.declare_step([a, a])
    log.prepare_step(3)
    assert log.ops == [
        Op("rewind", (0, 0)),
        Op("step", ((3,), None, 1, 1)),
        Op("seq_new"),
        Op("step", ((0, 0), 3, 1, 3)),
    ]
    replay(log.ops, CellCache, config=CONFIG)


def test_replay_into_the_reference_agrees(recorded):
    path, log = recorded
    assert len(log.ops) > 40
    replay(path, CellCache)
    replay(path, CellCache, compare="table")


def test_replay_into_the_device_cache_on_the_simulator_agrees(recorded):
    _, log = recorded
    replay(log.ops[:12], numbakv.CellCache, config=CONFIG)


@pytest.mark.parametrize("broken", [RewindKeepsOneMore, CloneSharesOneMore])
def test_a_planted_bug_is_shrunk_to_a_few_ops(recorded, broken):
    path, log = recorded
    with pytest.raises(Divergence) as caught:
        replay(path, broken)
    minimal = caught.value.ops
    assert len(minimal) <= 6 < len(log.ops) // 5
    message = str(caught.value)
    assert message.startswith(f"{len(log.ops)} ops replayed, shrunk to {len(minimal)} ")
    assert "ops = [\n" in message and repr(minimal[-1]) in message
    with pytest.raises(Divergence):
        replay(minimal, broken, config=CONFIG, shrink=False)  # the short script replays


def test_a_flaky_cache_gets_its_first_divergence_unshrunk(recorded):
    path, log = recorded
    built = []

    def flaky(config):  # only the first cache built has the bug
        built.append(config)
        return (RewindKeepsOneMore if len(built) == 1 else CellCache)(config)

    with pytest.raises(Divergence, match="did not diverge again") as caught:
        replay(path, flaky)
    assert caught.value.ops == log.ops[: caught.value.index + 1]


def test_without_shrinking_the_first_divergence_is_raised(recorded):
    path, log = recorded
    with pytest.raises(Divergence) as caught:
        replay(path, RewindKeepsOneMore, shrink=False)
    assert caught.value.ops == log.ops[: caught.value.index + 1]


def test_shrink_ops_finds_a_1_minimal_subset():
    calls = []

    def fails(ops):  # fails when it holds 3 and 17, or 8, 9 and 40
        calls.append(len(ops))
        return {3, 17} <= set(ops) or {8, 9, 40} <= set(ops)

    found = shrink_ops(list(range(50)), fails)
    assert found in ([3, 17], [8, 9, 40])
    assert all(not fails(found[:i] + found[i + 1 :]) for i in range(len(found)))
    assert shrink_ops([7], lambda ops: True) == [7]
    with pytest.raises(ValueError, match="nothing to shrink"):
        shrink_ops([1, 2], lambda ops: False)


def test_replay_of_ops_needs_a_config():
    with pytest.raises(ValueError, match="needs config"):
        replay([Op("seq_new")], CellCache)


@pytest.mark.parametrize(
    "document, complaint",
    [
        ("{", "cannot read it as JSON"),
        ({"format": "other"}, "not a numbakv op log"),
        ({"format": "numbakv-oplog", "version": 2}, "version 2"),
        ({"format": "numbakv-oplog", "version": 1, "config": {"x": 1}}, "CacheConfig fields"),
        ({"format": "numbakv-oplog", "version": 1, "config": {"n_layers": 0}}, "bad config"),
        ("ops", '"ops" must be a list'),
        ([["seq_nop", []]], "verb 'seq_nop'"),
        ([["seq_rm", []]], "has 0 args"),
        ([["rewind", [0, [1]]]], "non-scalar"),
        ([["step", [[0.5], None, 1, 0]]], "op 0 (step) needs"),
        ([["step", [[0], None, 0, 0]]], "op 0 (step) needs"),
        ([7], "op 0 is 7"),
    ],
)
def test_load_ops_refuses_a_damaged_file(tmp_path, recorded, document, complaint):
    path = tmp_path / "bad.json"
    if isinstance(document, list) or document == "ops":
        good = json.loads(recorded[0].read_text())
        document = good | {"ops": {} if document == "ops" else document}
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises(ValueError) as caught:
        load_ops(path)
    assert str(caught.value).startswith(f"{path}: ") and complaint in str(caught.value)


def test_cli_replay_agrees(recorded, capsys):
    path, log = recorded
    assert main(["replay", str(path), "--against", "numbakv.reference:CellCache"]) == 0
    out = capsys.readouterr().out
    assert out == f"{len(log.ops)} ops replayed: the cache agrees with the reference\n"


def test_cli_replay_diverges_with_the_shrunk_script(recorded, capsys):
    path, _ = recorded
    against = f"{__name__}:RewindKeepsOneMore"
    assert main(["replay", str(path), "--against", against]) == 1
    out = capsys.readouterr().out
    assert "shrunk to" in out and "differs from the reference" in out and "Op('rewind'" in out


@pytest.mark.parametrize(
    "against, complaint",
    [
        ("numbakv.nowhere:CellCache", "cannot import numbakv.nowhere"),
        ("numbakv.reference:Nothing", "has no attribute Nothing"),
        ("numbakv.reference", "is not MODULE:FACTORY"),
        ("numbakv:__version__", "is not callable"),
    ],
)
def test_cli_replay_refuses_a_bad_factory(recorded, capsys, against, complaint):
    with pytest.raises(SystemExit) as caught:
        main(["replay", str(recorded[0]), "--against", against])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1 and complaint in err


def test_cli_replay_refuses_a_damaged_file(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("[]")
    with pytest.raises(SystemExit) as caught:
        main(["replay", str(path), "--against", "numbakv.reference:CellCache"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1 and "not a numbakv op log" in err


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """(path of the .npz trace, the trace's ops, the OpLog's ops) of `serve` on the reference,
    recorded both ways: the Recorder's frames of every verb and the OpLog."""
    from numbakv import Recorder
    from numbakv.testing.from_trace import trace_ops

    cache = CellCache(CONFIG)
    recorder, log = Recorder(cache, every_verb=True), OpLog(cache)
    serve(log)
    path = tmp_path_factory.mktemp("trace") / "run.npz"
    recorder.save(path)
    return path, trace_ops(recorder.trace()), log.ops


def test_a_trace_of_every_verb_gives_the_same_workload_as_the_op_log(traced):
    _, from_trace, logged = traced
    accepted = [op for op in logged if op.verb != "seq_rm" or op.args != (5,)]  # refused
    assert [op.verb for op in from_trace] == [op.verb for op in accepted]
    for got, want in zip(from_trace, accepted, strict=True):
        if got.verb == "step":
            assert got.args[0] == tuple(want.args[0])
        elif got.verb in ("seq_rm", "rewind"):
            assert got.args == want.args
        elif got.verb == "seq_clone":  # upto explicit; the source may be any sharer
            assert got.args[1] == (want.args[1] if len(want.args) == 2 else got.args[1])


def test_a_trace_replays_into_any_cache_and_a_broken_one_shrinks(traced, capsys):
    from numbakv import load_trace

    path, ops, _ = traced
    replay(load_trace(path), CellCache)
    with pytest.raises(Divergence) as caught:
        replay(load_trace(path), RewindKeepsOneMore)
    assert len(caught.value.ops) <= 6 < len(ops) // 5
    assert main(["replay", str(path), "--against", "numbakv.reference:CellCache"]) == 0
    assert f"{len(ops)} ops replayed" in capsys.readouterr().out


def test_a_trace_of_steps_only_is_refused_for_replay():
    from numbakv import Recorder
    from numbakv.testing.from_trace import trace_ops

    cache = CellCache(CONFIG)
    recorder = Recorder(cache)  # a frame per step only: the verbs between are unknown
    a = cache.seq_new()
    for _ in range(2):
        cache.declare_step([a, a])
        cache.prepare_step()
        cache.rewind(a, 1)
    with pytest.raises(ValueError, match="every_verb=True"):
        trace_ops(recorder.trace())


# -- the step's calls in between, keywords, and the kit's granular ops -----------------------


class Keywords(CellCache):
    """The reference, taking (and keeping) a device path's keywords: stream=, out=."""

    def __init__(self, config):
        super().__init__(config)
        self.seen = []

    def prepare_step(self, width=None, stream=None):
        self.seen.append(("stream", stream))
        return super().prepare_step(width)

    def attend(self, layer, q, scale=None, mode="gathered", out=None):
        self.seen.append(("out", out))
        return super().attend(layer, q, scale, mode)


def write_and_attend(log: OpLog, step, **keywords) -> None:
    """Per layer, the step's write and attend through `log`, as a model's forward does."""
    for layer in range(CONFIG.n_layers):
        kv = np.ones((step.width, CONFIG.n_kv_heads, CONFIG.head_dim), np.float16)
        log.write(layer, kv, kv)
        log.attend(layer, np.ones((step.width, 2 * CONFIG.n_kv_heads, CONFIG.head_dim)),
                   mode="masked", **keywords)  # fmt: skip


def test_a_declaration_before_a_refused_verb_is_recorded_and_replays(tmp_path):
    log = OpLog(CellCache(CONFIG))
    a = log.seq_new()
    log.declare_step([a, a])
    with pytest.raises(SequenceError):
        log.seq_rm(5)  # refused: the declaration stays, in the cache and in the log
    write_and_attend(log, log.prepare_step())
    group = 2 * CONFIG.n_kv_heads
    assert log.ops == [
        Op("seq_new"), Op("declare", ((a, a),)), Op("seq_rm", (5,)), Op("prepare", (None,)),
        Op("write", (0, 2, 4, "float16")), Op("attend", (0, 2, group, 5, None, "masked")),
        Op("write", (1, 2, 6, "float16")), Op("attend", (1, 2, group, 7, None, "masked")),
    ]  # fmt: skip
    log.save(tmp_path / "log.json")
    assert load_ops(tmp_path / "log.json") == (CONFIG, log.ops)
    replay(tmp_path / "log.json", CellCache)
    replay(tmp_path / "log.json", CellCache, compare="table")


def test_a_verb_between_declare_and_prepare_replays_as_declare_and_prepare_ops():
    log = OpLog(CellCache(CONFIG))
    a = log.seq_new()
    log.declare_step([a])
    b = log.seq_new()  # in between: seq_new keeps the declaration
    with pytest.raises(StepError):
        log.declare_step([])  # refused in between: the first declaration stays
    write_and_attend(log, log.prepare_step(3))
    log.declare_step([a, b])
    log.seq_rm(b)  # drops the declaration: the prepare is refused, in the log too
    with pytest.raises(StepError):
        log.prepare_step()
    verbs = [op.verb for op in log.ops]
    assert verbs[:5] == ["seq_new", "declare", "seq_new", "declare", "prepare"]
    assert verbs[5:] == ["write", "attend"] * 2 + ["declare", "seq_rm", "prepare"]
    assert log.ops[3] == Op("declare", ((),)) and log.ops[4] == Op("prepare", (3,))
    replay(log.ops, CellCache, config=CONFIG)


def test_a_declaration_surviving_a_verb_is_caught_on_replay_of_the_granular_ops():
    paged = load_example("paged_cache.py")
    log = OpLog(CellCache(CONFIG))
    a = log.seq_new()
    log.declare_step([a] * 3)
    log.seq_rm(a)
    log.seq_new()  # hands out a again
    with pytest.raises(StepError):
        log.prepare_step()  # nothing declared: the table it was checked against is gone
    with pytest.raises(Divergence, match="nothing declared"):
        replay(log.ops, lambda c: paged.PagedCache(c, bugs={"decl_survives_rm"}), config=CONFIG)
    replay(log.ops, paged.PagedCache, config=CONFIG)


def test_every_argument_reaches_the_cache_and_keywords_are_recorded():
    cache = Keywords(CONFIG)
    log = OpLog(cache)
    a = log.seq_new()
    log.declare_step(seq_ids=[a, a])
    step = log.prepare_step(stream="s0")
    write_and_attend(log, step, out="o")  # attend's out= passes too
    log.declare_step([a])
    log.prepare_step(width=2, stream="s1")
    b = log.seq_clone(src=a, upto=1)
    log.rewind(b, position=0)
    assert cache.seen == [("stream", "s0"), ("out", "o"), ("out", "o"), ("stream", "s1")]
    assert log.ops == [Op("seq_new"), Op("step", ((a, a), None, 1, 1)), Op("step", ((a,), 2, 1, 2)),
                       Op("seq_clone", (a, 1)), Op("rewind", (b, 0))]  # fmt: skip
    replay(log.ops, CellCache, config=CONFIG)


def test_a_refused_prepare_keeps_the_declaration_and_its_retry_is_recorded():
    log = OpLog(CellCache(CONFIG))
    a = log.seq_new()
    log.declare_step([a])
    with pytest.raises(StepError):
        log.prepare_step(CONFIG.max_width + 1)  # too wide: refused, the declaration kept
    write_and_attend(log, log.prepare_step())
    with pytest.raises(StepError):
        log.prepare_step()  # nothing declared: recorded, and refused again on replay
    assert log.ops[:3] == [Op("seq_new"), Op("step", ((a,), 9, 1, 1)), Op("prepare", (None,))]
    assert [op.verb for op in log.ops[3:]] == ["write", "attend"] * 2 + ["prepare"]
    replay(log.ops, CellCache, config=CONFIG)
