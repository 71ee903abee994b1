"""Pictures of big pools stay true: a sparse mask at 65 536 cells lights every attended
cell's pixel in the written PNG, binned occupancy keeps the true mean, and the movie and
the command line's zoom keywords draw the same data as the Python plots."""

import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread
from PIL import Image

from numbakv import CacheConfig, Recorder
from numbakv.cli import main
from numbakv.core.snapshot import Snapshot
from numbakv.reference import CellCache
from numbakv.trace import TraceStep
from numbakv.viz import (
    owner_pixels,
    owners_of,
    plot_all,
    plot_cells,
    plot_locality,
    plot_mask,
    plot_timeline,
    save_movie,
)

from helpers import churn, small_config, step_with
from scheduler_workload import Workload

N_CELLS = 65536


def sparse_step(attended: np.ndarray) -> TraceStep:
    """A step over 65 536 cells: sequence 0 holds only `attended` (positions in cell order),
    sequence 1 every other cell; token 0 is sequence 0's last position."""
    pos = np.zeros(N_CELLS, dtype=np.int32)
    owners = np.full((N_CELLS, 1), 2, dtype=np.uint64)  # sequence 1
    others = np.setdiff1d(np.arange(N_CELLS), attended)
    pos[others] = np.arange(len(others))
    pos[attended], owners[attended] = np.arange(len(attended)), 1
    live = np.zeros(2, dtype=bool) | True
    snap = Snapshot(pos, owners, live, N_CELLS, N_CELLS, N_CELLS)
    last = len(attended) - 1
    return TraceStep(
        cells=np.array([attended[-1], -1], dtype=np.int32),
        positions=np.array([last, -1], dtype=np.int32),
        seq_ids=np.array([0, -1], dtype=np.int32),
        snapshot=snap,
        windows=(0,),
    )


def test_a_sparse_mask_lights_every_attended_cells_pixel(tmp_path):
    rng = np.random.default_rng(0)
    spread = np.linspace(20000, 40000, 100).astype(np.int64)  # 100 evenly among 20 000
    scattered = np.sort(rng.choice(N_CELLS, 40, replace=False))
    attended = np.unique(np.concatenate([spread, scattered]))
    step = sparse_step(attended)
    np.testing.assert_array_equal(np.flatnonzero(step.mask(0)[0]), attended)
    fig = plot_mask(step, 0)
    pixels = fig.numbakv["pixels"]
    assert pixels.cell_edges[1] - pixels.cell_edges[0] > 64  # binned: many cells a pixel
    assert pixels.attended.sum() == len(attended) and pixels.attended[1].sum() == 0
    columns = np.searchsorted(pixels.cell_edges, attended, side="right") - 1
    np.testing.assert_array_equal(np.flatnonzero(pixels.attended[0]), np.unique(columns))
    path = tmp_path / "mask.png"
    fig.savefig(path, dpi=100)
    png = imread(path)[::-1, :, :3]  # rows from the bottom, as display coordinates
    ax = fig.axes[0]
    assert len(pixels.cell_edges) - 1 <= ax.get_window_extent().width  # never subsampled
    for cell, column in zip(attended.tolist(), columns.tolist(), strict=True):
        (x0, y), (x1, _) = ax.transData.transform(
            [(pixels.cell_edges[column] - 0.5, 0), (pixels.cell_edges[column + 1] - 0.5, 0)]
        )  # the screen pixels of the picture's pixel holding the cell
        drawn = png[int(y), int(np.floor(x0)) : int(np.ceil(x1)) + 1]
        assert drawn.max(axis=1).min() < 0.7, cell  # dark grey or black, never white
    x, y = ax.transData.transform((10000, 0))  # nothing attended there
    assert png[int(y), int(x)].min() == 1.0


@pytest.fixture(scope="module")
def large_trace():
    """300 steps of scheduler_workload's Workload on 65 536 cells."""
    config = CacheConfig(
        n_layers=1,
        n_kv_heads=1,
        head_dim=4,
        capacity=N_CELLS,
        max_width=256,
        max_seqs=128,
        max_seq_len=4096,
        initial_cells=4096,
    )
    cache = CellCache(config)
    recorder = Recorder(cache)
    workload = Workload(cache, np.random.default_rng(1), (16, 64))
    for _ in range(300):
        workload.step()
    return recorder.trace()


