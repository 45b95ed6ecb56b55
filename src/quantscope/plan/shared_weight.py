"""A weight shared by groups the plan puts at different weight precisions.

One initializer read by two weighted layers (a weight-tied MatMul pair, a Conv applied
twice) is one tensor: the QDQ model quantizes it once (``emulate/encode.py``: the last
group's bits), and QNN's encodings file holds one encoding per tensor name. A plan that
gives the sharing groups different weight bits (or leaves one of them float) therefore
describes a model neither the emulation nor the export can carry: every number measured
would be that of another plan. ``check`` refuses it (rule :data:`RULE`, an error).

The planner moves such groups together (:func:`sharers`; ``plan/start.py``'s
``joint_move``): a tokensplit encoder's chunks all read one weight per Linear, and a
promotion of one chunk's weight alone could never be legal.
"""

from __future__ import annotations

from quantscope.types import Groups, Plan, Problem

RULE = "plan.shared_weight"


def sharers(groups: Groups) -> dict[str, tuple[str, ...]]:
    """For each group whose weight other groups also read: those other groups, in order."""
    by_weight: dict[str, list[str]] = {}
    for g in groups.groups:
        if g.weight is not None:
            by_weight.setdefault(g.weight, []).append(g.name)
    return {n: tuple(m for m in names if m != n)
            for names in by_weight.values() if len(names) > 1 for n in names}


def shared_weight_problems(plan: Plan, groups: Groups) -> list[Problem]:
    """One error per group of a weight its sharing groups hold at different precisions."""
    by_weight: dict[str, list[str]] = {}
    for g in groups.groups:
        if g.weight is not None:
            by_weight.setdefault(g.weight, []).append(g.name)
    out = []
    for weight, names in by_weight.items():
        bits = {n: plan.precision_of(n).weight_bits for n in names}
        if len(names) < 2 or len(set(bits.values())) < 2:
            continue
        held = ", ".join(f"{n} {'float' if b is None else f'w{b}'}" for n, b in bits.items())
        for name in names:
            out.append(Problem(
                group=name, rule=RULE,
                reason=f"weight '{weight}' is shared by {len(names)} groups that the plan "
                f"holds at different weight precisions ({held}): one tensor has one "
                "encoding, so the QDQ model and the QNN encodings could carry only one of them",
                provenance="quantscope grouping of this model (a weight read by several nodes)",
                fix=f"give {', '.join(names)} the same weight precision"))
    return out


__all__ = ["RULE", "shared_weight_problems", "sharers"]
