"""A report figure is drawn once (quantscope.report.figures.png_uri): the same tight box
as savefig's, which draws it twice, and savefig's way where one draw cannot give it."""

import base64
import io

import numpy as np
from matplotlib.figure import Figure
from PIL import Image

from quantscope.report import figures


def _decoded(uri: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))))


def _figure(figure_legend: bool = False):
    plt = figures.pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.2))  # a short figure: the x label falls below it
    names = [f"/model/encoder/layer.{i}/attention/output/dense/MatMul" for i in range(4)]
    ax.barh(range(4), [3, 1, 4, 1], label="bars")
    ax.set_yticks(range(4), names)  # long names: left of the figure's edge
    ax.set_xlabel("sqnr_db")
    (fig.legend if figure_legend else ax.legend)(loc="upper left")
    return fig


def _savefig_tight(fig) -> np.ndarray:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=figures.FIGURE_DPI, bbox_inches="tight")
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())))


def test_one_draw_gives_savefigs_tight_box(monkeypatch):
    want = _savefig_tight(_figure())
    draws = []
    real = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, r: (draws.append(1), real(self, r))[1])
    got = _decoded(figures.png_uri(_figure()))
    assert len(draws) == 1
    assert abs(got.shape[0] - want.shape[0]) <= 1 and abs(got.shape[1] - want.shape[1]) <= 1
    assert want.shape[1] > 6 * figures.FIGURE_DPI  # the names widened savefig's box too
    h, w = min(got.shape[0], want.shape[0]), min(got.shape[1], want.shape[1])
    dark = (got[:h, :w, :3].mean(axis=2) < 128).mean(), (want[:h, :w, :3].mean(axis=2) < 128).mean()
    assert abs(dark[0] - dark[1]) < 0.002  # the same ink: bars, names, ticks, labels


def test_a_figure_legend_is_saved_by_savefigs_way(monkeypatch):
    draws = []
    real = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, r: (draws.append(1), real(self, r))[1])
    got = _decoded(figures.png_uri(_figure(figure_legend=True)))
    assert len(draws) == 2 and got.shape[0] > 2.2 * figures.FIGURE_DPI
