"""A decoder's plan in text (``plan --phase``, ``plan.txt`` of ``run`` on a decoder): the
candidates' cost and legality per phase, then the measured ones' quality.

Shares (top-1 agreement, greedy agreement) in percent with their standard errors in
points, as everywhere (:mod:`quantscope.report.fmt`); a KL and a perplexity ratio at 4
decimals. A standard error not recorded reads ``—``, never 0.
"""

from __future__ import annotations

from typing import Any

from quantscope.analyze.prefix import format_prefix
from quantscope.plan.accepted import accepted_lines
from quantscope.plan.phase_search import SELECTION, unit_of
from quantscope.plan.phases import PhaseCheck
from quantscope.report import fmt
from quantscope.tasks.lm_phases import LM_PHASES
from quantscope.types import Precision

FIGURES = ("top1_agreement", "kl", "ppl_ratio")  # a phase's row, in its columns' order


def format_phase_plan(out: Any) -> list[str]:
    """The candidates' cost and legality per phase, then the measured ones' quality
    (``out``: a :class:`quantscope.stages_llm.PhasePlan`)."""
    phases = [c.phase for c in out.candidates[0].checks]
    head = "".join(f" {p + ' cost':>13} {'errors':>6}" for p in phases)
    width = max(12, *(len(c.label) for c in out.candidates))
    lines = [f"{'candidate':<{width}} {'16-bit':>6}{head}  kept (cap {out.max_cost}x, no error or "
             "blocking warning)"]
    for c in out.candidates:
        n16 = len({unit_of(n) for k in c.checks for n, _ in c.plan.for_phase(k.phase).overrides}
                  ) if c.plan.default is Precision.A8_W8 else "all"
        cells = "".join(f" {k.cost:>12.2f}x {k.errors:>6}" for k in c.checks)
        rules = blocking_rules(c.checks)
        why = "yes" if c.kept(out.max_cost) else "no" + (f" ({', '.join(rules)})" if rules
                                                        else " (cost)")
        lines.append(f"{c.label:<{width}} {n16!s:>6}{cells}  {why}")
    lines.append("measured on " + out.quality["data"] + " (top-1 agreement with FP32, KL, "
                 "perplexity ratio):")
    lines += format_lm_quality(out.quality)
    lines.append(f"chosen: {out.chosen.label} ({SELECTION})")
    return lines + accepted_lines(out.accepted)


def blocking_rules(checks: tuple[PhaseCheck, ...]) -> list[str]:
    """The rules that make a candidate illegal on some phase, a warning's marked
    ``(warning)`` (one that ``--allow-warning RULE`` would let through)."""
    return sorted({p.rule + ("" if p.severity == "error" else " (warning)")
                   for k in checks for p in k.blocked})


def format_phase_checks(checks: tuple[PhaseCheck, ...]) -> list[str]:
    """Per phase its cost and problems; a warning ``--allow-warning`` accepted is listed
    and counted as accepted (:data:`fmt.ACCEPTED`), not as passing."""
    lines = []
    for c in checks:
        labels = [fmt.ACCEPTED if p in c.accepted else p.severity for p in c.problems]
        lines.append(f"{c.phase} (seq-len {c.seq_len}): cost {c.cost:.2f}x a8_w8, "
                     f"{fmt.problem_counts(labels)}, weights {c.weight_bytes / 1e6:.1f} MB")
        lines += [f"  {label}: [{p.rule}] {p.group}: {p.reason}"
                  for p, label in zip(c.problems, labels, strict=True)]
    return lines


def format_lm_quality(result: dict[str, Any]) -> list[str]:
    """Per plan and phase the figures, then their standard errors over windows / prompts:
    ``a8_w8  prefill  93.4 %  0.0123  1.0123  (± 1.1 pts, ± 0.0012, ± 0.0040; 512)``."""
    lines = [format_prefix(result.get("prefix")),
             f"{'plan':<14} {'phase':<16} {'top-1':>7} {'KL':>9} {'ppl ratio':>10}   "
             "(± standard error; positions)"]
    for label, res in result["plans"].items():
        for phase in LM_PHASES:
            v = res[phase]
            top1, kl, ppl = (fmt.fixed(k, v[k]) for k in FIGURES)
            errors = ", ".join(f"± {fmt.spread(k, v.get(f'{k}_se'))}" for k in FIGURES)
            lines.append(f"{label:<14} {phase:<16} {top1:>7} {kl:>9} {ppl:>10}   "
                         f"({errors}; {v['positions']:.0f})")
        g, m = res["greedy"], "greedy_agreement"
        greedy = f"greedy ({result['setup']['new_tokens']} tok)"
        lines.append(f"{label:<14} {greedy:<16} {fmt.value(m, g[m]):>7}   "
                     f"(± {fmt.spread(m, g.get(f'{m}_se'))}; {g['prompts']:.0f} prompts)"
                     + (f"; FP32's own next pick at {fmt.value('greedy_stepwise', g['greedy_stepwise'])}"
                        f" of its steps, ppl {g['greedy_ppl_ratio']:.3f}x FP32's own"
                        if "greedy_stepwise" in g else ""))
        t = res.get("time")
        if t:
            lines.append(f"{label:<14} {'time':<16} prefill {t['prefill_s']:.1f} s, decode "
                         f"{t['decode_s']:.1f} s ({t['decode_steps']:.0f} steps); FP32 prefill "
                         f"{t['fp32_prefill_s']:.1f} s")
    return lines


__all__ = ["blocking_rules", "format_lm_quality", "format_phase_checks", "format_phase_plan"]
