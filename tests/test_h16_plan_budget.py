"""The plan console writes its budget in words (a share's goal in percent), not the raw
dict ``{'min_quality': 0.97, 'max_cost': 1.5}``."""

from __future__ import annotations

from quantscope.report import fmt
from quantscope.report.console import format_search


def test_plan_console_writes_the_budget_readably() -> None:
    result = {"metric": "top1_agreement", "higher_is_better": True,
              "budget": {"min_quality": 0.97, "max_cost": 1.5}, "met": True,
              "chosen": {"cost": 1.2, "predicted": 0.975, "measured": 0.98}, "points": []}
    line = format_search(result).splitlines()[0]
    assert "budget goal top-1 agreement >= 97.0 %, cost <= 1.5x;" in line, line
    assert "{" not in line
    none = format_search({**result, "budget": {"min_quality": None, "max_cost": None}})
    assert "budget none (best quality);" in none
    db = fmt.budget("sqnr_db", {"min_quality": 20.0, "max_cost": None})
    assert db == "goal output SQNR >= 20.0 dB"
