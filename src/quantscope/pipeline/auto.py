"""The run's side of ``--rewrites auto`` (the default of ``quantscope run``): the
measurement the selection (:func:`quantscope.rewrites.auto.choose_rewrites`) is given,
what its result is a function of (the resume key), and the repairs auto mode adds.

===============  ==========================================================================
measured on      the FIT data only (the first ``--pairs`` pairs, or the fit half of tensor
                 data; :func:`quantscope.pipeline.data.open_fit_data`), at ``--seq-len``
plan measured    ``plan --max-legal``'s candidate at the run's length (every group at its
                 highest legal precision, only what ``check`` refuses demoted;
                 :func:`quantscope.plan.candidates.max_legal`), without repairs, emulated
                 in ONNX Runtime; the headline metric (``--metric`` or the task's)
kept             retrieval pairs: the per-query scores of the metric (each fit query's
                 top-1 agreement, :mod:`quantscope.tasks.samples`) give a paired
                 interval of the gain; kept only when it is beyond noise (one-sided 95 %
                 lower bound above 0); a tie within noise is decided by the embedding
                 SQNR (:data:`TIEBREAK`) gaining more than 0.1 dB beyond its own noise
                 (jackknife over the pairs, :mod:`quantscope.rewrites.tie`; else the
                 model without it, and a gain that cannot be told from the margin is
                 said to be a tie on both figures) and said to be a tie; other
                 data (no per-sample form): better on the figure by more than a margin
                 (:func:`headline_margin`: 0.1 dB for a headline in dB), a gain within it
                 a tie decided by the output SQNR by the same margin, and said (no noise
                 estimate; :func:`quantscope.rewrites.auto.choose_rewrites`); a share
                 whose items the task counts (``tasks.headline.share_items``: detection
                 F1 over both models' detections, a matched pair once; a class output's
                 or image views' top-1 agreement; a score output's or face verification's
                 decision agreement): its one-sided 95 % binomial noise is the margin,
                 said with the figures
repairs          a repair that keeps FP32 and answers a target rule
                 (:attr:`quantscope.repair.registry.RepairSpec.answers`: rank4 answers
                 ``qnn.linearclip_5d``) is applied to the run's model after the rewrites,
                 before calibration and planning, when that rule blocks the uniform a8_w8
                 plan (an error, or a warning the run does not accept: the planner's
                 ``blocks``): the search then plans the legal graph (rank4 leaves the emulation
                 as it was, so offered as a search move it would never measure a gain)
===============  ==========================================================================
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from quantscope import stages
from quantscope.progress import say
from quantscope.rewrites.auto import KEEP_RULE, AutoChoice, Measured, choose_rewrites
from quantscope.rewrites.base import shapes_seq_len
from quantscope.rewrites.tie import TIE_MARGIN, Parts
from quantscope.tasks.headline import share_items
from quantscope.tasks.left_out import share_left_out
from quantscope.tasks.shares import ITEM_WORDS, judged_samples
from quantscope.types import Plan, Precision, QuantscopeError, batch_rows

if TYPE_CHECKING:
    import onnx

    from quantscope.model.load import Model
    from quantscope.targets.profile import Target
    from quantscope.types import Dataset, Stats

class AutoOptions(Protocol):
    """The run options the auto choice reads (:class:`quantscope.pipeline.RunOptions`
    has them; named here so this module does not import the one that calls it)."""

    model: str
    data: str
    eval_data: str | None
    tokenizer: str | None
    prefixes: Any  # tasks.text.TextPrefixes | None
    calib_texts: int | None
    pairs: int | None
    seq_len: int | None
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    target: str
    method: str
    metric: str | None
    layout: tuple[Any, ...]
    batch_axes: tuple[tuple[str, int], ...]
    repair_batches: int
    allow_warnings: tuple[str, ...]


# what decides a tie of the headline (a coarse one: top-1 agreement on few pairs), in dB
TIEBREAK = {"fit pairs": "embedding_sqnr_db", "fit samples": "sqnr_db"}
MEASURED_ON = ("plan --max-legal at the run's length (no repairs), emulated in ONNX Runtime, "
               "on the fit data")


def headline_margin(unit: str) -> float:
    """What a headline without per-sample scores must gain to keep a rewrite (less either
    way is a tie, decided by the tiebreak): the tiebreak's :data:`TIE_MARGIN` for a figure
    in dB (tensor data's worst-channel SQNR); 0 for another unit, which has no margin of
    its own (the reason then says there is no noise estimate)."""
    return TIE_MARGIN if unit == "dB" else 0.0


def auto_key(opts: AutoOptions, identity: Any) -> dict[str, Any]:
    """What the auto choice is a function of besides the given model and the tool's
    version: the fit data, the length and shapes, the target, the calibration method, the
    metric and the keep rule (``identity``: a path -> content-digest function for the files)."""
    from quantscope.pipeline.data import calibration_rule

    return {"mode": "auto", "data": identity(opts.data), "eval_data": identity(opts.eval_data),
            "tokenizer": identity(opts.tokenizer), "pairs": opts.pairs,
            "seq_len": opts.seq_len, "input_shapes": [[k, list(v)] for k, v in opts.input_shapes],
            "target": identity(opts.target), "method": opts.method, "metric": opts.metric,
            "layout": layout_identity(opts.layout, identity),
            **tokenizer_beside(opts, identity),
            "batch_axes": [list(p) for p in opts.batch_axes],
            **({"prefixes": opts.prefixes.to_dict()} if opts.prefixes else {}),
            **({"calib_texts": opts.calib_texts} if opts.calib_texts else {}),
            **calibration_rule(opts.data),
            # the warnings the measured max-legal plan may cross (absent when none: the
            # keys of runs without --allow-warning stay valid)
            **({"allow_warnings": sorted(opts.allow_warnings)} if opts.allow_warnings else {}),
            # the rule that kept them: a folder chosen under another rule chooses again
            "keep_rule": KEEP_RULE, **_noise_units(opts), **_warnings_bind(opts)}


def _warnings_bind(opts: AutoOptions) -> dict[str, list[str]]:
    """The target's warning rules that a rewrite or a repair answers: since h75 their
    preconditions read them as the planner does (binding unless ``--allow-warning``
    accepts them), before only error rules bound, so a folder chosen before on such a
    target chose without them and chooses again. Absent where there are none (hailo10h:
    the rules its rewrites answer are errors), so those keys stay valid."""
    from quantscope.repair.registry import REGISTRY
    from quantscope.rewrites.registry import REWRITES
    from quantscope.targets import load_target
    from quantscope.targets.accept import warning_rules

    answers = {a for rw in REWRITES.values() for a in rw.answers} | {
        a for spec in REGISTRY.values() for a in spec.answers}
    ids = sorted(r.id for r in warning_rules(load_target(opts.target))
                 if any(r.id == a or r.id.endswith(f".{a}") for a in answers))
    return {"warnings_bind": ids} if ids else {}


def _noise_units(opts: AutoOptions) -> dict[str, str]:
    """On face fit data, the units a share's noise counts (people since h71:
    :data:`quantscope.tasks.left_out.UNITS_KEY`), so a folder whose rewrites a share's
    binomial over pairs decided chooses again; other data's keys unchanged."""
    from quantscope.tasks.left_out import UNITS_KEY
    from quantscope.tasks.registry import is_face_spec

    return {"noise_units": UNITS_KEY} if opts.data and is_face_spec(opts.data) else {}


