"""Matplotlib, headless, and a figure as a self-contained ``data:`` URI (one place for both,
so the report's builders and its plots import downward from here, not from each other)."""

from __future__ import annotations

import base64
import io
import warnings
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
