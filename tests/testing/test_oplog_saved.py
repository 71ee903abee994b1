"""`OpLog` records `seq_save` and `seq_load` (issue 45): a run that restores sequences
replays as that run — each side saves and loads its own state, a state from outside the
log travels beside it — where the replay once refused the loaded sequence's later steps
on both sides and reported agreement on a run that never happened."""

import contextlib
import dataclasses
import json

import numpy as np
import pytest

import numbakv
from numbakv.core.errors import CacheError
from numbakv.reference import CellCache
from numbakv.testing.op import Op
from numbakv.testing.oplog import OpLog
from numbakv.testing.oplog_file import load_ops
from numbakv.testing.ops import Divergence, apply
from numbakv.testing.replay import replay

from helpers import small_config

CONFIG = small_config(n_layers=2, capacity=32, max_seq_len=16, max_seqs=4, initial_cells=4)


def step(cache, ids, seed: int) -> None:
    """A step of `ids`: write and attend every layer (K/V and q from `seed`)."""
    cache.declare_step(ids)
    width = cache.prepare_step().width
    rng = np.random.default_rng(seed)
    for layer in range(CONFIG.n_layers):
        k, v = rng.standard_normal((2, width, 1, CONFIG.head_dim)).astype(np.float32)
        cache.write(layer, k, v)
        cache.attend(layer, rng.standard_normal((width, 2, CONFIG.head_dim)).astype(np.float32))


def run(log) -> dict:
    """A run with a host tier's habits: a sequence saved, dropped and loaded back; a tail
    saved and loaded onto its prefix's clone; a state from another cache loaded; steps on
    every loaded sequence. The live sequences' lengths at the end."""
    a = log.seq_new()
    step(log, [a] * 5, 1)
    state = log.seq_save(a)
    log.seq_rm(a)
    b = log.seq_load(state)
    step(log, [b], 2)
    tail = log.seq_save(b, start=3)
    c = log.seq_load(tail, onto=b)
    step(log, [c, b], 3)
    other = CellCache(CONFIG)
    d = other.seq_new()
    step(other, [d] * 4, 4)
    e = log.seq_load(other.seq_save(d))  # from outside the log
    step(log, [e, c], 5)
    return {seq: log.pos(seq) for seq in log.live_seqs}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    log = OpLog(CellCache(CONFIG))
    lengths = run(log)
    path = tmp_path_factory.mktemp("log") / "run.json"
    log.save(path)
    return log, lengths, path


def test_saves_and_loads_are_ops_and_an_outside_state_lies_beside_the_log(recorded):
    log, _, path = recorded
    verbs = [op.verb for op in log.ops]
    assert verbs.count("save") == 2 and verbs.count("load") == 3
    loads = [op.args[:2] for op in log.ops if op.verb == "load"]
    assert loads[:2] == [(0, None), (1, 0)]  # the save ops' indices; onto b (a's id 0 again)
    written = [args for verb, args in json.loads(path.read_text())["ops"] if verb == "load"]
    assert [w[0] for w in written[:2]] == [0, 1] and written[2][0].startswith("run.states/")
    assert (path.parent / written[2][0]).is_file()


def test_the_replay_is_the_run_that_happened(recorded):
    _, lengths, path = recorded
    config, ops = load_ops(path)
    cache, last, saved = CellCache(config), None, []
    for op in ops:  # the reference alone: every op as the run had it, none refused
        if op.verb == "load" and type(op.args[0]) is int:
            op = Op("load", (saved[op.args[0]], *op.args[1:]))
        result = apply(cache, op, config, last)
        saved += [result] if op.verb == "save" else []
        last = result if op.verb == "prepare" else last
    assert {seq: cache.pos(seq) for seq in cache.live_seqs} == lengths
    replay(path, CellCache)
    replay(path, CellCache, compare="table")
    replay(path, numbakv.CellCache, compare="table")


class LoadDropsTheLastPosition(CellCache):
    """Planted bug: a load keeps every position of the state but its last."""

    def seq_load(self, state, onto=None, convert=False):
        seq = super().seq_load(state, onto, convert)
        if self.pos(seq) > state.start:
            self.rewind(seq, self.pos(seq) - 1)
        return seq


def test_a_wrong_load_diverges_on_replay(recorded):
    _, _, path = recorded
    with pytest.raises(Divergence):
        replay(path, LoadDropsTheLastPosition, shrink=False)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../x.npz", "a state lies in run.states/"),
        ("/tmp/run.states/x.npz", "a state lies in run.states/"),
        ("run.states/none.npz", "op 0 \\(load\\)"),
        ("run.states/bad.npz", "op 0 \\(load\\)"),
    ],
)
def test_a_state_file_outside_the_folder_missing_or_damaged_is_refused(tmp_path, name, message):
    (tmp_path / "run.states").mkdir()
    (tmp_path / "run.states" / "bad.npz").write_bytes(b"PK\x03\x04 not a zip")
    document = {"format": "numbakv-oplog", "version": 1, "config": dataclasses.asdict(CONFIG),
                "ops": [["load", [name, None]]]}  # fmt: skip
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=message):
        load_ops(path)


@pytest.mark.parametrize(
    "refused",
    [("rewind", 3, 0), ("seq_rm", 7), ("seq_clone", 9), ("rewind", 0, 99), ("seq_load", None)],
)
def test_a_refused_verb_between_declare_and_prepare_keeps_the_step_in_the_log(refused):
    """The cache keeps the declaration through a refused verb and places the step; so does
    the log, whose replay places it too (issue 45 reported the log losing it)."""
    log = OpLog(CellCache(CONFIG))
    a = log.seq_new()
    log.declare_step([a, a])
    with pytest.raises(CacheError):
        getattr(log, refused[0])(*refused[1:])
    step = log.prepare_step()
    assert step.n_tokens == 2 and log.pos(a) == 2
    cache = CellCache(CONFIG)
    for op in log.ops:
        with contextlib.suppress(CacheError):
            apply(cache, op, CONFIG)
    assert cache.pos(0) == 2
    replay(log.ops, CellCache, config=CONFIG)
