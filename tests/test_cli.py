"""`numbakv demo` and the text map it prints."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from numbakv import demo
from numbakv.cli import main
from numbakv.reference import CellCache
from numbakv.viz import render_text

from conftest import small_config, step_with


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


def test_demo_checks_attention_and_shows_each_phase():
    lines = []
    work = demo.run(print_fn=lines.append)
    text = "\n".join(lines)
    assert work.max_error < 1e-5 and work.n_steps == 15
    assert text.count("\n  read_len ") == 6
    assert "*" in text  # the clone's shared cells
    final = work.cache.snapshot()
    assert render_text(final) in text
    assert final.read_len == work.cache.read_len and work.cache.growth_count >= 1


def test_demo_history_matches_the_cache():
    work = demo.run(print_fn=lambda line: None)
    for seq, layers in work.history.items():
        assert all(len(h) == work.cache.pos(seq) for h in layers)
    assert sorted(work.history) == work.cache.live_seqs


def test_main_demo_exit_code(capsys):
    assert main(["demo", "--seed", "3", "--columns", "32"]) == 0
    out = capsys.readouterr().out
    assert "max |difference|" in out
    map_lines = re.findall(r"^ *\d+ ([a-zA-Z.*#|]+)$", out, re.MULTILINE)
    assert map_lines and all(len(line.replace("|", "")) <= 32 for line in map_lines)
    assert sum(line.count("|") for line in map_lines) == 6


def test_console_script(tmp_path):
    script = Path(sys.executable).with_name("numbakv")  # installed beside the interpreter
    done = subprocess.run([str(script), "demo"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "max |difference|" in done.stdout


def test_unknown_command_exits_with_usage():
    with pytest.raises(SystemExit) as info:
        main(["nope"])
    assert info.value.code == 2


def test_demo_error_is_small_for_float16_too():
    work = demo.Workload(CellCache(small_config(dtype="float16", n_kv_heads=2)), seed=0)
    a = work.new()
    work.step([a, a, a])
    assert work.max_error < 1e-5
    assert np.isfinite(work.max_error)
