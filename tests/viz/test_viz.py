"""The pictures: the data behind each plot equals what the table says; the CLI writes PNGs."""

import re

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from matplotlib.image import imread

from numbakv.cli import main
from numbakv.reference import CellCache
from numbakv.snapshot import FREE, SHARED
from numbakv.trace import Recorder, load_trace
from numbakv.viz import plot_all, plot_cells, plot_mask, plot_metrics, plot_timeline
from numbakv.viz.plots import PALETTE, owner_colours, seq_colour

from helpers import Snapshots, churn, small_config, step_with


def expected_code(owners: list[int]) -> int:
    if not owners:
        return FREE
    return owners[0] if len(owners) == 1 else SHARED


@pytest.fixture
def recorded():
    """A churned cache with its recorder and the snapshot after every step."""
    cache = CellCache(small_config(max_seqs=9, capacity=40, initial_cells=3))
    recorder = Recorder(cache)
    expect = Snapshots(cache)
    churn(cache, list(range(3, 900, 11)))
    return cache, recorder.trace(), expect


def test_plot_cells_grid_is_the_table(recorded):
    cache, _, _ = recorded
    snap = cache.snapshot()
    assert (snap.codes == SHARED).any() and (snap.codes == FREE).any()
    for columns in (1, 7, 16):
        image = plot_cells(snap, columns=columns).axes[0].images[0]
        grid = image.get_array()
        n = max(snap.rows, snap.read_len)
        assert grid.shape == (-(-n // columns), columns)
        for cell in range(grid.size):
            r, c = divmod(cell, columns)
            if cell < n:
                assert grid[r, c] == expected_code(snap.owners_of(cell)), cell
            else:
                assert grid.mask[r, c], cell  # past the pool's rows: not drawn


def test_plot_cells_colours(recorded):
    cache, _, _ = recorded
    snap = cache.snapshot()
    image = plot_cells(snap, columns=8).axes[0].images[0]
    rgba = image.to_rgba(image.get_array())
    for cell, code in enumerate(snap.codes.tolist()):
        want = {FREE: "#FFFFFF", SHARED: "#000000"}.get(code) or seq_colour(code)
        assert tuple(rgba[cell // 8, cell % 8]) == pytest.approx(to_rgba(want)), cell


def test_colours_are_stable_per_id():
    cmap, norm = owner_colours(20)
    for seq in range(20):
        assert to_rgba(cmap(norm(seq))) == to_rgba(PALETTE[seq % len(PALETTE)])
    assert seq_colour(3) == seq_colour(3 + len(PALETTE))


def test_plot_timeline_is_owner_by_step_and_cell(recorded):
    _, trace, expect = recorded
    data = plot_timeline(trace).axes[0].images[0].get_array()
    step_snaps = expect.frames[1:]
    assert data.shape == (len(step_snaps), max(s.read_len for s in expect.frames))
    for s, snap in enumerate(step_snaps):
        for c in range(data.shape[1]):
            assert data[s, c] == expected_code(snap.owners_of(c)), (s, c)


def test_plot_timeline_picks_evenly_when_long(recorded):
    _, trace, expect = recorded
    data = plot_timeline(trace, max_frames=5).axes[0].images[0].get_array()
    steps = np.linspace(0, len(expect.frames) - 2, 5).round().astype(int)
    assert data.shape[0] == 5
    for row, s in enumerate(steps):
        snap = expect.frames[s + 1]
        assert [data[row, c] for c in range(snap.read_len)] == [
            expected_code(snap.owners_of(c)) for c in range(snap.read_len)
        ]


def test_plot_metrics_draws_the_metrics(recorded):
    _, trace, expect = recorded
    fig = plot_metrics(trace)
    cells_ax, frag_ax, width_ax = fig.axes
    lines = {line.get_label(): line.get_ydata() for line in cells_ax.get_lines()}
    used = [sum(1 for c in range(s.read_len) if s.owners_of(c)) for s in expect.frames]
    held = [sum(len(s.owners_of(c)) for c in range(s.read_len)) for s in expect.frames]
    np.testing.assert_array_equal(lines["used"], used)
    np.testing.assert_array_equal(lines["read_len"], [s.read_len for s in expect.frames])
    np.testing.assert_array_equal(lines["rows"], [s.rows for s in expect.frames])
    np.testing.assert_array_equal(lines["saved"], np.subtract(held, used))
    frag = [
        1 - u / s.read_len if s.read_len else 0 for u, s in zip(used, expect.frames, strict=True)
    ]
    np.testing.assert_allclose(frag_ax.get_lines()[0].get_ydata(), frag)
    np.testing.assert_array_equal(width_ax.get_lines()[0].get_ydata(), [0, *expect.steps.values()])
    growth_lines = [line for line in width_ax.get_lines() if line.get_linestyle() == ":"]
    rows = [s.rows for s in expect.frames]
    assert len(growth_lines) == sum(b > a for a, b in zip([0, *rows[:-1]], rows, strict=True))


def test_plot_mask_is_the_mask():
    cache = CellCache(small_config(windows=(0, 2)))
    a, b = cache.seq_new(), cache.seq_new()
    step_with(cache, [a, b, a])
    step = step_with(cache, [b, a, a], width=5)
    for window in (0, 2):
        ax = plot_mask(step, window).axes[0]
        np.testing.assert_array_equal(ax.images[0].get_array(), step.mask(window))
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["1@1", "0@2", "0@3", "pad", "pad"]


def test_plot_all_has_every_picture(recorded):
    _, trace, _ = recorded
    fig = plot_all(trace, step=3)
    n_images = sum(len(ax.images) for ax in fig.get_axes())
    assert n_images == 3 and len(fig.get_axes()) == 6  # cells, mask, timeline + 3 metrics


# -- the CLI -------------------------------------------------------------------------


@pytest.fixture
def trace_path(recorded, tmp_path):
    _, trace, _ = recorded
    path = tmp_path / "run.npz"
    trace.save(path)
    return path


@pytest.mark.parametrize("kind", ["all", "cells", "timeline", "metrics", "mask"])
def test_cli_writes_a_png(trace_path, tmp_path, kind, capsys):
    out = tmp_path / f"{kind}.png"
    assert main(["viz", str(trace_path), "-o", str(out), "--kind", kind, "--step", "2"]) == 0
    pixels = imread(out)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels.std() > 0  # not a blank image
    assert f"wrote {out}" in capsys.readouterr().out


def test_demo_trace_feeds_viz(demo_run, tmp_path):
    done, path = demo_run
    assert done.returncode == 0, done.stderr
    trace = load_trace(path)
    assert len(trace.step_frames) >= int(re.search(r"(\d+) steps", done.stdout).group(1))
    assert main(["viz", str(path), "-o", str(tmp_path / "demo.png")]) == 0
    assert imread(tmp_path / "demo.png").shape[0] > 100
