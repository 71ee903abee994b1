"""Hostile arguments that once leaked a traceback (issue 45): a file name longer than the file
system allows, `--bin 2**63`, `reserve` of absurd head counts. Each is now a numbakv error
or the command line's one-line exit 2, and changes nothing."""

import pytest

import numbakv
import numbakv.testing
from numbakv import Recorder
from numbakv.cli import main
from numbakv.core.errors import AllocationError
from numbakv.core.paths import existing_file, new_file
from numbakv.reference import CellCache as RefCache

from helpers import small_config

LONG = "a" * 300 + ".npz"  # past NAME_MAX (255) of every common file system


@pytest.mark.parametrize("check", [existing_file, new_file])
@pytest.mark.parametrize("name", [LONG, f"{'b' * 300}/x.npz", "nul\0byte.npz"])
def test_a_path_the_system_cannot_look_at_is_the_callers_error(tmp_path, check, name):
    with pytest.raises(KeyError, match=r"File name too long|embedded null byte"):
        check(tmp_path / name, error=KeyError)


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    cache = RefCache(small_config())
    recorder = Recorder(cache)
    seq = cache.seq_new()
    for _ in range(3):
        cache.declare_step([seq])
        cache.prepare_step()
    path = tmp_path_factory.mktemp("trace") / "run.npz"
    recorder.save(path)
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([LONG], "File name too long"),
        (["TRACE", "-o", f"{'c' * 300}.png"], "File name too long"),
        (["TRACE", "--bin", str(2**63)], "argument --bin: 9223372036854775808 exceeds"),
        (["TRACE", "--kind", "timeline", "--bin", str(2**63)], "argument --bin"),
    ],
)
def test_viz_refuses_in_one_line(trace_path, tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    args = [str(trace_path) if a == "TRACE" else a for a in args]
    with pytest.raises(SystemExit) as exit_:
        main(["viz", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("n_heads", [2**40, 2**63])
def test_reserve_of_absurd_head_counts_is_an_allocation_error(n_heads):
    cache = numbakv.CellCache(small_config())
    with pytest.raises(AllocationError, match=f"n_heads={n_heads}"):
        cache.reserve(n_heads)
    assert cache.bindings().workspaces == ()  # nothing made
    cache.reserve(2)  # and the cache still reserves what it can
    assert [n for n, _ in cache.bindings().workspaces] == [2]


def test_kinds_are_importable_as_documented():
    assert {*numbakv.testing.KINDS, "reload"} >= {"step", "seq_clone", "rewind", "reload"}
    assert "hypothesis" not in numbakv.testing.__doc__
