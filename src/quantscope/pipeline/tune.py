"""``run``'s fine-tune (``--finetune auto|off|on``), the last part of its ``repair`` stage.

==============  ========================================================================
when            ``auto`` (the default): the repaired plan's figure, measured in ORT on
                the fit data, misses ``--goal`` and PyTorch imports; ``on``: always
                (PyTorch permitting); ``off``: never
how long        what is left of ``--budget`` after the plan stage (``run.json``'s plan
                seconds), the schedule annealed by the clock; without a budget
                :data:`UNBOUNDED_STEPS` steps; under :data:`MIN_SECONDS` left, ``auto``
                does not start one and ``on`` takes :data:`MIN_SECONDS`
what            :func:`quantscope.finetune.apply.finetune_repair`: the plan's QDQ graph
                distilled against FP32 on the calibration texts (every tenth batch held
                out for its best step), on CUDA when PyTorch sees a GPU, else the CPU
kept           only when it measures better in ORT on the fit data by more than the
                noise: for a metric with per-query scores (:mod:`quantscope.tasks.
                samples`: retrieval top-1 agreement, recall@1) the one-sided
                :data:`CONFIDENCE` lower bound of the paired per-query difference
                (Student t, :func:`quantscope.plan.race.t_quantile`) is above zero; a
                metric without them (tensor SQNR, faces) must measure strictly better,
                and the record says no interval was possible. Also its fine-tuned FP32
                model, measured against the given one, must be at least as good as the
                fine-tuned plan (else the float model leans on the 8-bit grid: no
                faithful fallback; mpnet-base, docs/finetune.md)
why the fit     the fine-tune never trains on the fit pairs (it distils on calibration
data            text), so they are a fair judge; the held-out pairs stay untouched by
                the choice, so the ``evaluate`` stage's figure is not optimistic
record          :class:`TuneRecord`: an entry ``finetune`` in ``repaired.plan.json``'s
                ``repairs`` (``skipped`` says why when it was not kept; its ``note`` is
                the verdict's line); its seconds go to ``run.json`` only
==============  ========================================================================
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from quantscope.finetune.engine import torch_available
from quantscope.progress import say
from quantscope.report import fmt
from quantscope.types import Dataset, Plan, Precision, QuantscopeError

if TYPE_CHECKING:
    from quantscope.model.load import Model
    from quantscope.pipeline.context import Context
    from quantscope.repair.apply import RepairRun
    from quantscope.types import Stats

FINETUNE_MODES = ("auto", "off", "on")
MIN_SECONDS = 60.0  # less left of --budget than this: auto does not start a fine-tune
MAX_STEPS = 3000  # the schedule's length under a time budget (on a CPU the clock ends it first)
UNBOUNDED_STEPS = 300  # --budget none: the fine-tune repair's default length
CONFIDENCE = 0.95
INSTALL = "pip install 'quantscope[finetune]'"


@dataclass(frozen=True)
class TuneRecord:
    """What the run's fine-tune did (``repaired.plan.json``, entry ``finetune`` of
    ``repairs``); ``seconds`` is wall clock: :meth:`to_dict` gives it, the repair step
    moves it to ``run.json``."""

    mode: str
    tried: bool
    kept: bool
    why: str  # why it was (not) tried, kept or dropped, in words
    metric: str | None = None
    engine: str | None = None  # torch's device: cpu or cuda
    steps: int | None = None
    best_step: int | None = None
    fit_before: float | None = None  # the repaired plan, in ORT, on the fit data
    fit_after: float | None = None  # the fine-tuned plan, the same way
    fp32_drift: float | None = None  # its fine-tuned FP32 model against the given one
    difference: float | None = None  # mean paired per-query difference (after - before)
    lower_bound: float | None = None  # its one-sided CONFIDENCE lower bound
    samples: int | None = None  # queries in the interval
    seconds: float | None = None
    note: str = ""  # the verdict's line

    def to_dict(self) -> dict[str, Any]:
        """The ``repairs`` entry (``name``, ``reason``, ``skipped`` as every repair's)."""
        body = {k: (round(v, 6) if isinstance(v, float) else v)
                for k, v in dataclasses.asdict(self).items()}
        return {"name": "finetune", "reason": self.note,
                "skipped": None if self.kept else self.why, **body}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> TuneRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


@dataclass(frozen=True)
class Tuned:
    """The repair stage's final model (None: the repairs' own, unchanged), stats and plan,
    the record, and the wall-clock figures for ``run.json`` (the seconds allowed)."""

    model: Model | None
    stats: Stats
    plan: Plan
    record: TuneRecord
    timings: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Figure:
    """One measurement on the fit data: the metric and, where it has one, its per-query
    scores (``top1_agreement`` is their mean)."""

    value: float
    samples: np.ndarray | None = None


def finetune_config(seconds: float | None) -> Any:
    """The run's fine-tune settings (the learning rates of docs/finetune.md's measured
    runs: weights 2e-5, activation grids 2e-2); ``seconds``: the time budget."""
    from quantscope.finetune.distill import FinetuneConfig

    return FinetuneConfig(steps=UNBOUNDED_STEPS if seconds is None else MAX_STEPS,
                          eval_every=20, range_lr=2e-2, max_seconds=seconds)


def budget_left(ctx: Context) -> float | None:
    """Seconds of ``--budget`` the plan stage left (its seconds in ``run.json``); None:
    no budget."""
    from quantscope.pipeline.manifest import Manifest

    if ctx.opts.budget is None:
        return None
    spent = Manifest(ctx.folder).stages.get("plan", {}).get("seconds", 0.0)
    return max(float(ctx.opts.budget) - float(spent or 0.0), 0.0)


def paired_bound(before: np.ndarray, after: np.ndarray,
                 confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(mean, one-sided ``confidence`` lower bound) of the paired per-query differences
    ``after - before`` (Student t on ``n - 1`` degrees of freedom)."""
    from quantscope.plan.race import t_quantile

    d = np.asarray(after, np.float64) - np.asarray(before, np.float64)
    if d.size < 2:
        return float(d.mean()) if d.size else 0.0, -math.inf
    half = t_quantile(confidence, d.size - 1) * float(np.std(d, ddof=1)) / math.sqrt(d.size)
    return float(d.mean()), float(d.mean()) - half


def decide(before: Figure, after: Figure, drift: float | None, *, metric: str,
           higher_is_better: bool = True) -> tuple[bool, str, dict[str, Any]]:
    """(kept, why, interval fields) of a fine-tune measured ``before`` -> ``after`` on the
    fit data (module docstring); ``drift``: its FP32 model against the given one."""
    better = (lambda a, b: a > b) if higher_is_better else (lambda a, b: a < b)
    fields: dict[str, Any] = {}
    change = f"{_fig(metric, before.value)} -> {_fig(metric, after.value)}"
    if before.samples is not None and after.samples is not None:
        mean, low = paired_bound(before.samples, after.samples)
        fields = {"difference": mean, "lower_bound": low, "samples": int(before.samples.size)}
        interval = (f"paired {CONFIDENCE:.0%} lower bound {_pts(metric, low)} on "
                    f"{before.samples.size} fit queries")
        if not low > 0:
            return False, (f"fit {change}: {_pts(metric, mean)}, not above the noise "
                           f"({interval})"), fields
        why = f"fit {change}, above the noise ({interval})"
    else:
        if not better(after.value, before.value):
            return False, f"fit {change}: not better", fields
        why = (f"fit {change} ({metric} has no per-query scores: judged by the figure, no "
               "noise interval)")
    if drift is not None and better(after.value, drift):
        return False, (f"{why}, but its fine-tuned FP32 model measures "
                       f"{_fig(metric, drift)} against the given model, below the plan: the "
                       "float model leans on the low-bit grid and is no faithful fallback"), \
            fields
    return True, why, fields


def _fig(metric: str, v: float | None) -> str:
    """A figure in its metric's unit, as the report and the verdict show it (``report.fmt``:
    a share of the samples in percent, dB with its unit)."""
    return "n/a" if v is None else fmt.value(metric, v)


def _pts(metric: str, v: float) -> str:
    return f"{100 * v:+.1f} points" if fmt.is_share(metric) else fmt.gain(metric, v)


class FitMeasure:
    """Plans measured in ORT on the fit data against the given FP32 model, which runs
    once: per-query scores where the metric has them, else the metric of
    ``evaluate_plans``."""

    def __init__(self, reference: Model, data: Dataset, metric: str) -> None:
        from quantscope.tasks.registry import RetrievalTask
        from quantscope.tasks.samples import SAMPLE_SCORES

        self.reference, self.data, self.metric = reference, data, metric
        self.paired = isinstance(data.task, RetrievalTask) and metric in SAMPLE_SCORES
        self._ref: Any = None

    def _runner(self, proto: Any) -> tuple[np.ndarray, np.ndarray]:
        from quantscope.stages.race import PairRunner

        task = self.data.task
        return PairRunner(proto, task, np.arange(task.n_pairs)).upto(task.n_pairs)

    def _reference(self) -> Any:
        if self._ref is None:
            if self.paired:
                self._ref = self._runner(self.reference.proto)
            else:
                from quantscope.emulate.evaluate import run_model

                self._ref = run_model(self.reference.proto, list(self.data.evaluation))
        return self._ref

    def plan(self, model: Model, stats: Stats, plan: Plan) -> Figure:
        """``plan`` on ``model`` (its QDQ graph by the one writer)."""
        if self.paired:
            from quantscope.emulate.qdq import quantize_model, scheme_for

            return self._samples(quantize_model(model, stats, plan,
                                                scheme=scheme_for(plan)).proto)
        from quantscope import stages

        res = stages.evaluate_plans(model, self.data, stats, {"p": plan}, saturation=False,
                                    reference_outputs=self._reference())["p"]
        return Figure(float(res["metrics"][self.metric]))

    def fp32(self, model: Model, stats: Stats) -> Figure:
        """``model``'s own FP32 function against the reference."""
        if self.paired:
            return self._samples(model.proto)
        return self.plan(model, stats, Plan.uniform(Precision.FLOAT))

    def _samples(self, proto: Any) -> Figure:
        from quantscope.tasks.samples import prefix_samples

        n = self.data.task.n_pairs
        s = prefix_samples(self.metric, self._reference(), self._runner(proto), n)
        return Figure(float(s.mean()), s)


def tune(ctx: Context, repaired: RepairRun, feeds: Sequence[dict[str, np.ndarray]]) -> Tuned:
    """The repair stage's fine-tune of the repairs' result (module docstring); ``feeds``:
    the repair batches (the fine-tuned model is calibrated on them, as the repairs' is)."""
    from quantscope.model.load import load_proto

    mode = ctx.opts.finetune
    head = ctx.headline()
    metric = head.metric
    stats, plan = repaired.stats, repaired.plan

    def skip(why: str, **kw: Any) -> Tuned:
        note = f"no fine-tune: {why}"
        say(f"finetune: {why}", show=ctx.progress)
        return Tuned(None, stats, plan, TuneRecord(mode, False, False, why, metric=metric,
                                                   note=note, **kw))

    if mode == "off":
        return skip("--finetune off")
    if not torch_available():
        return skip(f"PyTorch is not installed ({INSTALL} to fine-tune where the goal is "
                    "missed)")
    if mode == "auto" and ctx.opts.goal is None:
        return skip("no --goal to miss (--finetune on fine-tunes anyway)")
    # decided before anything is loaded or measured: on mpnet-base the measuring alone
    # (the repaired model loaded again, FP32 and the plan on the fit pairs) took the
    # stage from 1.0 to 3.8 GB for a fine-tune that was then skipped
    lengths = lengths_decided(ctx) if mode == "auto" else None
    if lengths is not None:
        return skip(f"the deploy stage chooses compiled lengths ({lengths}); its other "
                    "candidates are not fine-tuned, so this plan's fine-tune would ship only "
                    "where one model is kept (--finetune on fine-tunes it anyway)")
    fit = ctx.data().fit
    model = load_proto(repaired.proto, ctx.model().source)
    measure = FitMeasure(ctx.model(), fit, metric)
    before = measure.plan(model, stats, plan)
    goal = ctx.opts.goal
    if mode == "auto" and goal is not None and head.reached(before.value, goal):
        return skip(f"the plan reaches {fmt.goal(metric, goal, head.higher_is_better)} on the "
                    f"fit data ({_fig(metric, before.value)})", fit_before=before.value)
    batches = len(fit.calibration)
    if batches < 2:
        return skip(f"the fit data gives {batches} calibration batch(es) and the fine-tune "
                    "needs at least 2 (one is held out for its best step): give more data",
                    fit_before=before.value)
    left = budget_left(ctx)
    if left is not None and left < MIN_SECONDS:
        if mode == "auto":
            return skip(f"{left:.0f} s of --budget left after the plan search (under "
                        f"{MIN_SECONDS:.0f} s): give a larger --budget",
                        fit_before=before.value)
        left = MIN_SECONDS
    try:
        return _finetune(ctx, model, stats, plan, feeds, measure, before, left)
    except QuantscopeError as e:  # e.g. an op the torch interpreter lacks: said, not fatal
        return skip(f"the fine-tune could not run: {e}", fit_before=before.value)


def lengths_decided(ctx: Context) -> str | None:
    """The deploy stage's decision (:func:`quantscope.stages.lengths.decide_lengths`, the
    same inputs) when it will choose among compiled lengths, in words; else None."""
    from quantscope.pipeline.data import widest_text_batch
    from quantscope.stages.lengths import decide_lengths

    o = ctx.opts
    mode = o.length_choice()
    fit = ctx.data().fit
    if mode is None or fit.token_lengths is None:
        return None
    decision = decide_lengths(ctx.model(), ctx.target(), fit.token_lengths,
                              longest=o.seq_len or widest_text_batch(fit), given=mode or None)
    return decision.reason if decision.buckets else None


def _finetune(ctx: Context, model: Model, stats: Stats, plan: Plan,
              feeds: Sequence[dict[str, np.ndarray]], measure: FitMeasure, before: Figure,
              seconds: float | None) -> Tuned:
    from quantscope.calibrate.collect import calibrate
    from quantscope.finetune.apply import finetune_repair
    from quantscope.finetune.distill import resolve_device
    from quantscope.model.groups import find_groups
    from quantscope.model.load import load_proto

    mode, metric, head = ctx.opts.finetune, measure.metric, ctx.headline()
    fit = ctx.data().fit
    device = resolve_device(None).type
    why = ("the goal is missed on the fit data" if mode == "auto" else "--finetune on")
    limit = "no time bound (--budget none)" if seconds is None else \
        f"up to {seconds / 60:.1f} min (what is left of --budget)"
    say(f"finetune: {why} ({metric} {_fig(metric, before.value)}): fine-tuning for {limit} "
        f"on {device}, distilled on {sum(len(next(iter(b.values()))) for b in fit.calibration)} "
        f"calibration {'texts' if fit.token_lengths is not None else 'samples'}",
        show=ctx.progress)
    start = time.perf_counter()
    data = Dataset(name="calibration", calibration=tuple(fit.calibration), evaluation=(),
                   task=fit.task)
    tuned, tplan, result = finetune_repair(model, data, stats, plan,
                                           config=finetune_config(seconds),
                                           scheme=ctx.target().scheme, progress=ctx.progress)
    tuned = load_proto(tuned.proto, model.source)
    tstats = calibrate(tuned, find_groups(tuned), iter(feeds), method=stats.method)
    summary = (f"finetune: {result.steps} steps on {result.device}, best step "
               f"{result.best_step}; distillation held-out {result.metric} "
               f"{result.holdout_before:.5g} -> {result.holdout_best:.5g}")
    meta = (*[(k, v) for k, v in tplan.meta if k not in ("finetune", "repairs")],
            ("repairs", ",".join([r for r in dict(plan.meta).get("repairs", "").split(",")
                                  if r] + ["finetune"])), ("finetune", summary))
    tplan = dataclasses.replace(tplan, meta=meta)
    say("finetune: measuring the fine-tuned plan and its FP32 model on the fit data",
        show=ctx.progress)
    after = measure.plan(tuned, tstats, tplan)
    drift = measure.fp32(tuned, tstats)
    kept, reason, interval = decide(before, after, drift.value, metric=metric,
                                    higher_is_better=head.higher_is_better)
    seconds_taken = time.perf_counter() - start
    common = {"metric": metric, "engine": result.device, "steps": result.steps,
              "best_step": result.best_step, "fit_before": before.value,
              "fit_after": after.value, "fp32_drift": drift.value, "seconds": seconds_taken,
              **interval}
    timings = {"finetune_budget_s": None if seconds is None else round(seconds, 1),
               "finetune_training_s": round(result.seconds, 1)}
    if kept:
        note = (f"fine-tuned ({result.steps} steps on {result.device}): {reason}; its FP32 "
                f"weights differ from the given model's (its FP32 model measures "
                f"{_fig(metric, drift.value)} against it): compile repaired.onnx")
        say(f"finetune: kept: {reason}", show=ctx.progress)
        return Tuned(tuned, tstats, tplan, TuneRecord(mode, True, True, reason, note=note,
                                                      **common), timings)
    note = f"fine-tune dropped: {reason}; the plan is the one without it"
    say(f"finetune: dropped: {reason}", show=ctx.progress)
    return Tuned(None, stats, plan, TuneRecord(mode, True, False, reason, note=note,
                                               **common), timings)
