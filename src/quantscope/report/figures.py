"""Matplotlib, headless, and a figure as a self-contained ``data:`` URI (one place for both,
so the report's builders and its plots import downward from here, not from each other)."""

from __future__ import annotations

import base64
import io
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_uri(fig: Any) -> str:
    """``fig`` as a PNG ``data:`` URI (110 dpi, tight box); the figure is closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