def layout_identity(layout: Any, identity: Callable[[str], Any]) -> list[str]:
    """The ``--layout`` declarations as a resume key holds them: each by its text, and a
    detector's ``anchors=FILE`` also by that file's contents (``identity``), so an anchor
    file edited under its path redoes what it feeds (its path alone was keyed)."""
    return sorted(s.text + (f"#{identity(a)}" if (a := s.option("anchors")) else "")
                  for s in layout)


def tokenizer_beside(opts: AutoOptions, identity: Callable[[str], Any]) -> dict[str, Any]:
    """``{"tokenizer_beside": its identity}`` when text is read with the ``tokenizer.json``
    beside the given model (no ``--tokenizer``: :func:`quantscope.tasks.text.model_tokenizer`),
    else nothing (the keys of runs without one stay valid). That file had been in no key:
    edited (another vocabulary, casing), a rerun skipped every stage on the old tokens."""
    from quantscope.tasks.text import TOKENIZER_BESIDE

    if opts.tokenizer:
        return {}
    beside = stages.resolve_model_path(str(opts.model)).parent / TOKENIZER_BESIDE
    return {"tokenizer_beside": identity(str(beside))} if beside.is_file() else {}


def auto_digest(key: dict[str, Any]) -> str:
    """A short digest of :func:`auto_key` for the rewritten model's key."""
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _samples(fit: Dataset) -> tuple[int | None, str]:
    pairs = getattr(fit.task, "n_pairs", None)
    if isinstance(pairs, int):
        return pairs, "fit pairs"
    return sum(batch_rows(b) for b in fit.evaluation), "fit samples"


