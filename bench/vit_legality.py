"""Legality and cost of uniform plans on dinov2-s14 (and its rank-4 rewrite) per target.

Usage: ``python bench/vit_legality.py [REWRITTEN.onnx]`` -- prints a markdown table: for
each target (qnn-htp-v73, hailo10h) and plan (uniform a8_w8, a16_w8, a16_w16), on the
original graph and, if given, on the graph rewritten by ``quantscope repair --repairs
rank4``: errors and warnings per rule (``quantscope check``) and the cost relative to
uniform a8_w8 (``plan_cost``). No ONNX Runtime run: quality is measured by ``evaluate``.
"""

from __future__ import annotations

import sys
from collections import Counter

from quantscope.model.groups import find_groups
from quantscope.model.load import load
from quantscope.plan.check import check
from quantscope.plan.cost import plan_cost
from quantscope.targets import load_target
from quantscope.types import Plan, Precision
from quantscope.zoo import resolve_model

TARGETS = ("qnn-htp-v73", "hailo10h")
PRECISIONS = (Precision.A8_W8, Precision.A16_W8, Precision.A16_W16)


def _row(name: str, label: str, what: str, plan: Plan, model, groups, target) -> str:
    probs = check(plan, groups, model, target)
    by_rule = Counter((x.rule, x.severity) for x in probs)
    text = ", ".join(f"{r} ({n} {s}{'s' if n > 1 else ''})"
                     for (r, s), n in sorted(by_rule.items())) or "legal"
    cost = plan_cost(plan, groups, target, model=model)
    return f"| {name} | {label} | {what} | {cost:.2f} | {text} |"


def rows(label: str, path: str) -> list[str]:
    model = load(path)
    groups = find_groups(model)
    out = []
    for name in TARGETS:
        target = load_target(name)
        for p in PRECISIONS:
            plan = Plan(default=p, target=target.name)
            out.append(_row(name, label, f"uniform {p}", plan, model, groups, target))
        if name == "qnn-htp-v73" and label == "original":  # the report's exclusion attempt
            clip = {x.group for x in check(Plan(default=Precision.A16_W8), groups, model, target)
                    if x.rule == "qnn.linearclip_5d"}
            plan = Plan(default=Precision.A16_W8, target=target.name,
                        overrides=tuple((g, Precision.FLOAT) for g in sorted(clip)))
            out.append(_row(name, label, f"a16_w8, the {len(clip)} flagged Linears FP16",
                            plan, model, groups, target))
    return out


def main() -> None:
    print("| target | graph | plan | cost (a8_w8 = 1) | check: rule (count) |")
    print("|---|---|---|---|---|")
    lines = rows("original", str(resolve_model("dinov2-s14")))
    if len(sys.argv) > 1:
        lines += rows("rank4 rewrite", sys.argv[1])
    print("\n".join(sorted(lines, key=lambda s: s.split("|")[1])))


if __name__ == "__main__":
    main()
