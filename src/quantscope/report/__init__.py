"""Self-contained HTML report: aggregation of the stages' files + rendering."""

from __future__ import annotations

from typing import Any

from quantscope.report.build import (
    analysis_section,
    choice_section,
    demo_section,
    io_section,
    plan_section,
    prenorm_section,
    render,
    route_section,
)
from quantscope.report.run import run_report_html


def report_html(
    title: str,
    *,
    results: dict[str, dict[str, Any]] | None = None,
    plan: dict[str, Any] | None = None,
    analysis: dict[str, Any] | None = None,
    io_rows: list[dict[str, Any]] | None = None,
    problems: list[dict[str, Any]] | None = None,
) -> str:
    """The report as one HTML string; each section appears when its input is given."""
    sections = []
    if results:
        measured = {k: r for k, r in results.items() if isinstance(r.get("metrics"), dict)}
        if measured:  # a buckets choice has no task metrics (route measures it)
            sections.append(demo_section(measured))
            sections.append(prenorm_section(measured))
        sections.extend(route_section(label, r) for label, r in results.items()
                        if isinstance(r.get("buckets"), list) and "longest_alone" in r)
        sections.extend(choice_section(label, r) for label, r in results.items()
                        if isinstance(r.get("buckets"), list) and "candidates" in r)
    if analysis:
        sections.append(analysis_section(analysis))
    if plan:
        sections.append(plan_section(plan, problems))
    if io_rows:
        sections.append(io_section(io_rows))
    return render(title, [s for s in sections if s])


__all__ = ["report_html", "run_report_html"]