def max_legal_measure(fit: Dataset, target: Target, metric: str, *, seq_len: int | None,
                      input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
                      tiebreak: str | None = None, allowed: frozenset[str] = frozenset(),
                      ) -> Callable[[Model, Stats], Measured]:
    """``measure(model, stats)`` for :func:`quantscope.rewrites.auto.choose_rewrites`:
    ``metric`` of the model's ``plan --max-legal`` candidate at ``seq_len`` (no repairs),
    emulated in ONNX Runtime on ``fit`` against the model's own FP32 outputs, with
    ``tiebreak`` (a metric, higher is better) and, for retrieval pairs and a metric with a
    per-query form, each query's score (the same run: :class:`_PerQuery`). ``allowed``:
    the warning rules ``--allow-warning`` accepted, which block no group of the measured
    plan (the plan search screens with the same set: a rewrite is judged on the plan the
    run can ship, not on a stricter one).

    The reference is the FP32 outputs of the first model measured (the given one, run
    once and held): every rewrite keeps FP32 within 1e-5 (checked when it is applied), so
    each trial runs only its emulated model, one pass instead of two. Where the task keeps
    part of each batch's outputs (the pooled rows of text pairs), only that part is held,
    of FP32 and of each trial (``evaluate_plans(task_only=True)``: the same task figures,
    no output fidelity figures, none of them read here): on mpnet-base's 300 fit pairs at
    256 tokens the per-token outputs were 1 GB held through every trial and another 1 GB
    per trial."""
    from quantscope.analyze.measure import evaluate_plans, reference_kept_outputs
    from quantscope.emulate.evaluate import run_model
    from quantscope.model.shapes import given_shapes
    from quantscope.plan.candidates import max_legal

    held: list[Any] = []  # the first model's FP32 outputs on the fit data (kept part, if any)

    def measure(model: Model, stats: Stats) -> Measured:
        shapes = given_shapes(model, seq_len, input_shapes)
        plan = max_legal(model, target, shapes, allowed=allowed).plan
        task = _PerQuery.of(fit.task, metric, parts=tiebreak == "embedding_sqnr_db")
        data = fit if task is None else dataclasses.replace(fit, task=task)
        pooled = getattr(data.task, "keep", None) is not None
        if not held:
            held.append(reference_kept_outputs(model, data) if pooled else
                        run_model(model.proto, list(fit.evaluation)))
        # a share on face data (not pooled): its value with each person left out too, the
        # paired jackknife over people its gain is decided by (rewrites.tie.paired_gain)
        given = {"reference_kept": held[0], "task_only": True} if pooled else \
            {"reference_outputs": held[0], "left_out": share_left_out(fit.task, metric)}
        got_all = evaluate_plans(model, data, stats, {"max_legal": plan}, scheme=target.scheme,
                                 saturation=False, **given)["max_legal"]
        metrics = got_all["metrics"]
        got = metrics.get(metric)
        if got is None:
            raise QuantscopeError(f"the metric '{metric}' was not measured on the fit data")
        second = metrics.get(tiebreak) if tiebreak and tiebreak != metric else None
        return Measured(float(got), None if second is None else float(second),
                        None if task is None else task.samples,
                        None if task is None or second is None else task.parts,
                        share_of=share_items(fit.task, metric, metrics),
                        judged=judged_samples(metric, metrics, _samples(fit)[0]),
                        left=(got_all.get("left_out") or {}).get(metric))

    return measure


