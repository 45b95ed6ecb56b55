"""What ``--allow-warning`` let through, as a plan records it.

The legality screen (:class:`quantscope.plan.start.Legality`) finds, on a plan, the groups
whose warning of an accepted rule applies (:meth:`~quantscope.plan.start.Legality.accepted`);
this module turns that into the record every output repeats: the plan's
``meta['accepted_warnings']`` (JSON: one entry per accepted rule with its readable reason
from the target's TOML and the groups it lets through, none included), which ``plan.json``,
``run``'s ``verdict.json`` and report, the console and the exported ``.alls`` read back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from quantscope.targets.accept import FLAG
from quantscope.targets.profile import Target
from quantscope.types import Plan

META = "accepted_warnings"


def accepted_record(target: Target, accepted: Mapping[str, Sequence[str]],
                    phases: Mapping[str, Mapping[str, Sequence[str]]] | None = None
                    ) -> list[dict[str, Any]]:
    """One entry per accepted rule: its id, its reason (the target's TOML), how many groups
    of the plan it lets through and which; ``phases`` (a decoder's: phase -> rule ->
    groups): each entry's groups per phase too, which :func:`for_phase` reads."""
    reasons = {r.id: r.reason for r in target.rules}
    return [{"rule": rule, "reason": reasons.get(rule, ""), "groups": len(groups),
             "group_names": list(groups),
             **({"phases": {ph: list(by.get(rule, ())) for ph, by in phases.items()}}
                if phases is not None else {})}
            for rule, groups in sorted(accepted.items())]


def for_phase(plan: Plan, phase: str) -> Plan:
    """``plan`` with its record narrowed to what the warnings let through in ``phase``
    (a decoder's phase compiler script says its own graph's groups, not both phases');
    unchanged when the record has no groups per phase (an encoder's, or older)."""
    record = accepted_of(plan)
    if not record or not all("phases" in r and phase in r["phases"] for r in record):
        return plan
    narrowed = [{**{k: v for k, v in r.items() if k != "phases"},
                 "groups": len(r["phases"][phase]), "group_names": list(r["phases"][phase])}
                for r in record]
    return with_accepted(plan, narrowed)


def with_accepted(plan: Plan, record: Sequence[dict[str, Any]]) -> Plan:
    """``plan`` with ``record`` in its meta (replacing an earlier one; none: unchanged)."""
    if not record:
        return plan
    meta = tuple((k, v) for k, v in plan.meta if k != META)
    return replace(plan, meta=(*meta, (META, json.dumps(list(record)))))


def accepted_of(plan: Plan) -> list[dict[str, Any]]:
    """The record a plan carries (empty: no warning was accepted)."""
    text = dict(plan.meta).get(META)
    return list(json.loads(text)) if text else []


def accepted_lines(record: Sequence[dict[str, Any]]) -> list[str]:
    """The record in words, one line per accepted rule."""
    return [f"accepted by {FLAG}: {r['rule']} lets {r['groups']} group(s) through "
            f"({r['reason']})" for r in record]


def phase_plan(plan: Plan, phase: str) -> Plan:
    """The plan a decoder's ``phase`` graph runs (:meth:`Plan.for_phase`) with its accepted
    record narrowed to that phase (:func:`for_phase`): what that phase's files carry."""
    return for_phase(plan.for_phase(phase), phase)


__all__ = ["META", "accepted_lines", "accepted_of", "accepted_record", "for_phase",
           "phase_plan", "with_accepted"]
