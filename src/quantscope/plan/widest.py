"""A structural candidate: every group at the widest precision it may legally take.

The greedy path stops when no single promotion is predicted to gain. On a small dense
model whose sensitivities were measured on one proxy row, a layer's own gain can read as
noise (a U-Net's last Conv: -0.09 dB promoted alone, while every other layer is at 8 bit),
so the "best quality" plan kept its 8-bit output: 31.2 dB held out at 6.9x, where every
layer at a16_w16 measures about 70 dB. :func:`widest_point` is measured beside the path
when no cost cap is given (under a cap this fill in group order is a poor guess that
takes a measurement from the drops), and the measurement decides
(the drop step then reverts what it can).
"""

from __future__ import annotations

from collections.abc import Iterable

from quantscope.plan.pareto import FrontPoint
from quantscope.plan.predict import predict
from quantscope.plan.start import Space


def widest_point(space: Space, repairs: tuple[str, ...]) -> FrontPoint | None:
    """Every group, in group order, at the widest candidate precision the analysis measured
    for it that it may legally take while the plan stays within the cost cap; None if that
    is the start plan."""
    return widest_fill(space, space.names, repairs, "widest", measured_only=True)


def widest_fill(space: Space, names: Iterable[str], repairs: tuple[str, ...], origin: str, *,
                measured_only: bool = False) -> FrontPoint | None:
    """``names``, in that order, each at the widest candidate precision it may legally take
    while the plan stays within the cost cap (``measured_only``: only precisions the
    analysis measured for it, as the path's moves: the target's promotion precision, e.g.
    a16_w8 on HTP, not any wider); then the groups a rule judges with their neighbours
    reverted. None if that is the start plan or still not legal. The one fill of the
    structural candidates (``widest``; ``refine.residual_point``'s stream)."""
    prec = dict(space.start)
    order = sorted(space.candidates, key=lambda p: (-(p.act_bits or 0), -(p.weight_bits or 0)))
    for name in names:
        for precision in order:
            if precision == prec[name] or (
                    measured_only and space.sens.gain(name, precision) is None) \
                    or space.legal.screen(space.plan(prec), name, precision):
                continue
            trial = {**prec, name: precision}
            if space.budget.within_cost(predict(space, trial, repairs, origin, 0).cost):
                prec = trial
                break
    for _ in range(2):  # rules that judge a group with its neighbours
        wrong = {p.group for p in space.legal.blocking(space.plan(prec))}
        prec = {n: (space.start[n] if n in wrong else p) for n, p in prec.items()}
    if prec == dict(space.start) or space.legal.blocking(space.plan(prec)):
        return None
    return predict(space, prec, repairs, origin, 0)
