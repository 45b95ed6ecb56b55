"""The decoder run's ``finetune`` stage (``run DECODER --finetune on``), and which graphs the
stages after it ship.

==============  =========================================================================
train           :func:`quantscope.finetune.phases.distill_phases`: the weights both phase
                graphs share, trained by PyTorch under the chosen plan (its grids held)
                on the built-in text's calibration stream (:data:`TRAIN_WINDOWS` windows
                of the run's length: the text calibration reads, disjoint from the
                evaluation documents), :data:`MAX_STEPS` steps or fewer within
                ``--budget`` (the learning rate anneals to zero within both); on CUDA
                when PyTorch sees a GPU
tuned graphs    the trained weights written into both graphs (``model.tuned/``), the KV
                prefix computed again from them in FP32 (``finetune.prefix.npz`` / ``.py``:
                what the host loads), both phases calibrated again on the run's
                calibration windows (``stats.tuned.{prefill,decode}.npz``)
measured        ONNX Runtime measures the plan on the tuned graphs against the
                **original** FP32 graphs at the evaluate stage's amounts (the same windows,
                prompts and decode steps as ``evaluate.json``)
kept            when ``--metric`` is better than the evaluate stage's by more than the
                standard error of the difference (taken unpaired: conservative) and no
                other figure of the verdict is worse by more than :data:`GUARD_SE` of
                its own; else the tuned files are removed and the untuned model ships.
                The choice reads the evaluation text (one decision between two models):
                said in ``finetune.json`` and the verdict
==============  =========================================================================

Kept, the stages after it (``w4``, ``whatif``, ``export``, ``host``, ``report``) work on the
tuned graphs, their calibration and prefix (:func:`shipped`), and measure against the
original FP32: what is measured is what ships. Not asked: ``finetune.json`` says so and
nothing else changes.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from typing import Any

from quantscope.pipeline.decoder_files import (
    EVALUATE,
    FINETUNE,
    PREFIX_NPZ,
    PREFIX_PY,
    STATS,
    TUNED_DIR,
    TUNED_PREFIX_NPZ,
    TUNED_PREFIX_PY,
    TUNED_STATS,
    Done,
)
from quantscope.types import QuantscopeError

TRAIN_WINDOWS = 265  # the built-in text's calibration stream at 64 tokens (smollm2's tokenizer)
# The schedule's length, the time budget ending it sooner (and annealing within it). On
# smollm2-135m 41 steps of a 48-step schedule measured best; 124 of a 140-step one were no
# better on decode and worse on prefill KL, their training KL rising over the second pass
# through the windows (docs/benchmarks.md, "Longer distillation"): more steps are not
# taken where a GPU would allow them.
MAX_STEPS = 48
# run 2 of docs/benchmarks.md, "Quantization-aware distillation of both phases": the better
# of the two configurations measured on smollm2-135m
LR, BATCH, DECODE_POSITIONS, DECODE_WEIGHT = 2e-5, 4, 8, 2.0
# both phases calibrated again on the current weights every that many steps (0: never; the
# grids then stay the plan stage's until the calibration after the training). Every 10
# steps measured no better on smollm2-135m: the training KL then reads what the evaluation
# measures, the held-out figures stay run 2's (docs/benchmarks.md, "Which grids the
# distilled weights are measured on")
REGRID_EVERY = 0
INSTALL = "pip install 'quantscope[finetune]'"


@dataclass(frozen=True)
class Shipped:
    """The graphs the deployment quantizes, their calibration and KV prefix files (run
    folder names), and whether they are the fine-tune's."""

    spec: str
    stats: dict[str, str]
    prefix_npz: str
    prefix_py: str
    tuned: bool


def kept(ctx: Any) -> bool:
    """Whether the run's fine-tune was asked and kept (``finetune.json``)."""
    from quantscope.serde import read_json

    path = ctx.path(FINETUNE)
    return path.is_file() and bool(read_json(path, "fine-tune").get("kept"))


def shipped(ctx: Any) -> Shipped:
    """What the stages after ``finetune`` quantize (:class:`Shipped`)."""
    if kept(ctx):
        return Shipped(str(ctx.path(TUNED_DIR) / "model.prefill.onnx"), dict(TUNED_STATS),
                       TUNED_PREFIX_NPZ, TUNED_PREFIX_PY, True)
    return Shipped(ctx.spec(), dict(STATS), PREFIX_NPZ, PREFIX_PY, False)


def _clear(ctx: Any) -> None:
    shutil.rmtree(ctx.path(TUNED_DIR), ignore_errors=True)
    for name in (*TUNED_STATS.values(), TUNED_PREFIX_NPZ, TUNED_PREFIX_PY):
        ctx.path(name).unlink(missing_ok=True)


