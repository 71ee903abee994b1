"""`numbakv replay` on hostile input: a damaged or hostile log, a factory that raises or
makes no cache, a cache that crashes. Each is one line and an exit status, never a
traceback; `load_ops` refuses what a replay could not hold before anything is allocated."""

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from numbakv.cli import main
from numbakv.core.config import CacheConfig
from numbakv.reference import CellCache
from numbakv.testing import oplog_file
from numbakv.testing.op import Op
from numbakv.testing.oplog_file import load_ops
from numbakv.testing.ops import Divergence
from numbakv.testing.replay import replay

CONFIG = CacheConfig(n_layers=2, n_kv_heads=2, head_dim=4, windows=(0, 2), capacity=16,
                     max_width=4, max_seqs=3)  # fmt: skip
REFERENCE = "numbakv.reference:CellCache"
FACTORIES = """
from numbakv.reference import CellCache

def raises(config):
    raise RuntimeError("no device here")

def exits(config):
    raise SystemExit(3)

def number(config):
    return 42

class HalfCache:  # the table verbs only
    def __init__(self, config):
        self.config = config
    seq_new = seq_clone = seq_rm = rewind = clear = lambda self, *args: None

class Crashes(CellCache):  # rewind ends in an IndexError
    def rewind(self, seq, position):
        return [][position]
"""


def log(ops, **fields) -> dict:
    return {"format": "numbakv-oplog", "version": 1, "config": asdict(CONFIG) | fields,
            "ops": ops}  # fmt: skip


