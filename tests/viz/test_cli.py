"""`numbakv demo` (run once, through the console script), the text map it prints, and the
command line's exit codes: 2 and one line for a usage error, 1 and one line for a failure."""

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.figure import Figure

import numbakv
from numbakv import Recorder
from numbakv.cli import demo, main
from numbakv.reference import CellCache
from numbakv.serve.kv_events import KVEventsConfig
from numbakv.serve.lockstep import LockstepError
from numbakv.trace import frames
from numbakv.viz import render_text

from helpers import small_config, step_with


def test_render_text_one_char_per_cell():
    cache = CellCache(small_config(capacity=16, initial_cells=8))
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, a, b, b, a])
    cache.seq_clone(a, upto=2)
    cache.rewind(b, 1)
    assert render_text(cache.snapshot()) == "0 **b.a|..."
    assert render_text(cache.snapshot(), columns=4) == "0 **b.\n4 a|..."


def test_render_text_marks_read_len_at_a_line_end():
    cache = CellCache(small_config(capacity=8, initial_cells=4))
    a = cache.seq_new()
    step_with(cache, [a] * 4)
    assert render_text(cache.snapshot(), columns=4) == "0 aaaa|"
    assert render_text(CellCache(small_config()).snapshot()) == "0 |"


def test_render_text_letters_per_id():
    cache = CellCache(small_config(max_seqs=60, capacity=60, initial_cells=60))
    for _ in range(60):
        step_with(cache, [cache.seq_new()])
    text = render_text(cache.snapshot(), columns=60)
    assert text == " 0 " + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + "#" * 8 + "|"


def test_demo_serves_the_workload_checked_against_the_reference(demo_run):
    done, _, _ = demo_run
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "numba CUDA simulator" in out or "GPU" in out
    table = r"^[a-zA-Z] +(\S+) +\d+ +\d+ +\d+ +\d+ +\d+ +[\d.]+ +[\d.]+ +(\d+)  (.+)$"
    found = re.findall(table, out, re.M)  # map letter first
    rows = {name: finished for name, _, finished in found}
    cached = {name: int(n) for name, n, _ in found}
    assert cached["late"] >= len(demo.SYSTEM) and cached["greet"] == 0  # the system prompt hit
    assert rows.keys() == {a.name for a in demo.WORKLOAD}
    assert rows["cancel"] == "cancelled" and rows["n=3"] == "length length length"
    assert all(rows[a.name] == "length" for a in demo.WORKLOAD if a.n == 1 and not a.cancel_at)
    checked = re.search(r"checked against the reference: (\d+) batches, tables equal", out)
    steps = re.search(r"^(\d+) steps \((\d+) forwards\), (\d+) tokens generated", out, re.M)
    assert checked and steps and re.search(r"annotations: .*\d+ hit", out)
    assert int(checked.group(1)) == int(steps.group(1)) <= int(steps.group(2))
    generated = sum(int(n) for n in re.findall(r"^[a-zA-Z] +\S+ +\d+ +\d+ +\d+ +(\d+) ", out, re.M))
    assert generated == int(steps.group(3))


def test_demo_map_fits_the_columns(demo_run):
    done, _, _ = demo_run
    map_lines = re.findall(r"^ *\d+ ([a-zA-Z.*#|]+)$", done.stdout, re.MULTILINE)
    assert map_lines and all(len(line.replace("|", "")) <= 32 for line in map_lines)
    assert sum(line.count("|") for line in map_lines) == 1
    assert any("*" in line for line in map_lines)  # the n=3 prompt is shared


# -- usage errors and failures: exit 2 or 1, one line on stderr -------------------------