def _write_graphs(ctx: Any, spec: str, weights: dict[str, Any]) -> str:
    """Both phase graphs with ``weights``, and the tokenizer, into ``model.tuned/``
    (:func:`quantscope.stages_llm.write_phase_files`: the decode graph reads the weights
    both graphs have from the prefill graph's data file)."""
    from quantscope.model.load import with_initializers
    from quantscope.stages_llm import open_phase, write_phase_files

    folder = ctx.path(TUNED_DIR)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    out = folder / "model.prefill.onnx"
    write_phase_files(spec, "fine-tune", lambda phase: (
        with_initializers(open_phase(spec, phase), weights, "fine-tune").proto, ""), out)
    return str(out)


GUARD_SE = 2.0  # another figure worse by more than this many standard errors vetoes a keep


def _change(name: str, before: dict[str, Any], after: dict[str, Any]
            ) -> tuple[float, float, float, float]:
    """A figure's value before and after, its gain (positive = better) and the standard
    error of the difference (taken unpaired: conservative)."""
    from quantscope.pipeline.decoder_report import METRICS

    m = METRICS[name]
    b, a = before.get(m.phase) or {}, after.get(m.phase) or {}
    vb, va = b.get(m.key), a.get(m.key)
    if vb is None or va is None:
        return math.nan, math.nan, math.nan, math.nan
    se = math.hypot(b.get(f"{m.key}_se", 0.0), a.get(f"{m.key}_se", 0.0))
    return vb, va, (va - vb) if m.higher else (vb - va), se


def _decision(metric: str, before: dict[str, Any], after: dict[str, Any]) -> tuple[bool, str]:
    """Kept or not, and why in words: ``metric``
    (:data:`~quantscope.pipeline.decoder_report.METRICS`) better by more than the standard
    error of the difference, and no other figure worse by more than :data:`GUARD_SE` of
    its own (a tune that buys perplexity with decode's agreement is not what a user asked
    for)."""
    from quantscope.pipeline.decoder_report import METRICS

    vb, va, gain, se = _change(metric, before, after)
    if math.isnan(gain):
        return False, f"{metric} was not measured on both models: the untuned model ships"
    keep = gain > se
    why = (f"{metric} {vb:.4f} -> {va:.4f} ({'better' if gain >= 0 else 'worse'} by "
           f"{abs(gain):.4f}; standard error of the difference {se:.4f})")
    if not keep:
        return False, why + ": not better by more than the noise: the untuned model ships"
    worse = []
    for name in METRICS:
        ob, oa, og, ose = _change(name, before, after)
        if name != metric and og < -GUARD_SE * ose:
            worse.append(f"{name} {ob:.4f} -> {oa:.4f} (worse by {-og:.4f}, "
                         f"{-og / ose if ose else math.inf:.1f} standard errors)")
    if worse:
        return False, (why + f", but {'; '.join(worse)}: worse beyond {GUARD_SE:g} standard "
                       "errors of the difference: the untuned model ships")
    return True, why + (f"; the other figures better or within {GUARD_SE:g} standard errors: "
                        "kept")


def _opener(spec: str, prefix: Any) -> Any:
    """The phase graphs of ``spec``, the prefill reading ``prefix`` (an ``LmPrefix``)."""
    from quantscope.analyze.prefix import prefixed_opener
    from quantscope.stages_llm import open_phase

    return prefixed_opener(lambda phase: open_phase(spec, phase), prefix.kv if prefix else None)


def _train(ctx: Any, base: Any, stats: dict[str, Any], plan: Any, tokens: tuple[int, ...],
           windows: Any) -> tuple[Any, dict[str, Any]]:
    """:func:`~quantscope.finetune.phases.distill_phases` on the run's graphs (``base``: the
    phase opener with the KV prefix of ``tokens``) under ``plan``, for the run's budget
    (``windows``: the run's calibration, which a regrid reads): its result, and its record
    for ``finetune.json``."""
    from quantscope.emulate.release import release_memory
    from quantscope.finetune.phases import PhaseTuneConfig, distill_phases, phase_regrid
    from quantscope.stages_llm import open_phase, phase_file
    from quantscope.tasks.lm import load_lm_tokenizer, token_windows

    budget, seq = ctx.opts.finetune, ctx.opts.phases_setup().seq_len
    tok = load_lm_tokenizer(phase_file(ctx.spec(), "prefill"))
    train = token_windows(tok, seq_len=seq, calibration=TRAIN_WINDOWS, evaluation=1).calibration
    config = PhaseTuneConfig(steps=MAX_STEPS, lr=LR, batch=min(BATCH, len(train)),
                             decode_positions=DECODE_POSITIONS, decode_weight=DECODE_WEIGHT,
                             max_seconds=budget, regrid_every=REGRID_EVERY)
    regrid = phase_regrid(lambda phase: open_phase(ctx.spec(), phase), tokens, windows,
                          ctx.opts.phases_setup().steps) if REGRID_EVERY else None
    ctx.say(f"[finetune] both phases' shared weights under the plan, by PyTorch, for at most "
            f"{budget:.0f} s on {len(train)} training windows of {seq} tokens …")
    models = {p: base(p) for p in ("prefill", "decode")}
    res = distill_phases(models, stats, plan, train, config, prefix=len(tokens),
                         progress=ctx.progress, regrid=regrid)
    del models
    release_memory()
    ctx.say(f"[finetune] {res.summary()}")
    first, last = res.log[0], res.log[-1]
    return res, {"steps": res.steps, "seconds": round(res.seconds, 1), "windows": res.windows,
                 "device": res.device, "budget_s": budget, "lr": config.lr,
                 "batch": config.batch, "decode_positions": config.decode_positions,
                 "decode_weight": config.decode_weight,
                 "first_kl": {"prefill": first["prefill_kl"], "decode": first["decode_kl"]},
                 "last_kl": {"prefill": last["prefill_kl"], "decode": last["decode_kl"]},
                 "regrids": list(res.regrids), "log": list(res.log)}


