"""Plans: legality preflight (:mod:`.check`), cost (:mod:`.cost`) and search (:mod:`.search`)."""

from quantscope.plan.check import CHECKS, check, resolve_shapes, seq_len_shapes
from quantscope.plan.cost import cost_breakdown, plan_cost

__all__ = ["CHECKS", "check", "cost_breakdown", "plan_cost", "resolve_shapes", "seq_len_shapes"]