def _repaired_for(model: Model, target: Target, opts: AutoOptions) -> str:
    """What :func:`repaired_measure` adds to the measurement on ``model``, in words."""
    names = [r["name"] for r in binding_repairs(model, target, seq_len=opts.seq_len,
                                                 input_shapes=opts.input_shapes) if r["binds"]]
    return (f"; {', '.join(names)} applied to every model measured first (a rule it answers "
            "refuses every plan without it)") if names else ""


def repaired_measure(measure: Callable[[Model, Stats], Measured],
                     calibrate: Callable[[Model], Stats], target: Target, feeds: list[Any], *,
                     seq_len: int | None,
                     input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
                     ) -> Callable[[Model, Stats], Measured]:
    """``measure`` of each model with the legality repairs that bind on it applied first
    (:func:`apply_binding_repairs`, FP32 kept; the repaired model calibrated again): where a
    rule they answer refuses every plan (rank4 and ``qnn.linearclip_5d`` on QNN HTP), the
    model without rewrites and each rewrite are measured as they would ship, instead of
    not at all. The rewrites themselves still apply to the unrepaired model."""

    def measured(model: Model, stats: Stats) -> Measured:
        fixed, _ = apply_binding_repairs(model, lambda _: stats, target, feeds,
                                         seq_len=seq_len, input_shapes=input_shapes)
        if fixed is None:
            return measure(model, stats)
        repaired = stages.load_proto(fixed, model.source)
        return measure(repaired, calibrate(repaired))

    return measured


class _PerQuery:
    """A retrieval task that, scoring a model, also keeps each query's score of
    ``metric`` (:data:`quantscope.tasks.samples.SAMPLE_SCORES`, over all the pairs: their
    mean is the metric), so the paired interval needs no second run, and (``parts``) each
    embedding row's signal and noise power, which the embedding SQNR pools (the
    tiebreak's noise, :mod:`quantscope.rewrites.tie`). Everything else is the task's own."""

    def __init__(self, task: Any, metric: str, *, parts: bool = False) -> None:
        self._task, self._metric, self._want_parts = task, metric, parts
        self.samples: np.ndarray | None = None
        self.parts: Parts | None = None

    @classmethod
    def of(cls, task: Any, metric: str, *, parts: bool = False) -> _PerQuery | None:
        from quantscope.tasks.registry import RetrievalTask
        from quantscope.tasks.samples import SAMPLE_SCORES

        ok = isinstance(task, RetrievalTask) and metric in SAMPLE_SCORES
        return cls(task, metric, parts=parts) if ok else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def metrics(self, ref: Any, test: Any) -> Any:
        from quantscope.tasks.samples import SAMPLE_SCORES

        got = self._task.metrics(ref, test)
        self.samples = SAMPLE_SCORES[self._metric](self._task.embeddings(ref),
                                                   self._task.embeddings(test))
        if self._want_parts:  # the rows embedding_sqnr_db reads (RetrievalTask.metrics),
            # per pair: a query and its document are one sample of the jackknife
            self.parts = self._task.sample_parts(ref, test)["embedding_sqnr_db"]
        return got


