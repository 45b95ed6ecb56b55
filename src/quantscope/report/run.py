"""The report of ``quantscope run`` (stub, replaced below)."""
from __future__ import annotations

import html
from typing import Any

from quantscope.report.build import render


def run_report_html(title: str, *, verdict_text: str, **docs: Any) -> str:
    return render(title, [f"<pre>{html.escape(verdict_text)}</pre>"])