def cli(*args: str, cwd=None) -> tuple[int, str, str]:
    """`python -m numbakv replay ARGS` in a process of its own: (status, stdout, stderr)."""
    done = subprocess.run([sys.executable, "-m", "numbakv", "replay", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def refused(capsys, *args: str) -> str:
    """The one line of `numbakv replay ARGS` exiting 2 (in this process)."""
    with pytest.raises(SystemExit) as caught:
        main(["replay", *args])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


BIG_HEADS = {"n_kv_heads": 8, "head_dim": 4096, "capacity": 64, "max_width": 64}
HOSTILE = {  # name: (the document, or its text, what the one line says)
    "a huge group": (log([["seq_new", []], ["step", [[0], None, 10**9, 0]]]),
                     "op 1 (step) needs [[ids], width or null, group in [1, 256]"),
    "a group whose q passes 1 GiB": (log([["step", [[0], None, 256, 0]]], **BIG_HEADS),
                                    "op 0 (step) would make a q of [64, 2048, 4096] float32"),
    "a huge seed": (log([["step", [[0], None, 1, 2**64]]]), "seed in [0, 2**64)"),
    "a negative seed": (log([["write", [0, 1, -1]]]), "op 0 (write) needs"),
    "huge rows": (log([["write", [0, 10**12, 0]]]), "op 0 (write) would make K, V and q of"),
    "huge heads": (log([["attend", [0, 1, 10**9, 0, None, None]]]), "n_heads in [0, 256 x"),
    "a huge q": (log([["attend", [0, 10**8, 512, 0, None, None]]]), "would make a q of"),
    "a dtype that is no number": (log([["write", [0, 1, 0, "U5"]]]), "numeric dtype"),
    "a scale that is no number": (log([["attend", [0, 1, 2, 0, "1", None]]]), "scale null"),
    "a mode that is no string": (log([["attend", [0, 1, 2, 0, None, 1]]]), "mode null"),
    "a field no step has": (log([["read", ["__class__"]]]), "op 0 (read) needs"),
    "a mask without a window": (log([["read", ["mask"]]]), "op 0 (read) needs"),
    "declared floats": (log([["declare", [[0.5]]]]), "op 0 (declare) needs [[ids]]"),
    "a width that is a list": (log([["prepare", [[4]]]]), "op 0 (prepare) needs"),
    "deep nesting": ('{"ops": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),
    "an int of 5000 digits": ('{"version": ' + "9" * 5000 + "}", "Exceeds the limit (4300"),
    "bytes that are not UTF-8": (b"\xff\xfe{}", "cannot read it as JSON"),
    "a 1 TiB pool": (log([], capacity=2**30, head_dim=2**6), "bad config (a full pool"),
    "a pool past 1 GiB": (log([], capacity=2**20, head_dim=64), "a replay holds"),
    "a version that is a long string": ({"format": "numbakv-oplog", "version": "9" * 10**5},
                                        "version '9999"),
}  # fmt: skip


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_log_is_one_line_before_anything_is_allocated(tmp_path, capsys, name):
    document, complaint = HOSTILE[name]
    path = tmp_path / "hostile.json"
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises(ValueError) as caught:
        load_ops(path)
    assert str(caught.value).startswith(f"{path}: ") and complaint in str(caught.value)
    err = refused(capsys, str(path), "--against", REFERENCE)
    assert complaint in err and len(err) < 1000


def test_files_that_are_no_log_are_one_line(tmp_path, capsys, monkeypatch):
    long_name = str(tmp_path / ("a" * 5000))
    assert "File name too long" in refused(capsys, long_name, "--against", REFERENCE)
    with pytest.raises(ValueError, match=r"cannot read it \(File name too long"):
        load_ops(long_name)
    assert "is a folder" in refused(capsys, str(tmp_path), "--against", REFERENCE)
    with pytest.raises(ValueError, match="is a folder"):
        load_ops(tmp_path)
    assert "not a regular file" in refused(capsys, "/dev/zero", "--against", REFERENCE)
    path = tmp_path / "log.json"
    path.write_text(json.dumps(log([["seq_new", []]] * 20)))
    monkeypatch.setattr(oplog_file, "MAX_LOG_BYTES", 100)
    assert "larger than 100 bytes" in refused(capsys, str(path), "--against", REFERENCE)


def test_hostile_scalars_replay_as_refusals(tmp_path, capsys):
    big = 10**300
    path = tmp_path / "scalars.json"
    path.write_text(json.dumps(log([
        ["seq_new", []], ["seq_rm", [big]], ["rewind", [0, big]], ["seq_clone", ["0", 1.5]],
        ["step", [[0], 10**12, 1, 0]], ["step", [[big], None, 1, 0]], ["declare", [None]],
        ["declare", [[0]]], ["prepare", [10**12]], ["prepare", [-1]], ["read", ["mask", big]],
        ["write", [big, 1, 0]], ["attend", [-1, 1, 2, 0, 1e308, "sideways"]], ["seq_rm", [True]],
    ])))  # fmt: skip
    config, ops = load_ops(path)
    replay(ops, CellCache, config=config)
    assert main(["replay", str(path), "--against", REFERENCE]) == 0
    assert capsys.readouterr().out == "14 ops replayed: the cache agrees with the reference\n"


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    """(a folder holding `factories.py`, a log that rewinds): for processes of their own."""
    folder = tmp_path_factory.mktemp("factories")
    (folder / "factories.py").write_text(FACTORIES)
    (folder / "log.json").write_text(json.dumps(log([
        ["seq_new", []], ["step", [[0, 0], None, 1, 0]], ["seq_new", []], ["rewind", [0, 1]],
    ])))  # fmt: skip
    return folder


@pytest.mark.parametrize("name, complaint", [
    ("raises", "factories:raises(config) raised RuntimeError: no device here"),
    ("exits", "factories:exits(config) raised SystemExit: 3"),
    ("number", "factories:number(config) returned 42 (int), not a cache: it has no seq_new, "),
    ("HalfCache", "not a cache: it has no declare_step, prepare_step, write, attend, pos, "
                  "live_seqs, used_cells, free_cells"),
])  # fmt: skip
def test_a_factory_that_raises_or_makes_no_cache_is_one_line(factories, name, complaint):
    status, out, err = cli("log.json", "--against", f"factories:{name}", cwd=factories)
    assert (status, out, err.count("\n")) == (2, "", 1) and complaint in err, err


def test_a_cache_that_crashes_is_a_divergence(factories):
    status, out, err = cli("log.json", "--against", "factories:Crashes", cwd=factories)
    assert (status, err) == (1, "") and "IndexError" in out and "Op('rewind', (0, 1))" in out
    assert cli("log.json", "--against", REFERENCE, cwd=factories)[0] == 0
    assert "File name too long" in cli("a" * 5000, "--against", REFERENCE)[2]


def no_device(config):
    raise RuntimeError("no device here")


def test_a_factory_failing_in_replay_is_its_divergence_unshrunk():
    with pytest.raises(Divergence, match="raised RuntimeError") as caught:
        replay([Op("seq_new")], no_device, config=CONFIG)
    assert caught.value.ops == [] and caught.value.index == -1
