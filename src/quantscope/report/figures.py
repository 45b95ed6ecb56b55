"""Matplotlib, headless, and a figure as a self-contained ``data:`` URI (one place for both,
so the report's builders and its plots import downward from here, not from each other)."""

from __future__ import annotations

import base64
import functools
import io
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


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


def png_uri(fig: Any) -> str:
    """``fig`` as a PNG ``data:`` URI (110 dpi, tight box); the figure is closed."""
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a name's character no font has draws as a box: the
        warnings.filterwarnings("ignore", "Glyph .* missing from font")  # tables name it
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


KEPT_FIGURES = 64  # figures a process keeps by their data (~20-40 kB each)
_DRAWN: OrderedDict[str, str] = OrderedDict()


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
        if key in _DRAWN:
            _DRAWN.move_to_end(key)
            return _DRAWN[key]
        uri = plot(*args, **kwargs)
        _DRAWN[key] = uri
        while len(_DRAWN) > KEPT_FIGURES:
            _DRAWN.popitem(last=False)
        return uri

    return drawn