def test_binned_occupancy_keeps_the_true_mean(large_trace):
    trace = large_trace
    fig = plot_timeline(trace)
    pixels = fig.numbakv["pixels"]
    n_cells, n_steps = int(trace.arrays["read_len"].max()), trace.n_steps
    assert np.diff(pixels.cell_edges)[0] > 1 and pixels.cell_edges[-1] == n_cells
    used = trace.metrics()["used"][trace.step_frames]
    area = np.outer(np.diff(pixels.step_edges), np.diff(pixels.cell_edges))
    mean = (pixels.occupied * area).sum() / area.sum()
    assert mean == pytest.approx(used.sum() / (n_steps * n_cells), rel=1e-12)
    owners = owners_of(trace)
    assert n_cells >= 8192
    even = owner_pixels(trace, owners, (0, 8192), (0, 256), 1024, 64)  # bins that divide
    true = trace.timeline()[:256, :8192] != -1
    assert even.occupied.mean() == pytest.approx(true.mean(), rel=1e-12)
    np.testing.assert_allclose(even.occupied, true.reshape(4, 64, 8, 1024).mean(axis=(1, 3)))
    snap_fig = plot_cells(trace, bin=7)
    cells = snap_fig.numbakv["pixels"]
    snap = snap_fig.numbakv["snapshot"]
    n = max(snap.rows, snap.read_len)
    width = np.diff(cells.cell_edges)
    assert (cells.occupied[0] * width).sum() == np.count_nonzero(snap.codes != -1)
    assert width.sum() == n and width[0] == 7  # a block view of the big pool


def test_the_movie_is_the_timeline_in_frames(large_trace, tmp_path):
    path = tmp_path / "pool.gif"
    drawn = save_movie(large_trace, path, frames=6, bin=512)
    pixels = drawn["pixels"]
    n_steps = large_trace.n_steps
    np.testing.assert_array_equal(pixels.step_edges, [0, 50, 100, 150, 200, 250, 300])
    true = large_trace.timeline() != -1  # [steps, cells] occupied
    cells = pixels.cell_edges
    for row in range(6):
        steps = slice(row * 50, (row + 1) * 50)
        for col in range(0, len(cells) - 1, 7):
            block = true[steps, cells[col] : cells[col + 1]]
            assert pixels.occupied[row, col] == pytest.approx(block.mean(), rel=1e-12)
    assert n_steps == 300 and drawn["columns"] ** 2 >= len(cells) - 1
    with Image.open(path) as gif:
        assert gif.n_frames == 6


@pytest.fixture(scope="module")
def small_trace_path(tmp_path_factory):
    cache = CellCache(small_config(max_seqs=8, capacity=96, initial_cells=8))
    recorder = Recorder(cache)
    churn(cache, list(range(3, 800, 7)))
    assert recorder.trace().n_steps == 38
    path = tmp_path_factory.mktemp("trace") / "run.npz"
    recorder.save(path)
    return path


@pytest.mark.parametrize(
    ("kind", "out"), [("locality", "l.png"), ("movie", "m.gif"), ("timeline", "t.svg")]
)
def test_cli_new_kinds_and_zoom(small_trace_path, tmp_path, kind, out, capsys):
    out = tmp_path / out
    zoom = ["--cells", "8:", "--bin", "2", "--by", "seq"] if kind != "locality" else []
    argv = [
        "viz",
        str(small_trace_path),
        "--kind",
        kind,
        "-o",
        str(out),
        "--steps",
        "5:30",
        "--dpi",
        "60",
        *zoom,
    ]
    assert main(argv) == 0
    assert out.stat().st_size > 1000 and f"wrote {out}" in capsys.readouterr().out


