"""Diagnose a decoder's prefill activations and write candidate hailo10h plans under a cost cap.

    python bench/llm_candidates.py [MODEL] [--seq-len 64] [--calibration 16]
                                   [--max-cost 1.5] [--out-dir DIR]

Calibrates the prefill graph on stdlib-docs windows, prints the widest group outputs
(range, and the largest channel over the median channel: the few "massive activation"
channels of LLMs), then builds plans that put 16-bit activations on the widest groups
whose kind hailo10h allows at 16 bit (not attention MatMul / Softmax): all residual Adds,
and the top-k groups by range for growing k, keeping those that are legal on BOTH phase
graphs and cost at most --max-cost x uniform a8_w8 in both. Writes them as plan JSON for
``bench/llm.py --plan-file``; quality is measured there, not predicted here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.phases import phase_shapes
from quantscope.plan.check import check
from quantscope.plan.cost import plan_cost
from quantscope.serde import write_plan
from quantscope.stages_llm import open_phase, phase_file
from quantscope.targets import load_target
from quantscope.targets.profile import op_kind
from quantscope.tasks.lm import load_lm_tokenizer, token_windows
from quantscope.types import Plan, Precision

A16 = Precision.A16_W16


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--calibration", type=int, default=16)
    ap.add_argument("--max-cost", type=float, default=1.5)
    ap.add_argument("--target", default="hailo10h")
    ap.add_argument("--out-dir", type=Path, default=Path("llm-plans"))
    return ap.parse_args()


def _widest(model, stats) -> list[tuple[str, float, float]]:
    rows = []
    for g in find_groups(model).groups:
        for t in g.outputs:
            s = stats.tensors.get(t)
            if s is None:
                continue
            ch = np.asarray(s.channel_absmax, np.float64)
            ratio = float(ch.max() / max(np.median(ch), 1e-12)) if ch.size else 1.0
            if s.max - s.min < 1e30:  # a masked-scores output: encode() sets its range
                rows.append((g.name, float(s.max - s.min), ratio))
    return sorted(rows, key=lambda r: -r[1])


def _plan(target: str, names: list[str]) -> Plan:
    return Plan(default=Precision.A8_W8, target=target, overrides=tuple((n, A16) for n in names),
                reasons=tuple((n, "widest prefill activation range") for n in names))


def _verdict(layout, target, plan: Plan) -> tuple[float, int]:
    """(highest phase cost, errors over both phases) of ``plan``."""
    costs, errors = [], 0
    for groups, shapes, m in layout.values():
        costs.append(plan_cost(plan, groups, target, shapes, model=m))
        errors += sum(p.severity == "error" for p in check(plan, groups, m, target, shapes=shapes))
    return max(costs), errors


def _candidates(widest, allowed, layout, target, max_cost) -> dict[str, list[str]]:
    """Named lists of groups to put at a16_w16 (see the module docstring)."""
    ranked = list(dict.fromkeys(n for n, _, _ in widest if n in allowed))
    weighted = {g.name for g in layout["prefill"][0].groups if op_kind(g) == "weighted"}
    act = [n for n in ranked if n not in weighted]
    candidates = {"top8": ranked[:8], "residual16": [n for n in act if n.endswith("_residual")],
                  "act16": act}
    # the rules here judge each group alone: drop the groups that error at 16 bit
    bad = {p.group for _, (groups, shapes, m) in layout.items()
           for p in check(_plan(target.name, ranked), groups, m, target, shapes=shapes)
           if p.severity == "error"}
    legal_act = [n for n in act if n not in bad]
    candidates["act16_legal"] = legal_act
    grown = list(legal_act)
    for n in (n for n in ranked if n in weighted and n not in bad):  # widest first
        cost = max(plan_cost(_plan(target.name, [*grown, n]), groups, target, shapes, model=m)
                   for groups, shapes, m in layout.values())
        if cost > max_cost:
            break
        grown.append(n)
    candidates["act16_legal+w16"] = grown
    return candidates


def main() -> None:
    a = _args()
    target = load_target(a.target)
    tok = load_lm_tokenizer(phase_file(a.model, "prefill"))
    windows = token_windows(tok, seq_len=a.seq_len, calibration=a.calibration, evaluation=1)
    pre = open_phase(a.model, "prefill")
    stats = calibrate(pre, find_groups(pre), ({"input_ids": w[None]} for w in windows.calibration))
    widest = _widest(pre, stats)
    print("widest prefill group outputs (range, max channel / median channel):")
    for name, rng, ratio in widest[:15]:
        print(f"  {name:<32} {rng:>10.1f} {ratio:>8.1f}")
    phases = {"prefill": pre, "decode": open_phase(a.model, "decode")}
    layout = {p: (find_groups(m), phase_shapes(m, p, a.seq_len), m) for p, m in phases.items()}
    allowed = {g.name for g in layout["prefill"][0].groups
               if op_kind(g) not in ("matmul", "softmax")}

    candidates = _candidates(widest, allowed, layout, target, a.max_cost)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for label, names in candidates.items():
        plan = _plan(target.name, names)
        cost, errors = _verdict(layout, target, plan)
        keep = errors == 0 and cost <= a.max_cost
        print(f"{label:<12} {len(names):>3} groups at a16_w16: max phase cost {cost:.2f}x, "
              f"{errors} error(s){'  -> ' + str(a.out_dir / (label + '.json')) if keep else ''}")
        if keep:
            write_plan(a.out_dir / f"{label}.json", plan)


if __name__ == "__main__":
    main()
