"""Stage composition for decoder LLMs: both phase graphs, one plan, per-phase results.

Kept apart from ``stages.py`` (same layer): open a prefill/decode pair, check a plan on
both, and measure its next-token quality per phase on frozen text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscope.model.load import Model, load
from quantscope.model.phases import PHASES, phase_path
from quantscope.plan.phases import PhaseCheck, check_phases
from quantscope.targets import load_target
from quantscope.tasks.lm import DEFAULT_SEQ_LEN, load_lm_tokenizer, token_windows
from quantscope.tasks.lm_phases import LM_PHASES, calibrate_phases, evaluate_lm_plans
from quantscope.types import Plan, QuantscopeError
from quantscope.zoo.decoder import PRODUCER as DECODER_PRODUCER

PROMPT = "The capital of France is"


def phase_file(spec: str | Path, phase: str) -> Path:
    """The ``phase`` graph file of a built-in decoder name or a prefill/decode file."""
    from quantscope.zoo import resolve_model

    return phase_path(resolve_model(str(spec)), phase)


def open_phase(spec: str | Path, phase: str) -> Model:
    """One phase graph; a built-in decoder's cache file was checked when it was built."""
    path = phase_file(spec, phase)
    proto = onnx.load(str(path))
    if proto.producer_name == DECODER_PRODUCER and len(proto.graph.value_info):
        return Model(proto=proto, source=str(path))
    return load(path)


def open_phase_models(spec: str | Path, phases: tuple[str, ...] = PHASES) -> dict[str, Model]:
    return {p: open_phase(spec, p) for p in phases}


def check_plan_phases(spec: str | Path, plan: Plan, phases: tuple[str, ...],
                      seq_len: int | None) -> tuple[PhaseCheck, ...]:
    if not plan.target:
        raise QuantscopeError("the plan names no target: check --phase needs one "
                              "(give --target or a plan made for a target)")
    return check_phases(plan, open_phase_models(spec, phases), load_target(plan.target),
                        seq_len or DEFAULT_SEQ_LEN)


@dataclass(frozen=True)
class LmSetup:
    """How much text a phase evaluation uses (the defaults fit a 2-core laptop in minutes)."""

    seq_len: int = DEFAULT_SEQ_LEN
    calibration: int = 16
    evaluation: int = 8
    steps: int = 8
    prompts: int = 4
    new_tokens: int = 32


def lm_quality(spec: str | Path, plans: dict[str, Plan], setup: LmSetup = LmSetup()
               ) -> dict[str, Any]:
    """Per plan and phase: top-1 agreement, KL, perplexity ratio, greedy agreement, time."""
    tok = load_lm_tokenizer(phase_file(spec, "prefill"))
    windows = token_windows(tok, seq_len=setup.seq_len, calibration=setup.calibration,
                            evaluation=setup.evaluation)
    prompts = [np.array(tok.encode(PROMPT).ids, np.int64), *(w[:12] for w in windows.evaluation)]
    prompts = prompts[:setup.prompts]
    def phase_model(phase: str) -> Model:
        return open_phase(spec, phase)

    stats = calibrate_phases(phase_model, windows, steps=setup.steps)
    results = evaluate_lm_plans(phase_model, stats, plans, windows, prompts=prompts,
                                steps=setup.steps, new_tokens=setup.new_tokens)
    return {"data": windows.source, "setup": setup.__dict__, "plans": results}


def format_phase_checks(checks: tuple[PhaseCheck, ...]) -> list[str]:
    lines = []
    for c in checks:
        lines.append(f"{c.phase} (seq-len {c.seq_len}): cost {c.cost:.2f}x a8_w8, "
                     f"{c.errors} error(s), {len(c.problems) - c.errors} warning(s)")
        lines += [f"  {p.severity}: [{p.rule}] {p.group}: {p.reason}" for p in c.problems]
    return lines


def format_lm_quality(result: dict[str, Any]) -> list[str]:
    lines = [f"{'plan':<14} {'phase':<16} {'top-1':>7} {'KL':>9} {'ppl ratio':>10}"]
    for label, res in result["plans"].items():
        for phase in LM_PHASES:
            v = res[phase]
            lines.append(f"{label:<14} {phase:<16} {v['top1_agreement']:>7.3f} "
                         f"{v['kl']:>9.4f} {v['ppl_ratio']:>10.4f}")
        lines.append(f"{label:<14} {'greedy (32 tok)':<16} "
                     f"{res['greedy']['greedy_agreement']:>7.3f}")
    return lines


__all__ = ["LmSetup", "check_plan_phases", "format_lm_quality", "format_phase_checks",
           "lm_quality", "open_phase_models", "phase_file"]