def test_cli_zoom_is_the_python_zoom(small_trace_path, tmp_path):
    from numbakv import load_trace

    out = tmp_path / "cli.png"
    zoom = ["--steps", "5:30", "--cells", "8:40", "--bin", "3", "--dpi", "50"]
    assert main(["viz", str(small_trace_path), "--kind", "timeline", "-o", str(out), *zoom]) == 0
    trace = load_trace(small_trace_path)
    last = trace.n_steps - 1  # the CLI marks --step, by default the last
    fig = plot_timeline(trace, steps=(5, 30), cells=(8, 40), bin=3, dpi=50, mark_step=last)
    fig.savefig(tmp_path / "python.png", dpi=50)
    cli, python = imread(out), imread(tmp_path / "python.png")
    assert cli.shape[:2] == (300, 500)  # 10 x 6 inches at 50 dpi
    np.testing.assert_array_equal(cli, python)  # the same picture, pixel for pixel
    pixels = fig.numbakv["pixels"]
    np.testing.assert_array_equal(pixels.cell_edges, np.append(np.arange(8, 40, 3), 40))
    np.testing.assert_array_equal(pixels.step_edges[[0, -1]], [5, 30])
    unzoomed = tmp_path / "all.png"
    assert (
        main(
            ["viz", str(small_trace_path), "--kind", "timeline", "-o", str(unzoomed), "--dpi", "50"]
        )
        == 0
    )
    assert not np.array_equal(imread(unzoomed), cli)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cells", "9:3"], "argument --cells: '9:3' is empty; give A:B with A < B"),
        (["--cells", "x"], "argument --cells: 'x' is not a range"),
        (["--steps", "999:"], "argument --steps: steps 999: is empty or outside the picture's 38"),
        (["--kind", "timeline", "--cells", "500:"], "--cells: cells 500: is empty or outside"),
        (["--kind", "mask", "--cells", ":0"], "argument --cells: ':0' is empty"),
        (["--kind", "cells", "--steps", "1:3"], "--steps: it does not apply to --kind cells"),
        (["--kind", "metrics", "--bin", "3"], "--bin: it does not apply to --kind metrics"),
        (["--kind", "mask", "--by", "seq"], "--by: it does not apply to --kind mask"),
        (["--kind", "movie", "--step", "3"], "--step: it does not apply to --kind movie"),
        (["--dpi", "100000"], "--dpi: 100000 exceeds 600; give --dpi <= 600"),
        (["--bin", "0"], "argument --bin"),
        (["--kind", "movie"], "a movie is written as .gif"),
    ],
)
def test_cli_refuses_bad_zoom(small_trace_path, tmp_path, args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["viz", str(small_trace_path), "-o", str(tmp_path / "x.png"), *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_progress_is_one_line_and_quiet_work_stays_quiet():
    import io

    from numbakv.viz.progress import Progress

    stream = io.StringIO()
    quiet = Progress("drawing", stream=stream)  # shows only past a second
    quiet(5, 10)
    quiet.close()
    assert stream.getvalue() == ""
    loud = Progress("drawing timeline", after=0.0, stream=stream)
    loud.shown -= 1  # as if the last line were a second old
    loud(3, 10)
    loud(4, 10)  # too soon after the last: not written
    loud(10, 10)  # the end always is
    loud.close()
    assert stream.getvalue() == "\rdrawing timeline: 3/10 steps\rdrawing timeline: 10/10 steps\n"


def drawn_images(fig) -> list:
    """(data rows, data cols, screen rows, screen cols) of every image of `fig`, saved."""
    import io

    fig.savefig(io.BytesIO(), format="png")  # lays the figure out at its own dpi
    out = []
    for ax in fig.get_axes():
        for image in ax.images:
            box = image.get_window_extent().intersection(image.get_window_extent(), ax.bbox)
            rows, cols = image.get_array().shape[:2]
            out.append((rows, cols, box.height, box.width))
    return out


@pytest.fixture(scope="module")
def many_steps():
    """2 000 one-token steps: more steps than any picture has pixels."""
    cache = CellCache(small_config(max_seqs=4, capacity=64, initial_cells=64, max_width=4))
    recorder = Recorder(cache)
    seqs = [cache.seq_new() for _ in range(3)]
    for i in range(2000):
        seq = seqs[i % 3]
        if cache.pos(seq) == 20:
            cache.rewind(seq, 0)
        step_with(cache, [seq])
    return recorder.trace()


@pytest.mark.parametrize("which", ["large_trace", "many_steps"])
@pytest.mark.parametrize(
    "draw",
    [
        lambda t: plot_timeline(t),
        lambda t: plot_timeline(t, dpi=40),
        lambda t: plot_timeline(t, fig=Figure(figsize=(4, 3), layout="constrained")),
        lambda t: plot_cells(t, dpi=40),
        lambda t: plot_cells(t, fig=Figure(figsize=(6, 20), dpi=40, layout="constrained")),
        lambda t: plot_mask(t.step(t.step_frames[-1]), 0, dpi=50),
        lambda t: plot_locality(t, dpi=30),
        lambda t: plot_locality(t, fig=Figure(figsize=(6, 3), layout="constrained")),
        lambda t: plot_all(t, dpi=25),
    ],
)
def test_no_picture_has_more_pixels_than_the_screen(request, which, draw):
    images = drawn_images(draw(request.getfixturevalue(which)))
    assert images
    for rows, cols, screen_rows, screen_cols in images:
        assert rows <= screen_rows + 1 and cols <= screen_cols + 1, (
            rows,
            cols,
            screen_rows,
            screen_cols,
        )
