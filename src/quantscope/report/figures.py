"""Matplotlib, headless, and a figure as a self-contained ``data:`` URI (one place for both,
so the report's builders and its plots import downward from here, not from each other)."""

from __future__ import annotations

import base64
import functools
import io
import warnings
from collections.abc import Callable
from typing import Any

from quantscope.kept import Kept


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display), imported on first use. Text is
    never read as mathtext: a label is a model's name (``a$x^{$b`` would otherwise be parsed
    as TeX and fail to draw), and no figure of the report uses ``$...$``."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def log_scale(ax: Any, axis: str = "y") -> None:
    """``ax``'s ``axis`` ('x' or 'y') on a log scale, its ticks labelled in plain text
    ('10', '2'). Matplotlib's default log labels are mathtext (``$\\mathdefault{10^{2}}$``),
    which :func:`pyplot` turns off: they were drawn as that raw text."""
    from matplotlib.ticker import LogFormatter

    getattr(ax, f"set_{axis}scale")("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(LogFormatter(labelOnlyBase=False))
    target.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


FIGURE_DPI = 110


def png_uri(fig: Any) -> str:
    """``fig`` as a PNG ``data:`` URI (:data:`FIGURE_DPI`, tight box); the figure is closed.

    Drawn once: ``savefig(bbox_inches="tight")`` draws a figure twice (a layout pass to
    measure its text, then the render shifted into the box); the render's glyphs and ticks
    are most of a figure's cost, so one draw is 0.37 -> 0.29 s a figure, not half
    (docs/benchmarks.md, stop 72). Here the canvas is first widened by :data:`MARGIN_INCHES` on each
    side, the axes kept where they were in inches (the labels that overflow the figure, as
    a long name left of its bar or an axis label under a short figure, land in the margin),
    rendered once, and the tight box (padded as savefig pads it) cut out of the pixels. A
    figure with figure-level legends or texts (placed by the figure's size), or a box that
    still leaves the widened canvas, is saved by savefig's way."""
    from PIL import Image

    buf = io.BytesIO()
    with warnings.catch_warnings():  # a name's character no font has draws as a box: the
        warnings.filterwarnings("ignore", "Glyph .* missing from font")  # tables name it
        pixels = None if fig.legends or fig.texts else _tight_pixels(fig)
        if pixels is None:
            fig.savefig(buf, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
        else:
            Image.fromarray(pixels).save(buf, format="png")
    pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


MARGIN_INCHES = 4.0  # the canvas widened by this on each side for the overflowing labels


def _tight_pixels(fig: Any) -> Any:
    """``fig`` drawn once at :data:`FIGURE_DPI` on a canvas :data:`MARGIN_INCHES` wider on
    each side, cut to its padded tight box (an RGBA array); None, ``fig`` as it was, where
    the box leaves even that canvas."""
    import matplotlib
    import numpy as np

    width, height = fig.get_size_inches()
    m = MARGIN_INCHES
    places = [(ax, ax.get_position()) for ax in fig.axes]
    fig.set_dpi(FIGURE_DPI)
    fig.set_size_inches(width + 2 * m, height + 2 * m)
    for ax, p in places:
        ax.set_position([(p.x0 * width + m) / (width + 2 * m),
                         (p.y0 * height + m) / (height + 2 * m),
                         p.width * width / (width + 2 * m), p.height * height / (height + 2 * m)])
    fig.canvas.draw()
    pad = float(matplotlib.rcParams["savefig.pad_inches"])
    box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad)
    rgba = np.asarray(fig.canvas.buffer_rgba())
    rows, cols = rgba.shape[:2]
    x0, x1 = box.x0 * FIGURE_DPI, box.x1 * FIGURE_DPI
    top, bottom = rows - box.y1 * FIGURE_DPI, rows - box.y0 * FIGURE_DPI
    if x0 < 0 or top < 0 or x1 > cols or bottom > rows:
        fig.set_size_inches(width, height)
        for ax, p in places:
            ax.set_position(p)
        return None
    return np.ascontiguousarray(rgba[int(round(top)):int(round(bottom)),
                                     int(round(x0)):int(round(x1))])


KEPT_FIGURES = 64  # figures a process keeps by their data (~20-40 kB each)
_DRAWN: Kept[str, str] = Kept(KEPT_FIGURES)


def remembered(plot: Callable[..., str]) -> Callable[..., str]:
    """``plot`` (a figure's data in, its ``<img>`` with a ``data:`` URI out) remembered
    by the content of its arguments, the last :data:`KEPT_FIGURES`: the same data draws
    the same PNG. A figure costs ~150 ms (most of it matplotlib's text layout, twice for
    the tight box), most of a tiny model's run. A process that writes several reports
    (the test suite, a notebook calling ``run`` again with another goal) redraws only
    what changed: the figures of the statistics and the analysis stay (three test files
    drew 197 figures of 97 distinct ones, their reports 34 s -> 20 s). A process writing
    one report draws each figure once, as before."""
    from quantscope.analyze.evalcache import content_digest

    @functools.wraps(plot)
    def drawn(*args: Any, **kwargs: Any) -> str:
        key = content_digest([plot.__module__, plot.__qualname__, list(args), kwargs])
        got = _DRAWN.get(key)
        return got if got is not None else _DRAWN.put(key, plot(*args, **kwargs))

    return drawn