def choose(opts: AutoOptions, model: Model, *, progress: bool = True
           ) -> tuple[AutoChoice, onnx.ModelProto | None]:
    """The auto choice for this run, measured now on its fit data."""
    from quantscope.pipeline.data import open_fit_data
    from quantscope.targets import load_target
    from quantscope.targets.accept import allowed_warnings, for_run

    fit = open_fit_data(model, opts.data, eval_data=opts.eval_data, pairs=opts.pairs,
                        tokenizer=opts.tokenizer, layout=opts.layout,
                        batch_axes=dict(opts.batch_axes) or None, prefixes=opts.prefixes,
                        calib_texts=opts.calib_texts)
    if opts.seq_len is not None:
        fit = stages.at_length(fit, opts.seq_len)
    head = stages.headline(fit, opts.metric)
    n, unit = _samples(fit)
    tiebreak = TIEBREAK[unit]
    # the run's view of its target: the preconditions of the rewrites and repairs read
    # which warning rules it accepts (a warning it does not accept binds, as the planner
    # blocks it: targets/accept.py)
    loaded = load_target(opts.target)
    allowed = allowed_warnings(loaded, opts.allow_warnings)
    target = for_run(loaded, allowed)
    items = share_items(fit.task, head.metric, {})  # known before measuring: a verification's
    # pairs; another share's items once measured (choose_rewrites says them then)
    over = (f" ({items[0]} {items[1]})" if items and items[0] != n else
            " (a share: its items are counted where a rewrite is measured)"
            if items is None and head.metric.split(":")[0] in ITEM_WORDS else "")
    say(f"rewrites auto: choosing by {head.metric} on {n} {unit}{over} (a tie: by {tiebreak})",
        show=progress)
    calib = _released(lambda m: stages.calibrate_model(m, fit, method=opts.method))
    # the trials' preconditions read a length: without --seq-len, the one the input shapes
    # (given, or the data's sizes) give, else the size rules could not be judged
    seq_len = opts.seq_len if opts.seq_len is not None else \
        shapes_seq_len(model, opts.input_shapes)
    choice, proto = choose_rewrites(
        model, target, seq_len,
        calibrate=calib,
        measure=_released(repaired_measure(
            max_legal_measure(fit, target, head.metric, seq_len=opts.seq_len,
                              input_shapes=opts.input_shapes, tiebreak=tiebreak,
                              allowed=allowed),
            calib, target, list(fit.calibration)[: opts.repair_batches],
            seq_len=opts.seq_len, input_shapes=opts.input_shapes)),
        tiebreak=tiebreak, margin=headline_margin(head.unit),
        reload=lambda p: stages.load_proto(p, model.source),
        metric=head.metric, higher_is_better=head.higher_is_better, n=n, unit=unit,
        measured_on=MEASURED_ON + _repaired_for(model, target, opts) + (
            f"; warning rule(s) accepted (--allow-warning): {', '.join(sorted(allowed))}"
            if allowed else ""),
        input_shapes=opts.input_shapes, progress=progress)
    current = model if proto is None else stages.load_proto(proto, model.source)
    fixed, records = apply_binding_repairs(
        current, lambda m: stages.calibrate_model(m, fit, method=opts.method), target,
        list(fit.calibration)[: opts.repair_batches], seq_len=opts.seq_len,
        input_shapes=opts.input_shapes, progress=progress)
    return dataclasses.replace(choice, repairs=records), proto if fixed is None else fixed


