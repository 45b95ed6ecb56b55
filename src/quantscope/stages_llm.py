"""Stage composition for decoder LLMs: both phase graphs, one plan, per-phase results.

Kept apart from ``stages.py`` (same layer): open a prefill/decode pair, check a plan on
both, and measure its next-token quality per phase on frozen text.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscope.analyze.phases import PhaseDiagnosis, diagnose_phase, residual_groups
from quantscope.calibrate.collect import tapped_model
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load
from quantscope.model.phases import PHASES, phase_path
from quantscope.plan.phase_search import (
    SELECTION,
    PhaseCandidate,
    candidate_plans,
    choose,
    kept_plans,
    rank_by_range,
    screen,
)
from quantscope.plan.phases import PhaseCheck, check_phases
from quantscope.targets import load_target
from quantscope.tasks.lm import DEFAULT_SEQ_LEN, TokenWindows, load_lm_tokenizer, token_windows
from quantscope.tasks.lm_phases import (
    LM_PHASES,
    OpenPhase,
    calibrate_phases,
    evaluate_lm_plans,
    position_absmax,
    release_memory,
)
from quantscope.types import Plan, Precision, QuantscopeError, Stats
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

    @classmethod
    def at(cls, seq_len: int | None) -> LmSetup:
        """The default amounts of text at ``seq_len`` tokens (None: the default length)."""
        return cls(seq_len=seq_len or DEFAULT_SEQ_LEN)


def lm_text(spec: str | Path, setup: LmSetup) -> tuple[TokenWindows, list[np.ndarray]]:
    """The token windows and greedy prompts of ``setup`` (tokenized with the model's own)."""
    tok = load_lm_tokenizer(phase_file(spec, "prefill"))
    windows = token_windows(tok, seq_len=setup.seq_len, calibration=setup.calibration,
                            evaluation=setup.evaluation)
    prompts = [np.array(tok.encode(PROMPT).ids, np.int64), *(w[:12] for w in windows.evaluation)]
    return windows, prompts[:setup.prompts]


def _opener(spec: str | Path) -> OpenPhase:
    def phase_model(phase: str) -> Model:
        return open_phase(spec, phase)

    return phase_model


def lm_quality(spec: str | Path, plans: dict[str, Plan], setup: LmSetup = LmSetup()
               ) -> dict[str, Any]:
    """Per plan and phase: top-1 agreement, KL, perplexity ratio, greedy agreement, time."""
    windows, prompts = lm_text(spec, setup)
    stats = calibrate_phases(_opener(spec), windows, steps=setup.steps)
    results = evaluate_lm_plans(_opener(spec), stats, plans, windows, prompts=prompts,
                                steps=setup.steps, new_tokens=setup.new_tokens)
    return {"data": windows.source, "setup": setup.__dict__, "plans": results}


def diagnose_phases(spec: str | Path, stats: dict[str, Stats], windows: TokenWindows,
                    phases: tuple[str, ...] = PHASES) -> tuple[PhaseDiagnosis, ...]:
    """Per phase, from its calibration statistics (and, in prefill, the residual stream's
    per-position max over the calibration windows); one graph open at a time."""
    out = []
    for phase in phases:
        model = open_phase(spec, phase)
        groups, names = find_groups(model), model.output_names()
        positions = None
        if phase == "prefill":
            residual = [g.outputs[0] for g in residual_groups(groups)]
            tapped = tapped_model(model, residual)
            del model  # one copy of the weights less while the session loads
            release_memory()
            positions = position_absmax(tapped, residual, windows.calibration)
            del tapped
        out.append(diagnose_phase(phase, groups, stats[phase], names, positions))
        release_memory()
    return tuple(out)


def diagnose_model(spec: str | Path, phases: tuple[str, ...] = PHASES,
                   setup: LmSetup = LmSetup()) -> tuple[PhaseDiagnosis, ...]:
    """``analyze --phase``: calibrate both phase graphs on ``setup``'s text, diagnose each."""
    windows, _ = lm_text(spec, setup)
    stats = calibrate_phases(_opener(spec), windows, steps=setup.steps)
    return diagnose_phases(spec, stats, windows, phases)


@dataclass(frozen=True)
class PhasePlan:
    """``plan --phase``: every candidate (checked per phase), the kept ones measured."""

    chosen: PhaseCandidate
    candidates: tuple[PhaseCandidate, ...]
    quality: dict[str, Any]  # lm_quality's form, for the kept candidates
    diagnosis: tuple[PhaseDiagnosis, ...]
    max_cost: float

    def plan(self) -> Plan:
        """The chosen plan with its per-phase results in ``meta`` (JSON strings)."""
        q = self.quality["plans"][self.chosen.label]
        results = {"checks": {c.phase: {"seq_len": c.seq_len, "cost": c.cost,
                                        "errors": c.errors} for c in self.chosen.checks},
                   "quality": {k: v for k, v in q.items() if k != "time"}}
        meta = {"planner": "quantscope plan --phase", "candidate": self.chosen.label,
                "selection": SELECTION, "max_cost": repr(self.max_cost),
                "lm_data": self.quality["data"], "lm_setup": json.dumps(self.quality["setup"]),
                "phase_results": json.dumps(results)}
        return dataclasses.replace(self.chosen.plan, meta=tuple(meta.items()))


def plan_phases(spec: str | Path, target: str, *, max_cost: float = 1.5,
                setup: LmSetup = LmSetup(), phases: tuple[str, ...] = PHASES) -> PhasePlan:
    """Candidates ranked by the calibrated ranges, screened on the ``phases`` graphs (legal,
    within ``max_cost`` in each), the kept ones measured (on both graphs: decode's metrics
    need the prefill cache), the best chosen (:mod:`quantscope.plan.phase_search`)."""
    tgt = load_target(target)
    windows, prompts = lm_text(spec, setup)
    stats = calibrate_phases(_opener(spec), windows, steps=setup.steps)
    diagnosis = diagnose_phases(spec, stats, windows, phases)
    models = open_phase_models(spec, phases)
    ranked = rank_by_range(find_groups(next(iter(models.values()))), list(stats.values()))
    plans = candidate_plans(models, tgt, ranked, setup.seq_len, max_cost)
    candidates = screen(plans, models, tgt, setup.seq_len)
    del models
    release_memory()
    kept = kept_plans(candidates, max_cost)  # none: one line, before any evaluation
    results = evaluate_lm_plans(_opener(spec), stats, kept, windows, prompts=prompts,
                                steps=setup.steps, new_tokens=setup.new_tokens)
    quality = {"data": windows.source, "setup": setup.__dict__, "plans": results}
    return PhasePlan(choose(candidates, results, max_cost), candidates, quality, diagnosis,
                     max_cost)


def format_phase_plan(out: PhasePlan) -> list[str]:
    """The candidates' cost and legality per phase, then the measured ones' quality."""
    phases = [c.phase for c in out.candidates[0].checks]
    head = "".join(f" {p + ' cost':>13} {'errors':>6}" for p in phases)
    lines = [f"{'candidate':<12} {'16-bit':>6}{head}  kept (cap {out.max_cost}x, no error)"]
    for c in out.candidates:
        n16 = len(c.plan.overrides) if c.plan.default is Precision.A8_W8 else "all"
        cells = "".join(f" {k.cost:>12.2f}x {k.errors:>6}" for k in c.checks)
        rules = sorted({p.rule for k in c.checks for p in k.problems if p.severity == "error"})
        why = "yes" if c.kept(out.max_cost) else "no" + (f" ({', '.join(rules)})" if rules
                                                        else " (cost)")
        lines.append(f"{c.label:<12} {n16!s:>6}{cells}  {why}")
    lines.append("measured on " + out.quality["data"] + " (top-1 agreement with FP32, KL, "
                 "perplexity ratio):")
    lines += format_lm_quality(out.quality)
    lines.append(f"chosen: {out.chosen.label} ({SELECTION})")
    return lines


def format_phase_checks(checks: tuple[PhaseCheck, ...]) -> list[str]:
    lines = []
    for c in checks:
        lines.append(f"{c.phase} (seq-len {c.seq_len}): cost {c.cost:.2f}x a8_w8, "
                     f"{c.errors} error(s), {len(c.problems) - c.errors} warning(s), "
                     f"weights {c.weight_bytes / 1e6:.1f} MB")
        lines += [f"  {p.severity}: [{p.rule}] {p.group}: {p.reason}" for p in c.problems]
    return lines


def format_lm_quality(result: dict[str, Any]) -> list[str]:
    lines = [f"{'plan':<14} {'phase':<16} {'top-1':>7} {'KL':>9} {'ppl ratio':>10}"]
    for label, res in result["plans"].items():
        for phase in LM_PHASES:
            v = res[phase]
            lines.append(f"{label:<14} {phase:<16} {v['top1_agreement']:>7.3f} "
                         f"{v['kl']:>9.4f} {v['ppl_ratio']:>10.4f}")
        greedy = f"greedy ({result['setup']['new_tokens']} tok)"
        lines.append(f"{label:<14} {greedy:<16} "
                     f"{res['greedy']['greedy_agreement']:>7.3f}")
    return lines


def rewrite_phase_files(spec: str | Path, name: str, out: str | Path, config: Any = None, *,
                        seq_len: int = DEFAULT_SEQ_LEN) -> dict[str, str]:
    """Registered rewrite ``name`` applied to both phase graphs of ``spec``, one graph in
    memory at a time (:func:`quantscope.rewrites.phases.rewrite_phase`: FP32 checked per
    phase; the same weights in both, by digest), written as a decoder's files
    (:func:`write_phase_files`). Returns phase -> the rewrite's reason."""
    from quantscope.rewrites.phases import rewrite_phase
    from quantscope.rewrites.registry import REWRITES

    if name not in REWRITES:
        raise QuantscopeError(f"unknown rewrite '{name}': use one of {', '.join(REWRITES)}")

    def one(phase: str) -> tuple[onnx.ModelProto, str]:
        r = rewrite_phase(REWRITES[name], open_phase(spec, phase), phase, config,
                          seq_len=seq_len)
        return r.proto, f"{r.reason} (FP32 max relative diff {r.fp32_diff:.2g})"

    return write_phase_files(spec, name, one, out)


def smooth_phase_files(spec: str | Path, out: str | Path, *, alpha: float = 0.5,
                       setup: LmSetup = LmSetup(), rtol: float = 1e-4) -> dict[str, str]:
    """SmoothQuant (:func:`quantscope.repair.smooth.smooth_outliers`: RMSNorm gains / s,
    the Linears reading them x s) on both phase graphs with the scales of the prefill
    graph's calibration (so both get the same weights, checked), FP32 checked per phase
    within ``rtol`` (30 layers in float32: 1e-4, as ``rotate``), written as a decoder's
    files. Returns phase -> what it did."""
    from quantscope.model.phases import phase_shapes
    from quantscope.repair.smooth import smooth_outliers
    from quantscope.repair.tokens import sample_feeds

    windows, _ = lm_text(spec, setup)
    stats = calibrate_phases(_opener(spec), windows, steps=setup.steps)["prefill"]

    def one(phase: str) -> tuple[onnx.ModelProto, str]:
        model = open_phase(spec, phase)
        feeds = sample_feeds(model, (setup.seq_len,), what="smooth",
                             shapes=phase_shapes(model, phase, setup.seq_len))
        r = smooth_outliers(model, stats, feeds, alpha=alpha, rtol=rtol)
        return r.proto, f"{r.reason} {dict(r.effect)}"

    return write_phase_files(spec, "smooth", one, out)


def write_phase_files(spec: str | Path, what: str,
                      make: Callable[[str], tuple[onnx.ModelProto, str]],
                      out: str | Path) -> dict[str, str]:
    """Each phase graph ``make(phase)`` gives (one in memory at a time) written as a
    decoder's files: ``out`` (``X.prefill.onnx``), its ``.decode.`` sibling (weights as
    external ``.data`` files) and ``spec``'s tokenizer beside them; the graphs' shared
    weights must be equal (by digest), else the files are removed and one line says
    which differs. Returns phase -> ``make``'s note."""
    import shutil

    from quantscope.rewrites.phases import same_weights, weight_digests
    from quantscope.tasks.lm import tokenizer_path
    from quantscope.zoo.cache import write_atomic

    out = Path(out)
    if ".prefill." not in out.name:
        raise QuantscopeError(f"name the output like X.prefill.onnx, not '{out.name}': the "
                              "decode graph and the tokenizer are written beside it")
    digests, notes, written = {}, {}, []
    try:
        for phase in PHASES:
            proto, notes[phase] = make(phase)
            digests[phase] = weight_digests(proto)
            path = out.with_name(out.name.replace(".prefill.", f".{phase}."))
            written += [path, path.with_name(f"{path.name}.data")]
            write_atomic(path, lambda tmp, p=proto, n=path.name: onnx.save(
                p, str(tmp), save_as_external_data=True, location=f"{n}.data"))
            del proto
            release_memory()
        same_weights(what, digests)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    tok = out.with_name(out.name.replace(".prefill.", ".tokenizer.")).with_suffix(".json")
    shutil.copyfile(tokenizer_path(phase_file(spec, "prefill")), tok)
    return notes


__all__ = ["LmSetup", "PhasePlan", "check_plan_phases", "diagnose_model",
           "diagnose_phases", "format_lm_quality",
           "format_phase_checks", "format_phase_plan", "lm_quality", "lm_text",
           "open_phase_models", "phase_file", "plan_phases", "rewrite_phase_files",
           "smooth_phase_files", "write_phase_files"]
