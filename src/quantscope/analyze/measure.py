"""Measuring a plan by real emulation: the QDQ graph of a plan, its fidelity and task
metrics against FP32 (one FP32 run for several plans), the saturation check, each
output's channel axis, and the headline metric and analysis scorer of a data set.

Moved here from ``quantscope.stages`` (which re-exports every name).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from quantscope.analyze.evalcache import model_digest
from quantscope.analyze.inputfloor import floor_notes
from quantscope.analyze.saturation_rows import (  # noqa: F401 - stages re-exports them
    SATURATION_ROWS,
    _saturation_entry,
    _saturation_stats,
    saturation_batches,
)
from quantscope.emulate.channels import TopClasses, restated
from quantscope.emulate.class_axes import ClassAxis
from quantscope.emulate.evaluate import (
    Runs,
    compare_model,
    compare_models,
    kept,
    kept_only,
    open_runs,
    run_kept,
    run_model,
    scale_error,
)
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.load import Model
from quantscope.progress import track
from quantscope.serde import plan_to_dict
from quantscope.tasks.db_noise import Parts, pooled_db
from quantscope.tasks.headline import Headline
from quantscope.tasks.left_out import left_out_figures, unit_parts
from quantscope.tasks.reads import outputs_read
from quantscope.types import (
    Batch,
    Dataset,
    Encodings,
    Metrics,
    Outputs,
    Plan,
    QuantScheme,
    QuantscopeError,
    RowScoring,
    Stats,
)

if TYPE_CHECKING:
    from quantscope.analyze.incremental import IncrementalEngine
    from quantscope.emulate.coverage import Coverage


def output_channel_axes(model: Model, batches: Sequence[Batch] = ()) -> dict[str, int]:
    """Each output's channel axis as the graph tells it (:mod:`quantscope.model.axes`), as
    the scorers see the output: sample-first (an output whose samples lie on axis ``a`` of
    a :class:`Feeds` batch is moved there first, so a channel axis before ``a`` shifts by
    one; an output whose channel axis is its sample axis gets none)."""
    from quantscope.model.axes import output_channel_axes as graph_axes

    axes = graph_axes(model)
    moved = getattr(next(iter(batches), None), "out_axes", ()) or ()
    out = {}
    for i, name in enumerate(model.output_names()):
        if name not in axes:
            continue
        c, a = axes[name], moved[i] if i < len(moved) else 0
        if c == a and a:
            continue
        out[name] = c + 1 if c < a else c
    return out

def output_symbolic_axes(model: Model, batches: Sequence[Batch] = ()
                         ) -> dict[str, dict[int, str]]:
    """Each output's axes whose length the model leaves open (a ``dim_param``: frames
    ``'F'``, tokens ``'T'``; ``'?'`` an unknown dim) as the scorers see the output,
    sample-first (moved as :func:`output_channel_axes` moves the graph's axis), its
    samples' axis left out: positions the per-channel figures do not read as channels
    (:func:`quantscope.emulate.class_axes.read_axis`). An output declared without a
    shape tells none."""
    shapes = model.value_shapes()
    moved = getattr(next(iter(batches), None), "out_axes", ()) or ()
    out = {}
    for i, name in enumerate(model.output_names()):
        dims = list(shapes.get(name) or ())
        a = moved[i] if i < len(moved) else 0
        if not 0 <= a < len(dims):
            continue
        first = [dims.pop(a), *dims]
        open_dims = {k: d if isinstance(d, str) else "?" for k, d in enumerate(first)
                     if k and not isinstance(d, int)}
        if open_dims:
            out[name] = open_dims
    return out


def top_classes(data: Dataset) -> dict[str, TopClasses]:
    """The outputs the data's task decides by their top class (class scores, CTC steps,
    pitch bins): the per-channel check judges only the classes that decide something
    (:class:`quantscope.emulate.channels.TopClasses`)."""
    tops = getattr(data.task, "top_classes", None)
    return dict(tops()) if tops is not None else {}


def class_axes(data: Dataset) -> dict[str, ClassAxis]:
    """The outputs whose task tells the axis it reads their classes on (CTC steps' classes,
    class scores, pitch bins, a detector's rows): the per-channel figures read that axis,
    not the graph's (:mod:`quantscope.emulate.class_axes`)."""
    claims = getattr(data.task, "class_axes", None)
    return dict(claims()) if claims is not None else {}


def qdq_for_plan(
    model: Model,
    stats: Stats,
    plan: Plan,
    *,
    method: str | None = None,
    scheme: QuantScheme | None = None,
) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """The QDQ model for a plan (in its target's scheme), and the notes the encoder made.

    ``scheme`` applies only to a plan that names no target (see :func:`scheme_for`).
    """
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan, scheme), method=method)
    return q.proto, (*q.notes, *q.coverage.lines())


