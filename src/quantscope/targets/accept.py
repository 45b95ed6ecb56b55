"""``--allow-warning RULE``: the warning rules of a target a user accepts.

A target's ``[[rules]]`` have severity ``error`` (the compiler refuses) or ``warning``
(it may refuse: an estimate, an unconfirmed report). The planner treats a warning that
applies as blocking (:class:`quantscope.plan.start.Legality`); a user who knows their
compiler takes it names the rule here, and the planner lets it through. Only warning
rules of the target can be accepted: an error rule, or an id the target does not name,
is refused in one line naming the target's warning rules.
"""

from __future__ import annotations

from collections.abc import Iterable

from quantscope.targets.profile import Rule, Target
from quantscope.types import QuantscopeError

ALL = "all"  # every warning rule of the target
FLAG = "--allow-warning"


def warning_rules(target: Target) -> tuple[Rule, ...]:
    """The target's rules of severity ``warning``, in profile order."""
    return tuple(r for r in target.rules if r.severity == "warning")


def allowed_warnings(target: Target, asked: Iterable[str]) -> frozenset[str]:
    """The rule ids ``asked`` names (``all``: every warning rule of ``target``), each a
    warning rule of ``target``; refused in one line otherwise."""
    asked = list(dict.fromkeys(a.strip() for a in asked))
    if not asked:
        return frozenset()
    warnings = warning_rules(target)
    ids = [r.id for r in warnings]
    listed = ", ".join(ids) if ids else "none"
    where = f"{target.name}'s warning rules: {listed}"
    if not ids:
        raise QuantscopeError(f"{FLAG} {asked[0]}: {target.name} has no warning rule to "
                              f"accept (every rule is an error): leave {FLAG} out")
    out: set[str] = set()
    errors = {r.id for r in target.rules if r.severity == "error"}
    for a in asked:
        if a == ALL:
            out.update(ids)
        elif a in errors:
            raise QuantscopeError(f"{FLAG} {a}: {a} is an error rule of {target.name} (the "
                                  f"compiler refuses it), not a warning; {where}")
        elif a not in ids:
            raise QuantscopeError(f"{FLAG} {a}: {target.name} has no rule '{a}'; {where} "
                                  f"(or '{ALL}')")
        else:
            out.add(a)
    return frozenset(out)


__all__ = ["ALL", "FLAG", "allowed_warnings", "warning_rules"]
