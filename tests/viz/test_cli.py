"""`numbakv demo` (run once, through the console script) and the text map it prints."""

import re

import pytest

from numbakv import demo
from numbakv.cli import main
from numbakv.reference import CellCache
from numbakv.serve.lockstep import LockstepError
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
    done, _ = demo_run
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "numba CUDA simulator" in out or "GPU" in out
    rows = dict(re.findall(r"^(\S+) +\d+ +\d+ +\d+ +\d+ +\d+ +[\d.]+ +[\d.]+  (.+)$", out, re.M))
    assert rows.keys() == {a.name for a in demo.WORKLOAD}
    assert rows["cancel"] == "cancelled" and rows["n=3"] == "length length length"
    assert all(rows[a.name] == "length" for a in demo.WORKLOAD if a.n == 1 and not a.cancel_at)
    checked = re.search(r"checked against the reference: (\d+) batches, tables equal", out)
    steps = re.search(r"^(\d+) steps \((\d+) forwards\), (\d+) tokens generated", out, re.M)
    assert checked and steps
    assert int(checked.group(1)) == int(steps.group(1)) <= int(steps.group(2))
    generated = sum(int(n) for n in re.findall(r"^\S+ +\d+ +\d+ +\d+ +(\d+) ", out, re.M))
    assert generated == int(steps.group(3))


def test_demo_map_fits_the_columns(demo_run):
    done, _ = demo_run
    map_lines = re.findall(r"^ *\d+ ([a-zA-Z.*#|]+)$", done.stdout, re.MULTILINE)
    assert map_lines and all(len(line.replace("|", "")) <= 32 for line in map_lines)
    assert sum(line.count("|") for line in map_lines) == 1
    assert any("*" in line for line in map_lines)  # the n=3 prompt is shared


def test_demo_exit_code_says_when_the_device_disagrees(monkeypatch, capsys):
    def disagree(**kwargs):
        raise LockstepError("step 3: the cell tables differ")

    monkeypatch.setattr(demo, "run", disagree)
    assert main(["demo"]) == 1
    assert "disagrees with the reference: step 3" in capsys.readouterr().err


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit) as info:
        main(["nope"])
    assert info.value.code == 2