def finetune(ctx: Any) -> Any:
    """The stage (see the module docstring); not asked: ``finetune.json`` says so."""
    from quantscope.export.kv_prefix import host_snippet
    from quantscope.finetune.engine import torch_available
    from quantscope.serde import (
        bytes_writer,
        json_writer,
        read_json,
        stats_writer,
        text_writer,
        write_atomic_set,
    )
    from quantscope.stages_llm import lm_prefix, lm_text, recorded_prefix
    from quantscope.tasks.lm_phases import calibrate_phases, evaluate_lm_plans

    opts = ctx.opts
    _clear(ctx)
    if opts.finetune is None:
        write_atomic_set([(ctx.path(FINETUNE), json_writer({"asked": False}))])
        return Done((FINETUNE,))
    if not torch_available():
        raise QuantscopeError(f"--finetune on needs PyTorch: {INSTALL}, or drop --finetune")
    start = time.perf_counter()
    spec, plan, stats = ctx.spec(), ctx.plan(), ctx.stats()
    setup = opts.phases_setup()
    windows, prompts = lm_text(spec, setup)
    tokens = recorded_prefix(plan)
    kv = lm_prefix(spec, tokens, windows)
    base = _opener(spec, kv)
    res, training = _train(ctx, base, stats, plan, kv.kv.tokens if kv else (), windows)
    tuned_spec = _write_graphs(ctx, spec, res.weights)
    tkv = lm_prefix(tuned_spec, tokens, windows)
    emulated = _opener(tuned_spec, tkv)
    ctx.say("[finetune] the tuned graphs calibrated again and measured at the evaluate "
            "stage's amounts against the original FP32 …")
    tuned_stats = calibrate_phases(emulated, windows, steps=setup.steps)
    got = evaluate_lm_plans(base, tuned_stats, {"plan": plan}, windows, prompts=prompts,
                            steps=setup.steps, new_tokens=setup.new_tokens,
                            decode_windows=setup.decode_windows, emulated=emulated)["plan"]
    before = read_json(ctx.path(EVALUATE), "evaluation")["plans"]["plan"]
    keep, why = _decision(opts.metric, before, got)
    ctx.say(f"[finetune] {why}")
    doc = {"asked": True, "kept": keep, "why": why, "metric": opts.metric,
           "figures": got, "before": before, "training": training,
           "trained_by": f"torch ({res.device})", "measured_by": "onnxruntime",
           "chosen_on": "the evaluation windows (one decision between two models)",
           "seconds": round(time.perf_counter() - start, 1)}
    if not keep:
        _clear(ctx)
        write_atomic_set([(ctx.path(FINETUNE), json_writer(doc))])
        return Done((FINETUNE,))
    items = [(ctx.path(FINETUNE), json_writer(doc)),
             *((ctx.path(TUNED_STATS[p]), stats_writer(s)) for p, s in tuned_stats.items())]
    files = [FINETUNE, TUNED_DIR, *TUNED_STATS.values()]
    if tkv is not None:
        rec = tkv.to_dict()
        items += [(ctx.path(TUNED_PREFIX_NPZ), bytes_writer(tkv.kv.to_bytes())),
                  (ctx.path(TUNED_PREFIX_PY), text_writer(host_snippet(
                      ctx.path(FINETUNE), rec["tokens"], rec["text"])))]
        files += [TUNED_PREFIX_NPZ, TUNED_PREFIX_PY]
    write_atomic_set(items)
    return Done(tuple(files))


__all__ = ["FINETUNE", "Shipped", "finetune", "kept", "shipped"]