def run_cli(args, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `numbakv ARGS`, through SystemExit or a return."""
    try:
        code = main([str(arg) for arg in args])
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *names: str) -> None:
    assert len(err.splitlines()) == 1, err
    for name in names:
        assert name in err, err


@pytest.fixture
def no_demo(monkeypatch):
    """Replaces demo.run; the list of its calls."""
    calls = []
    monkeypatch.setattr(demo, "run", lambda **kwargs: calls.append(kwargs))
    return calls


def test_demo_exit_code_says_when_the_device_disagrees(monkeypatch, capsys):
    def disagree(**kwargs):
        raise LockstepError("step 3: the cell tables differ")

    monkeypatch.setattr(demo, "run", disagree)
    code, _, err = run_cli(["demo"], capsys)
    assert code == 1
    assert_one_line(err, "numbakv demo: the device path disagrees with the reference: step 3")


def test_unknown_command_exits_with_usage(capsys):
    code, _, err = run_cli(["nope"], capsys)
    assert code == 2
    assert_one_line(err, "numbakv: error: argument command: invalid choice: 'nope'")


def test_version(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out == f"numbakv {numbakv.__version__}\n"


def test_python_dash_m_runs_the_cli(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "numbakv", "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout == f"numbakv {numbakv.__version__}\n"
    done = subprocess.run([sys.executable, "-m", "numbakv"], capture_output=True, text=True)
    assert done.returncode == 2
    assert_one_line(done.stderr, "required: command")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--columns", "0"], ["--columns", "0 is below 1"]),
        (["--columns", "many"], ["--columns", "'many' is not an integer"]),
        (["--seed", "-1"], ["--seed", "-1 is below 0"]),
        (["--trace", "missing/run.npz"], ["--trace", "missing does not exist"]),
        (["--trace", "run"], ["--trace", "run does not end in .npz"]),
        (["--trace", "."], ["--trace", ". is a folder"]),
        (["--kv-events", "http://x"], ["--kv-events", "endpoint='http://x'", "tcp://"]),
        (["--tp", "0"], ["--tp", "0 is below 1"]),
    ],
)
def test_demo_refuses_bad_arguments_before_running(args, names, no_demo, capsys):
    code, _, err = run_cli(["demo", *args], capsys)
    assert code == 2 and no_demo == []
    assert_one_line(err, "numbakv demo: error: argument", *names)


def test_demo_passes_checked_arguments(no_demo, tmp_path, capsys):
    path = tmp_path / "run.npz"
    code, _, _ = run_cli(["demo", "--seed", "3", "--columns", "8", "--trace", path], capsys)
    assert code == 0 and no_demo == [
        dict(seed=3, columns=8, trace_path=str(path), kv_events=None, tp=1)
    ]
    code, _, _ = run_cli(["demo", "--kv-events", "tcp://*:5557"], capsys)
    assert code == 0 and no_demo[1]["kv_events"] == KVEventsConfig("tcp://*:5557")


def test_demo_cannot_write_its_trace(monkeypatch, tmp_path, capsys):
    def full_disk(**kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(demo, "run", full_disk)
    code, _, err = run_cli(["demo", "--trace", tmp_path / "run.npz"], capsys)
    assert code == 1
    assert_one_line(err, "numbakv demo: cannot write the trace", "run.npz", "No space left")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(columns=0), ValueError, "columns=0 is below 1"),
        (dict(seed=-2), ValueError, "seed=-2 is below 0"),
        (dict(seed=1.5), TypeError, "seed must be an integer"),
        (dict(trace_path="run.txt"), ValueError, "does not end in .npz"),
        (dict(trace_path="missing/run.npz"), ValueError, "folder missing does not exist"),
        (dict(tp=0), ValueError, "tp=0 is below 1"),
    ],
)
def test_demo_run_checks_its_arguments_first(monkeypatch, kwargs, error, match):
    monkeypatch.setattr(demo.Model, "from_seed", lambda *a: pytest.fail("the demo started"))
    with pytest.raises(error, match=match):
        demo.run(**kwargs)


@pytest.fixture
def no_loading(monkeypatch):
    """Makes load_trace fail the test: the command must stop before it."""
    monkeypatch.setattr(frames, "load_trace", lambda path: pytest.fail("the trace was loaded"))


@pytest.mark.parametrize(
    ("output", "names"),
    [
        ("missing/x.png", ["-o/--output", "missing does not exist; create it first"]),
        ("x.foo", ["-o/--output", "x.foo has the extension .foo", ".png", ".svg"]),
        ("noext", ["-o/--output", "noext has no extension", ".png"]),
        (".", ["-o/--output", "is a folder; give a file name"]),
    ],
)
def test_viz_refuses_an_output_before_loading(output, names, tmp_path, no_loading, capsys):
    empty_file = tmp_path / "run.npz"
    empty_file.write_bytes(b"")
    code, _, err = run_cli(["viz", empty_file, "-o", tmp_path / output], capsys)
    assert code == 2
    assert_one_line(err, "numbakv viz: error: argument", *names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.npz"]  # nothing written


def test_viz_refuses_pgf_without_latex(monkeypatch, trace_file, tmp_path, no_loading, capsys):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    code, _, err = run_cli(["viz", trace_file, "-o", tmp_path / "x.pgf"], capsys)
    assert code == 2
    assert_one_line(err, "-o/--output", ".pgf needs")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--step", "13"], ["argument --step: 13 is outside the trace's 13 recorded steps"]),
        (["--step", "-14"], ["argument --step: -14", "give -13 to 12"]),
        (["--step", "last"], ["argument --step: invalid int value: 'last'"]),
        (["--window", "5"], ["argument --window: 5 is not one of the trace's windows (0, 2)"]),
        (["--window", "-1"], ["argument --window: -1 is below 0"]),
        (["--kind", "pie"], ["argument --kind: invalid choice: 'pie'"]),
    ],
)
def test_viz_refuses_options_out_of_range(args, names, trace_file, tmp_path, capsys):
    out = tmp_path / "x.png"
    code, _, err = run_cli(["viz", trace_file, "-o", out, *args], capsys)
    assert code == 2
    assert_one_line(err, "numbakv viz: error:", *names)
    assert not out.exists()


@pytest.mark.parametrize("missing", ["nope.npz", "."])
def test_viz_refuses_a_missing_trace(missing, tmp_path, no_loading, capsys):
    code, _, err = run_cli(["viz", tmp_path / missing, "-o", tmp_path / "x.png"], capsys)
    assert code == 2
    assert_one_line(err, "numbakv viz: error: argument TRACE:")
    assert not (tmp_path / "x.png").exists()


def test_viz_fails_on_a_damaged_trace(trace_file, tmp_path, capsys):
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(trace_file.read_bytes()[:-40])
    code, _, err = run_cli(["viz", damaged, "-o", tmp_path / "x.png"], capsys)
    assert code == 1
    assert_one_line(err, "numbakv viz:", "damaged.npz is not a readable numbakv trace")
    assert not (tmp_path / "x.png").exists()


def test_viz_fails_on_an_inconsistent_trace(trace_file, tmp_path, capsys):
    with np.load(trace_file) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["step_seq_ids"][0] = 99
    np.savez(tmp_path / "seq99.npz", **arrays)
    code, _, err = run_cli(["viz", tmp_path / "seq99.npz", "-o", tmp_path / "x.png"], capsys)
    assert code == 1
    assert_one_line(err, "seq99.npz is not a consistent numbakv trace", "sequence 99")
    assert not (tmp_path / "x.png").exists()


def test_viz_fails_on_a_trace_without_steps(tmp_path, capsys):
    cache = CellCache(small_config())
    Recorder(cache).save(tmp_path / "empty.npz")
    code, _, err = run_cli(["viz", tmp_path / "empty.npz", "-o", tmp_path / "x.png"], capsys)
    assert code == 1
    assert_one_line(err, "empty.npz records no step")


def test_viz_fails_when_the_image_cannot_be_written(monkeypatch, trace_file, tmp_path, capsys):
    def denied(self, path, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Figure, "savefig", denied)
    code, out, err = run_cli(
        ["viz", trace_file, "-o", tmp_path / "x.png", "--kind", "cells"], capsys
    )
    assert code == 1 and out == ""
    assert_one_line(err, "numbakv viz: cannot write", "x.png (Permission denied)")


def test_viz_writes_the_named_file(trace_file, tmp_path, capsys):
    out = tmp_path / "x.svg"
    code, stdout, _ = run_cli(["viz", trace_file, "-o", out, "--kind", "cells"], capsys)
    assert code == 0 and stdout == f"wrote {out}\n"
    assert out.read_text().startswith("<?xml")
