"""``--allow-warning RULE``: the warning rules of a target a user accepts.

A target's ``[[rules]]`` have severity ``error`` (the compiler refuses) or ``warning``
(it may refuse: an estimate, an unconfirmed report). The planner treats a warning that
applies as blocking (:class:`quantscope.plan.start.Legality`); a user who knows their
compiler takes it names the rule here, and the planner lets it through. Only warning
rules of the target can be accepted: an error rule, or an id the target does not name,
is refused in one line naming the target's warning rules.

The rewrites' and repairs' preconditions ("does the rule this rewrite answers bind?")
read the same legality as the planner (:func:`quantscope.plan.start.blocks`): an error
rule binds, and so does a warning rule that applies and is not accepted. They read the
accepted set from the target they are given: :func:`for_run` is the run's view of it
(a target loaded by name accepts none: its warnings bind, as the planner's do without
``--allow-warning``). :func:`binding_words` says which in the reasons.
"""

from __future__ import annotations

import dataclasses
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


def for_run(target: Target, allowed: Iterable[str]) -> Target:
    """``target`` as a run's preconditions read it: the same profile, with the warning
    rules ``allowed`` (:func:`allowed_warnings`' answer) accepted (:attr:`Target.accepted`)."""
    return dataclasses.replace(target, accepted=frozenset(allowed))


def binding_words(rule: str, severity: str) -> str:
    """How a reason names a rule that binds: the id, and for a warning that it binds
    because the planner blocks it, with the flag that accepts it."""
    if severity == "error":
        return rule
    return f"{rule} (warning, blocked by the planner: accept with {FLAG} {rule})"


def accepted_words(rules: Iterable[str]) -> str:
    """How a reason names rules that bind nothing because the run accepts them."""
    return f"{', '.join(sorted(rules))} accepted ({FLAG})"


__all__ = ["ALL", "FLAG", "accepted_words", "allowed_warnings", "binding_words", "for_run",
           "warning_rules"]
