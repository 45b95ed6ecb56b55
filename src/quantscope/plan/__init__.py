"""Plans: legality (:mod:`.check`), cost (:mod:`.cost`) and the search pipeline (:mod:`.search`)."""

from quantscope.plan.check import CHECKS, check
from quantscope.plan.cost import cost_breakdown, plan_cost
from quantscope.plan.search import SearchResult, plan_from_analysis, search

__all__ = ["CHECKS", "SearchResult", "check", "cost_breakdown", "plan_cost",
           "plan_from_analysis", "search"]