def _released(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` followed by :func:`quantscope.emulate.release.release_memory`: each
    calibration and measurement of the trials leaves what it dropped in reference cycles
    and the shared arena's chunks (mpnet-base: 2.4-2.9 GB after a calibration, 1 GB after a
    measurement, until the next collection), which the next trial's calibration then
    peaked on top of (8.57 GB in all, stop 44)."""
    from quantscope.emulate.release import release_memory

    def released(*args: Any) -> Any:
        try:
            return step(*args)
        finally:
            release_memory()

    return released


def binding_repairs(model: Model, target: Target, *, seq_len: int | None,
                    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
                    ) -> list[dict[str, Any]]:
    """Each repair of the registry that keeps FP32 and answers a rule of ``target``
    (:attr:`quantscope.repair.registry.RepairSpec.answers`), with whether that rule
    blocks the uniform a8_w8 plan of ``model`` at ``seq_len`` as the planner judges it
    (:func:`quantscope.plan.start.blocks`: an error, or a warning the run does not accept,
    :attr:`~quantscope.targets.profile.Target.accepted`):
    ``{"name", "rules", "binds", "reason"}``."""
    from quantscope.model.shapes import given_shapes
    from quantscope.plan.check import check
    from quantscope.plan.start import blocks
    from quantscope.repair.registry import REGISTRY
    from quantscope.targets.accept import accepted_words, binding_words

    wanted = {n: s.answers for n, s in REGISTRY.items() if s.answers and s.keeps_fp32}
    rules = {r.id for r in target.rules}
    found = []
    for name, answers in wanted.items():
        ids = {r for r in rules if any(r == a or r.endswith(f".{a}") for a in answers)}
        if ids:
            found.append((name, ids))
    if not found:
        return []
    plan = Plan(default=Precision.A8_W8, target=target.name)
    problems = check(plan, stages.find_groups(model), model, target,
                     shapes=given_shapes(model, seq_len, input_shapes))
    out = []
    for name, ids in found:
        hits = [p for p in problems if p.rule in ids and blocks(p, target.accepted)]
        out.append({"name": name, "rules": sorted(ids), "binds": bool(hits),
                    "reason": (f"{binding_words(hits[0].rule, hits[0].severity)} refuses "
                               f"{len(hits)} group(s) of the uniform "
                               f"a8_w8 plan, e.g. '{hits[0].group}'") if hits else
                    f"{accepted_words(ids)}: it blocks no group" if ids <= target.accepted
                    else f"{', '.join(sorted(ids - target.accepted))} refuses no group of the "
                    "uniform a8_w8 plan"})
    return out


def apply_binding_repairs(model: Model, calibrate: Callable[[Model], Stats], target: Target,
                          feeds: list[Any], *,
                          seq_len: int | None,
                          input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
                          progress: bool = False,
                          ) -> tuple[onnx.ModelProto | None, tuple[dict[str, Any], ...]]:
    """The repairs of :func:`binding_repairs` whose rule binds, applied to ``model``
    (FP32 checked by the repair runner) before any plan: the plan search then sees the
    legal graph (a repair that keeps the emulation the same, like rank4, would never be
    chosen by measurement). Returns the new proto (None: none applied) and the record."""
    from quantscope.repair.apply import run_repairs

    found = binding_repairs(model, target, seq_len=seq_len, input_shapes=input_shapes)
    names = [r["name"] for r in found if r["binds"]]
    if not names:
        return None, tuple({**r, "applied": False} for r in found)
    out = run_repairs(model, calibrate(model), Plan.uniform(Precision.A8_W8), feeds, repairs=names,
                      scheme=target.scheme)
    done = {r.name: r for r in out.records}
    records = []
    for r in found:
        rec = done.get(r["name"])
        applied = rec is not None and rec.skipped is None and bool(rec.changed)
        reason = r["reason"] if rec is None else (
            f"{r['reason']}: {rec.reason}" if applied else f"{r['reason']}: not applied: "
            f"{rec.skipped or 'changed nothing'}")
        records.append({**r, "applied": applied, "reason": reason})
        say(f"repairs auto: {r['name']}: {'applied' if applied else 'not applied'}: {reason}",
            show=progress)
    return (out.proto if any(r["applied"] for r in records) else None), tuple(records)
