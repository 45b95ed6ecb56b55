"""A figure is drawn once per content of its data (quantscope.report.figures.remembered)."""

import numpy as np

from quantscope.kept import Kept
from quantscope.report import figures, plots


def test_the_same_data_draws_once_and_other_data_again(monkeypatch):
    drawn = []
    real = figures.pyplot

    def counted():
        drawn.append(1)
        return real()

    monkeypatch.setattr(plots, "_plt", counted)
    monkeypatch.setattr(figures, "_DRAWN", Kept(3))
    a = np.abs(np.random.default_rng(0).normal(size=64)).astype(np.float32)
    first = plots.outlier_plot("t", a, [3])
    assert "data:image/png;base64," in first and len(drawn) == 1
    assert plots.outlier_plot("t", a.copy(), [3]) == first and len(drawn) == 1  # same content
    b = a.copy()
    b[5] = 9.0
    assert plots.outlier_plot("t", b, [3]) != first and len(drawn) == 2
    assert plots.outlier_plot("u", a, [3]) != first and len(drawn) == 3  # another title
    assert plots.length_plot([3, 4, 4], "t") != first and len(drawn) == 4  # another figure
    for n in range(figures._DRAWN.most):
        plots.length_plot([n + 1], "t")
    plots.outlier_plot("t", a, [3])  # pushed out by the later ones: drawn again
    assert len(drawn) == 4 + figures._DRAWN.most + 1
