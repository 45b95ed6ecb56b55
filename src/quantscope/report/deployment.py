"""Console forms of a deployment of several compiled lengths: a routed deployment measured
(``quantscope route``) and a chosen one (``quantscope buckets``)."""

from __future__ import annotations

from collections.abc import Mapping

from quantscope.plan.deployment_results import DeploymentChoice, RouteResult, RouteVerdict
from quantscope.report import fmt

HEADLINE = ("top1_agreement", "recall@1", "recall@1_fp32", "embedding_cosine_mean",
            "score_agreement", "spearman", "spearman_fp32")
"""The metrics a route line shows (those the task has)."""


def _metric_line(m: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {fmt.value(k, m[k])}" for k in HEADLINE if k in m)  # shares in %


def _verdict_line(result: RouteResult, v: RouteVerdict) -> str:
    parts = [("legal" if v.legal else "NOT legal")]
    if v.max_cost is not None:
        parts.append(f"mean cost {result.cost_mean:.3f}x "
                     f"{'within' if v.within_cost else 'OVER'} {v.max_cost}x")
    if v.goal is not None and v.value is not None:
        parts.append(f"{v.metric} {fmt.value(v.metric, v.value)} "
                     + ("reaches" if v.goal_met
                        else f"short of (by {fmt.gain(v.metric, v.short_by).lstrip('+')})")
                     + f" the goal {fmt.value(v.metric, v.goal)}")
    return f"verdict: {'MET' if v.met else 'NOT MET'}: {'; '.join(parts)}"


def _label(problem: dict) -> str:
    """A bucket's problem that is no error: a warning, or a note (``info``: never a failure,
    as ``check`` counts it: the host's lookup)."""
    return "note" if problem.get("severity") == "info" else "warning"


def format_deployment(result: RouteResult) -> str:
    """The routed deployment in a few lines."""
    lines = [f"deployment on {result.target}: {len(result.buckets)} compiled lengths "
             f"({', '.join(str(n) for n in result.seq_lens)}), each text on the shortest "
             "that holds it"]
    for p in result.buckets:
        c = p.cost
        legal = "legal" if c.legal else (
            f"NOT legal ({len(c.problems)} problems, e.g. {c.problems[0]['rule']} on "
            f"{c.problems[0]['group']})")
        for label in ("warning", "note"):  # each one's text once, under the buckets (below)
            said = [w for w in c.warnings if _label(w) == label]
            if said:
                legal += (f" ({len(said)} {label}{'s' if len(said) > 1 else ''}: "
                          f"{', '.join(dict.fromkeys(w['rule'] for w in said))}, below)")
        lines.append(f"  seq {c.seq_len:>5}: {p.share:6.1%} of the texts, cost "
                     f"{c.cost_own:.3f}x its own a8_w8 = {c.cost:.3f}x the reference's "
                     f"a8_w8 at {result.seq_lens[-1]}; {legal}; {p.model}")
    warned: dict[tuple[str, str, str], list[str]] = {}  # a rule's problem, its buckets
    for p in result.buckets:
        for w in p.cost.warnings:
            warned.setdefault((_label(w), w["rule"], w["reason"]), []).append(
                str(p.cost.seq_len))
    lines.extend(f"  {label} (seq {', '.join(where)}): {rule}: {reason}"
                 for (label, rule, reason), where in warned.items())
    lines.append(f"routed: mean cost {result.cost_mean:.3f}x (the most costly bucket "
                 f"{result.cost_max:.3f}x); {_metric_line(result.metrics)}")
    alone = result.longest_alone
    lines.append(f"for comparison, seq {alone.seq_len} alone on every text: cost "
                 f"{alone.cost:.3f}x; {_metric_line(alone.metrics)}")
    if result.verdict is not None:
        lines.append(_verdict_line(result, result.verdict))
    if not result.legal:
        lines.append("NOT legal: at least one bucket's plan breaks a target rule (see above; "
                     "'quantscope check --seq-len N' on that plan lists them)")
    lines.extend(f"note: {n}" for n in result.notes)
    by_note: dict[str, list[str]] = {}  # the QDQ writer's notes (coverage: ops left float …)
    for p in result.buckets:
        for n in p.notes:
            by_note.setdefault(n, []).append(str(p.seq_len))
    lines.extend(f"note (bucket {', '.join(where)}): {n}" for n, where in by_note.items())
    return "\n".join(lines)


def format_choice(choice: DeploymentChoice) -> str:
    """The chosen deployment in a few lines."""
    lines = [f"chosen on {choice.target}: {len(choice.buckets)} compiled lengths "
             f"(at most {choice.max_buckets}, from {', '.join(map(str, choice.lengths))}) "
             f"within {choice.max_cost:g}x"]
    for b in choice.buckets:
        cos = "-" if b.cosine_mean is None else f"{b.cosine_mean:.5f}"
        lines.append(f"  seq {b.seq_len:>5}: {b.share:6.1%} of the texts, "
                     f"{b.candidate}, cost {b.cost:.3f}x, cosine {cos}, "
                     f"{'legal' if b.legal else 'NOT legal'}")
    on_sel = "".join(f", {k} {fmt.value(k, v)}" for k, v in choice.selection_metrics.items())
    lines.append(f"chosen: mean cost {choice.cost_mean:.3f}x (standard error "
                 f"{choice.cost_mean_se:.3f}x), embedding cosine "
                 f"{choice.cosine_mean:.5f}{on_sel} on the {choice.texts} texts it was "
                 "chosen on (not held out)")
    for name, c in choice.candidates.items():
        lines.append(f"  candidate {name}: alone at {choice.lengths[-1]} cosine "
                     f"{c.cosine_mean:.5f}, cost {c.cost_at_longest:.3f}x")
    lines.extend(f"note: {n}" for n in choice.notes)
    return "\n".join(lines)
