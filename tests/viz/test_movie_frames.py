"""The movie's frames are drawn whole only once: each other frame is the rectangle of its
picture and title drawn over the first, with the artists that keep away from that
rectangle hidden. The GIF is the one matplotlib's FuncAnimation and Pillow writer make of
the same figure, frame for frame and pixel for pixel, at any resolution and under savefig's
own settings."""

import matplotlib
import numpy as np
import pytest
from matplotlib.animation import FuncAnimation, PillowWriter
from PIL import Image, ImageSequence

from numbakv import Recorder
from numbakv.reference import CellCache
from numbakv.viz import movie, save_movie

from helpers import churn, small_config


@pytest.fixture(scope="module")
def trace():
    cache = CellCache(small_config(max_seqs=8, capacity=96, initial_cells=8))
    recorder = Recorder(cache)
    churn(cache, list(range(3, 800, 7)))
    return recorder.trace()


def frames_of(path) -> list[np.ndarray]:
    with Image.open(path) as gif:
        return [np.asarray(frame.convert("RGBA")) for frame in ImageSequence.Iterator(gif)]


@pytest.mark.parametrize(
    ("dpi", "options", "rc"),
    [(80, {}, {}), (10, {"frames": 3}, {}), (33, {"frames": 7, "bin": 2}, {}),
     (150, {"cells": (5, 60)}, {}), (80, {"steps": (4, 20), "by": "seq", "fps": 3}, {}),
     (40, {"frames": 4}, {"savefig.facecolor": "#FFEEDD", "savefig.edgecolor": "red"}),
     (40, {"frames": 4}, {"savefig.transparent": True, "savefig.bbox": "tight"})],
)  # fmt: skip
def test_the_frames_are_funcanimations(trace, tmp_path, monkeypatch, dpi, options, rc):
    drawn = movie._frames

    def animate_then_draw(fig, ax, show, titles):
        """The movie as FuncAnimation saves it, from the same figure, then the frames."""
        animation = FuncAnimation(fig, show, frames=len(titles))
        animation.save(tmp_path / "want.gif", writer=PillowWriter(fps=options.get("fps", 8)))
        return drawn(fig, ax, show, titles)

    monkeypatch.setattr(movie, "_frames", animate_then_draw)
    with matplotlib.rc_context(rc):  # savefig's own colours, as the Pillow writer takes them
        save_movie(trace, tmp_path / "got.gif", dpi=dpi, **options)
    got, want = frames_of(tmp_path / "got.gif"), frames_of(tmp_path / "want.gif")
    assert len(got) == len(want) > 1
    for frame, expect in zip(got, want, strict=True):
        np.testing.assert_array_equal(frame, expect)