def evaluate_plan(
    model: Model,
    data: Dataset,
    stats: Stats,
    plan: Plan,
    *,
    method: str | None = None,
    scheme: QuantScheme | None = None,
    progress: bool = False,
    reference: Model | None = None,
    reference_outputs: Outputs | None = None,
    saturation: bool = True,
    engine: IncrementalEngine | None = None,
    only: str | None = None,
    reference_kept: Outputs | None = None,
    sample_parts: bool = False,
    left_out: Sequence[str] = (),
) -> dict[str, Any]:
    """Fidelity (and task metrics when the data has a task) of ``plan`` against FP32.

    The graph measured is :func:`qdq_for_plan`'s, the one ``export-qdq`` writes (run by
    segments with an ``engine``; ``only``: just that metric where it can be scored
    alone, from ``reference_kept`` when given; ``sample_parts``, ``left_out``:
    :func:`evaluate_plans`).
    """
    return evaluate_plans(model, data, stats, {"emulated": plan}, method=method, scheme=scheme,
                          saturation=saturation, engine=engine, only=only,
                          progress=progress, reference=reference,
                          reference_outputs=reference_outputs,
                          reference_kept=reference_kept, sample_parts=sample_parts,
                          left_out=left_out)["emulated"]


def evaluate_plans(
    model: Model,
    data: Dataset,
    stats: Stats,
    plans: dict[str, Plan],
    *,
    method: str | None = None,
    scheme: QuantScheme | None = None,
    progress: bool = False,
    reference: Model | None = None,
    reference_outputs: Outputs | None = None,
    saturation: bool = True,
    error_scales: Sequence[float] = (),
    engine: IncrementalEngine | None = None,
    only: str | None = None,
    reference_kept: Outputs | None = None,
    task_only: bool = False,
    own_outputs: bool = False,
    sample_parts: bool = False, left_out: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    """Like :func:`evaluate_plan` for several plans, running the FP32 model only once.

    ``error_scales`` (task data only): also the task metrics of each plan's error scaled
    by each factor (:func:`quantscope.emulate.evaluate.scale_error`), under
    ``"error_scales"``: how much smaller the error would have to be for a goal.

    ``saturation``: also calibrate (up to ``SATURATION_ROWS`` of) the evaluation rows and
    report, per plan, the tensors whose values leave their calibrated range.

    ``reference`` is the FP32 model the metrics compare against (default: ``model``); a
    repaired model is compared with the original, since bias correction changes FP32.
    ``reference_outputs`` (its outputs on ``data.evaluation``) skips even that one run.
    ``own_outputs``: the caller computed those outputs from ``model`` itself (not another
    model's: the fine-tune's drift compares with the given model), so a plan quantizing
    nothing reads them instead of a second pass of the same graph.

    ``engine``: the incremental evaluator of the plans of one search
    (:mod:`quantscope.analyze.incremental`; the same numbers within 1e-6, each plan run
    from its first changed segment); each result then says under ``"engine"`` which
    engine measured it, and a plan it cannot run (another model, no cut) gets a full pass
    and the note why. Without one, every plan is one full pass, as before.

    ``reference_kept``: the FP32 outputs reduced to what the task keeps of them
    (:func:`reference_kept_outputs`): enough for ``only`` where the task scores it alone,
    or for ``task_only`` (every task figure, no output fidelity: :func:`_kept_scorer`), so
    no per-token reference is held; else the FP32 outputs are computed here.
    ``sample_parts``: also ``"sample_parts"``, the per-sample powers (:func:`figure_parts`);
    ``left_out``: those task figures per unit left out (``tasks.left_out``: a share's noise).
    """
    batches = list(data.evaluation)
    data_stats, n_rows = _saturation_stats(model, batches) if saturation else (None, 0)
    keep = getattr(data.task, "keep", None)  # what the task reads of each batch's outputs
    alone, note = _kept_scorer(data, only, task_only, bool(error_scales),
                               reference_kept is not None)
    ref, ref_kept, own = _references(
        model, batches, keep, reference, reference_outputs, own_outputs,
        reference_kept if alone is not None else None,
        lockstep=reference_outputs is None and len(plans) == 1 and engine is None,
        progress=progress)
    results: dict[str, dict[str, Any]] = {}
    for label, plan in plans.items():
        emulated, enc, cov, measured_by = _emulated(model, stats, plan, batches, engine, scheme=scheme,
                                                    method=method, label=label if progress else "",
                                                    same=own)
        coverage, saturated = cov.to_dict(), _saturation_entry(data_stats, enc, n_rows)
        q_notes = (*enc.notes, *measured_by[1:],
                   *floor_notes(model, stats, plan, scheme))  # a spectrogram's Log, input
        del enc
        if alone is not None and ref_kept is not None:
            results[label] = _alone_result(
                model, data, stats, plan, method, alone(ref_kept, _kept_runs(emulated, keep)),
                {"coverage": coverage, **saturated, **(
                    {"engine": measured_by[0]} if engine is not None else {})}, [*q_notes, note])
            continue
        results[label] = _scored(model, data, stats, plan, batches, emulated, ref, ref_kept,
                                 keep, reference=reference, method=method, error_scales=error_scales,
                                 head={"coverage": coverage, **saturated}, q_notes=q_notes,
                                 measured_by=measured_by[0] if engine is not None else None,
                                 sample_parts=sample_parts, left_out=left_out)
    return results


def _alone_result(model: Model, data: Dataset, stats: Stats, plan: Plan, method: str | None,
                  metrics: dict[str, float], head: dict[str, Any], notes: list[str]
                  ) -> dict[str, Any]:
    """One plan's result scored for one metric alone (no output tables)."""
    return {"model": model.source, "data": data.name, "plan": plan_to_dict(plan),
            "method": method or stats.method, "metrics": metrics, "outputs": {}, **head,
            "notes": [*model.notes, *data.notes, *notes]}


def _kept_runs(emulated: Runs, keep: Any) -> Outputs:
    """Emulated runs reduced batch by batch to what the task keeps (``keep``)."""
    return Outputs(names=emulated.names, batches=tuple(
        t if keep is None else keep(t, b) for t, b in emulated.batches))


def _references(model: Model, batches: list[Batch], keep: Any, reference: Model | None,
                given: Outputs | None, own_outputs: bool, given_kept: Outputs | None, *,
                lockstep: bool, progress: bool
                ) -> tuple[Outputs | None, Outputs | None, Outputs | None]:
    """:func:`evaluate_plans`' FP32 outputs: (whole, kept, ``model``'s own). The kept ones
    given (a metric scored alone) hold no whole outputs; with ``lockstep`` (one plan, no
    engine) the FP32 model runs beside the plan instead (None here). The own outputs are
    those computed here, or given with ``own_outputs`` (given ones may be another model's:
    the fine-tune's drift)."""
    if given_kept is not None:
        return None, given_kept, None
    ref = given or (None if lockstep else run_model(
        (reference or model).proto, batches, label="fp32" if progress else ""))
    own = ref if (given is None or own_outputs) and reference in (None, model) else None
    return ref, None if ref is None else kept(ref, batches, keep), own


def _kept_scorer(data: Dataset, only: str | None, task_only: bool, scaled: bool,
                 has_kept: bool) -> tuple[Any, str]:
    """``(ref_kept, test_kept) -> metrics`` scoring the kept outputs alone, and its note:
    every task figure (``task_only``: ``data.task.metrics`` on the kept outputs, the same
    floats as the full scoring's task figures, each plan's outputs reduced batch by batch
    as they come; the run's auto choice of the rewrites reads a metric and its tie-break),
    or ``only`` where the task scores it that way; ``(None, "")`` where the full scoring
    is needed."""
    if task_only and (not has_kept or scaled or getattr(data.task, "keep", None) is None):
        raise ValueError("task_only needs reference_kept, no error_scales and a task that "
                         "keeps part of its outputs")
    if task_only:
        return (lambda ref, test: dict(data.task.metrics(ref, test).values)), TASK_ONLY_NOTE
    one = None if only is None or scaled else scored_alone(data, only)
    if one is None:
        return None, ""
    return one, ONLY_NOTE.format(only)  # the metric and the items it is a share over


def _scored(model: Model, data: Dataset, stats: Stats, plan: Plan, batches: list[Batch],
            emulated: Runs, ref: Outputs | None, ref_kept: Outputs | None, keep: Any, *,
            reference: Model | None, method: str | None, error_scales: Sequence[float],
            head: dict[str, Any], q_notes: tuple[str, ...], measured_by: str | None,
            sample_parts: bool = False, left_out: Sequence[str] = ()) -> dict[str, Any]:
    """One plan's result with every metric: output fidelity and the task's figures
    (``sample_parts``: :func:`evaluate_plans`)."""
    # raw outputs judged unless a task reads them its own way (text: padded tokens);
    # a row-local output task (detections, maps) reads the raw outputs themselves
    judge = data.task is None or getattr(data.task, "row_local", False)
    score: dict[str, Any] = {"keep": keep, "only": data.output, "judge": judge,
                             "channel_axes": output_channel_axes(model, batches),
                             "symbolic_axes": output_symbolic_axes(model, batches),
                             "top_classes": top_classes(data),
                             "class_axes": class_axes(data),
                             "per_sample": sample_parts,
                             # only what the task's figures read is kept (h74)
                             "kept_names": outputs_read(data.task)}
    if ref is None:
        fp32 = open_runs((reference or model).proto, batches)
        fid, ref_kept, test = compare_models(fp32, emulated, **score)
    else:
        fid, test = compare_model(emulated, ref, **score)
        if ref_kept is not None:  # the same outputs as the plan's, in the same order
            pick = kept_only(ref_kept.names, score["kept_names"])
            ref_kept = Outputs(pick(ref_kept.names), tuple(map(pick, ref_kept.batches)))
    metrics, tables, task_notes = dict(fid.values), dict(fid.tables), fid.notes
    scaled: dict[str, Any] = {}
    if data.task is not None:
        tm = data.task.metrics(ref_kept, test)
        metrics.update(tm.values)
        tables.update(tm.tables)
        task_notes = (*task_notes, *(n for n in tm.notes if not restated(n, fid.notes)))
        if error_scales:
            scaled = {"error_scales": [
                {"scale": float(f), **data.task.metrics(
                    ref_kept, scale_error(ref_kept, test, f)).values}
                for f in error_scales]}
    return {
        "model": model.source, "data": data.name, "plan": plan_to_dict(plan),
        "method": method or stats.method, "metrics": metrics, "outputs": tables,
        **head, **scaled, **({"engine": measured_by} if measured_by is not None else {}),
        "notes": [*model.notes, *data.notes, *q_notes, *task_notes],
        **({"sample_parts": kept_parts(figure_parts(data, fid, ref_kept, test), metrics)}
           if sample_parts else {}),
        **({"left_out": left_out_figures(data.task, ref_kept, test, left_out)}
           if left_out and data.task is not None and ref_kept is not None else {}),
    }


def figure_parts(data: Dataset, fid: Metrics, ref_kept: Outputs | None, test: Outputs
                 ) -> dict[str, Any]:
    """The per-sample powers of the fidelity figures in dB and of the task's (its
    ``sample_parts``: a text retrieval's embedding SQNR per pair, an image's PSNR per
    sample, a face verification's and image views' embedding SQNR per face and per photo,
    an embedding's per sample, an image output's ``psnr_db:OUTPUT``): the one source of
    the noise the planner's choice (:mod:`quantscope.plan.pareto`), a torch ranking
    (:func:`quantscope.finetune.rank.score_runs`) and ``run``'s held-out check read. Each
    summed per unit of the data (:func:`quantscope.tasks.left_out.unit_parts`: on face
    data per person, a person's photos being no independent samples; elsewhere as
    measured), so every noise read from them leaves out one unit at a time."""
    out = dict(fid.parts)
    task_parts = getattr(data.task, "sample_parts", None)
    if task_parts is not None and ref_kept is not None:
        out.update(task_parts(ref_kept, test))
    return {k: unit_parts(p if isinstance(p, Parts) else Parts(*p, "samples"), data.task)
            for k, p in out.items()}


def kept_parts(parts: Mapping[str, Any], metrics: Mapping[str, float]
               ) -> dict[str, Parts]:
    """The per-sample powers whose pooled figure is the metric reported under the same
    key (within 1e-6 dB: a task's figure of the same name, or an infinite one, is not
    theirs), as :class:`quantscope.tasks.db_noise.Parts` (a bare pair: over samples)."""
    out: dict[str, Parts] = {}
    for key, given in parts.items():
        got = given if isinstance(given, Parts) else Parts(*given, "samples")
        with np.errstate(divide="ignore", invalid="ignore"):
            pooled = pooled_db(got)
        if key in metrics and np.isfinite(pooled) and abs(pooled - metrics[key]) <= 1e-6:
            out[key] = got
    return out


def reference_kept_outputs(model: Model, data: Dataset, *, label: str = "") -> Outputs:
    """The FP32 outputs of ``model`` on ``data.evaluation``, each batch reduced to what the
    task keeps as it comes (the pooled rows of text data): no per-token outputs are held,
    for :func:`evaluate_plans`' ``reference_kept``. Without a ``keep`` the outputs whole."""
    return run_kept(model.proto, list(data.evaluation), getattr(data.task, "keep", None),
                    label=label)


TASK_ONLY_NOTE = ("scored: the task's figures only, on the outputs it keeps (no output "
                  "fidelity figures)")
ONLY_NOTE = ("scored: {} only (what the ranking reads); the plan's other figures are "
             "measured in full by evaluate")


def scored_alone(data: Dataset, metric: str) -> Any:
    """``(ref, test) -> {metric: value, KEY_items: queries}`` on kept outputs, by the
    per-query scores, where the task scores ``metric`` that way (retrieval pairs); else
    None (every metric is scored)."""
    from quantscope.tasks.registry import RetrievalTask
    from quantscope.tasks.samples import SAMPLE_SCORES, whole_set_figures

    task = data.task
    if not isinstance(task, RetrievalTask) or metric not in SAMPLE_SCORES:
        return None
    return lambda ref, test: whole_set_figures(metric, task.embeddings(ref),
                                               task.embeddings(test))


def _emulated(model: Model, stats: Stats, plan: Plan, batches: list[Batch],
              engine: IncrementalEngine | None, *, scheme: QuantScheme | None,
              method: str | None, label: str, same: Outputs | None = None,
              ) -> tuple[Runs, Encodings, Coverage, tuple[str, ...]]:
    """The plan's emulated runs (not run yet), its encodings and coverage, and which engine
    measures it (then the note why a full pass, if one is): the engine's runner when it
    has one for the plan, else the full QDQ graph (:func:`quantize_model`). ``same``: the
    FP32 outputs of ``model`` on ``batches``, which a plan quantizing nothing (its QDQ graph
    the model's own, byte for byte: the demo's and run's ``fp32`` row) reads instead of a
    second pass of the same graph."""
    sch = scheme_for(plan, scheme)
    runner, why = (None, None) if engine is None else engine.runner(model, stats, sch)
    if runner is None:
        q = quantize_model(model, stats, plan, scheme=sch, method=method)
        if same is not None and not q.encodings.activations and not q.encodings.weights \
                and model_digest(q.proto) == model_digest(model.proto):
            return (Runs(names=same.names, batches=zip(same.batches, batches, strict=True)),
                    q.encodings, q.coverage, ("ort (full pass)", SAME_NOTE))
        runs, enc, cov = open_runs(q.proto, batches, label), q.encodings, q.coverage
        del q  # the session holds the graph: the QDQ proto's weights go before the runs
        return runs, enc, cov, ("ort (full pass)", *((why,) if why else ()))
    enc, cov = runner.encodings(plan)
    before = runner.counts
    it = runner.iterate(plan, enc)
    first = next(it, None)  # the plan's segments are run from here: count them now
    done = runner.counts.minus(before)
    rest = track(it, label, total=max(len(batches) - 1, 0), unit="batch", show=bool(label))
    head = [] if first is None else [first]
    return (Runs(names=model.output_names(), batches=itertools.chain(head, rest)), enc, cov,
            (done.engine,))


SAME_NOTE = ("this configuration quantizes nothing (its graph is the model's own): its outputs "
             "are the FP32 pass's, not a second run of the same graph")

def default_metric(data: Dataset | None) -> str:
    """The measured metric a plan is judged by when the user names none: the data's
    task's headline (:func:`quantscope.tasks.headline.headline_of`)."""
    return headline(data).metric


CHECK_PAIRS = 4
"""Text pairs ``--metric`` is checked on (:func:`check_metric`)."""


def check_metric(model: Model, data: Dataset, metric: str) -> None:
    """Refuse ``--metric NAME`` that a plan's measurement on ``data`` does not give, in one
    line naming those it gives, before any work: the keys of :func:`_scored` (output
    fidelity and the task's figures) with FP32 scored against itself, on the first
    evaluation batch where the task reads each sample alone (or there is none), else on
    every one (a retrieval task's figures need its pairs). The data's headline needs no
    run. ``run --metric bogus`` was found at the plan stage, after calibrate and analyze
    had written their files. Text pairs are scored on their first few pairs (the task on
    them gives the same figures): every pair's FP32 pass cost ``run --metric`` on
    minilm-l3 10 s before the run folder existed."""
    from quantscope.tasks.registry import first_pairs, text_task

    if metric == headline(data).metric:
        return
    task = data.task
    batches = list(data.evaluation)
    text = text_task(task)
    if text is not None:
        task = first_pairs(text, CHECK_PAIRS)
        batches = list(task.batches.batches)
    elif task is None or getattr(task, "row_local", False):
        batches = batches[:1]
    keep = getattr(task, "keep", None)
    ref = run_model(model.proto, batches)
    runs = Runs(names=ref.names, batches=iter(zip(ref.batches, batches, strict=True)))
    with np.errstate(all="ignore"):
        fid, test = compare_model(runs, ref, keep=keep, only=data.output,
                                  judge=task is None or getattr(task, "row_local", False),
                                  channel_axes=output_channel_axes(model, batches),
                                  symbolic_axes=output_symbolic_axes(model, batches),
                                  top_classes=top_classes(data),
                                  class_axes=class_axes(data))
        figures = set(fid.values)
        if task is not None:
            figures |= set(task.metrics(kept(ref, batches, keep), test).values)
    if metric not in figures:
        raise QuantscopeError(f"--metric '{metric}' is no figure of this data's task: "
                              f"use one of {', '.join(sorted(figures))}")


def headline(data: Dataset | None, metric: str | None = None) -> Headline:
    """The headline metric (key, direction, goal range, unit) of ``data``, or of the
    ``metric`` the user named."""
    from quantscope.tasks.headline import headline_of

    return headline_of(None if data is None else data.task, metric)


FIDELITY_PRIMARIES = ("sqnr_db_channel_min", "sqnr_db", "cosine_mean")
"""What the fidelity scorer can rank by (every one is in each of its scores)."""


def _ranked_by(rows: RowScoring, metric: str | None) -> RowScoring:
    """A row-local task scoring ranked by ``metric`` (``--metric``) when that is a known
    task figure other than the headline, in its own direction: ``--metric char_error_rate``
    (lower is better) on a ctc task was searched in string_agreement's direction, so the
    plan chosen was the one of the highest error rate (2.2 % at 1.0x while a 4.9x plan
    measured 0 %) and the goal said 'no promotion left'; ``--metric class_iou_min`` (the
    headline's direction) was ranked by ``top1_agreement``, so the plan's predictions and
    per-group reasons named the headline while its plans were measured by the class IoU.
    The search compares its predictions with the measured figures: the analysis' metric is
    the measured one."""
    from quantscope.tasks.headline import KNOWN_METRICS

    known = KNOWN_METRICS.get(metric or "")
    if not rows.row_local or metric is None or metric == rows.primary or known is None:
        return rows

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        values = rows.score(ref, test)
        if metric not in values:
            raise QuantscopeError(f"--metric '{metric}' is no figure of this data's task: "
                                  f"use one of {', '.join(sorted(values))}")
        return values

    return dataclasses.replace(rows, score=score, primary=metric, higher_is_better=known[0])


def scorer_for(data: Dataset, model: Model | None = None, metric: str | None = None) -> Any:
    """The analysis scorer of the data's task (its row scoring), else every output's
    fidelity (the one ``--output`` when given), ranking by ``metric`` (``--metric``) when
    it is one of :data:`FIDELITY_PRIMARIES`, so the analysis ranks by what the plan is
    then judged by."""
    from quantscope.analyze.scoring import outputs_scorer, task_scorer
    from quantscope.tasks.headline import row_scoring_of

    rows = row_scoring_of(data.task, () if model is None else model.output_names())
    if rows is not None:
        return task_scorer(_ranked_by(rows, metric))
    if model is None:
        scorer = outputs_scorer()
    else:
        names = model.output_names()
        axes = output_channel_axes(model, data.evaluation)
        open_dims = output_symbolic_axes(model, data.evaluation)
        scorer = outputs_scorer(only=None if data.output is None else names.index(data.output),
                                channel_axes={names.index(k): a for k, a in axes.items()},
                                names=names,
                                symbolic_axes={names.index(k): d for k, d in open_dims.items()})
    if metric in FIDELITY_PRIMARIES:
        scorer = dataclasses.replace(scorer, primary=metric)
    return scorer
