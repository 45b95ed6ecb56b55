"""Repair offers judged out of sample where the search measures on its calibration data.

The plan search measures every candidate on ``data.evaluation``; for tensor data (the fit
part of ``run``, or ``plan --data x.npz``) those are the very batches that calibrated the
ranges. A repair that recalibrates ranges (equalize puts every channel at the edge of the
per-tensor range) is then judged in-sample only: a range covers every value it was
calibrated on, so nothing ever clips, and an offer can look better while it clips on
samples it was not calibrated on (a token classifier: equalize +0.25 dB in-sample, the
chosen all-16-bit plan with it 29.0 dB held out against 40.5 dB without it).

So, where the calibration and evaluation batches are the same and the repair feeds hold at
least :data:`MIN_SAMPLES` samples, each offered repair is also measured by 2-fold cross
validation on uniform ``low``: the feeds are split in halves A and B; the original model is
calibrated on A, repaired on A (the repair recalibrates on A), and both are measured on B
against the FP32 outputs on B; then the same with A and B swapped. An offer whose MEAN
gain over the two folds (in the offer's metric) is below zero is not offered, and the
offer's notes say so with both folds' figures and what the repaired model clips on the
half it was not calibrated on. The mean, not "worse in both folds": a range fitted on
half the samples clips in the folds whose other half holds a larger value, so the damage
often shows in one fold only, and is large there (equalize on the token classifier:
+0.2 dB and -4.5 dB); requiring both folds would keep exactly those repairs.
Text data (its separate calibration texts) is not checked; a task that scores all samples
together, or fewer samples, is said not checked.

Face data (``faces``, identity folders) is folded BY PERSON, not by batch: a person's chips
(a photo's variants and distance slices, near-copies of each other) on both sides would
make the "out of sample" half hold near-copies of the fit half's chips. The repair feeds
(the data's first chips) are split with ``run``'s rule (``tasks.face_split``: people by
chip count, most first, each to the half with fewer chips), each fold measured on its own
genuine and impostor pairs (those of the data whose two chips are both in it); the note
says "2 folds by person: 5 and 7 people" (``run``'s fit half of the built-in ``faces``,
63 chips each; ``plan --data faces``: 12 and 12), the row's ``out_of_sample.folded`` each half's people,
photos, chips and pairs. A half of under 2 people or 8 genuine pairs: said, not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from quantscope.analyze.measure import evaluate_plan
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.evaluate import run_model
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.progress import say
from quantscope.tasks.face_split import half_record, halves_by_person, splits_by_people, take_chips
from quantscope.types import Batch, Dataset, Plan, Stats, batch_rows, take_rows
from quantscope.units import gain as fmt_gain

if TYPE_CHECKING:
    from quantscope.plan.joint import Offer
    from quantscope.targets.profile import Target
    from quantscope.types import Outputs, Sensitivity

MIN_SAMPLES = 4  # fewer repair-feed samples: two halves too small to judge; said, not checked


def same_batches(data: Dataset) -> bool:
    """Whether ``data`` evaluates on its calibration batches (the same objects)."""
    cal, ev = data.calibration, data.evaluation
    return cal is ev or (len(cal) == len(ev) and all(a is b for a, b in zip(cal, ev, strict=True)))


def halves(feeds: Sequence[Batch]) -> tuple[tuple[Batch, ...], tuple[Batch, ...]]:
    """``feeds`` in two halves: by batches when there are two or more, else by rows."""
    if len(feeds) >= 2:
        k = (len(feeds) + 1) // 2
        return tuple(feeds[:k]), tuple(feeds[k:])
    rows = batch_rows(feeds[0])
    k = (rows + 1) // 2
    return (take_rows(feeds[0], slice(0, k)),), (take_rows(feeds[0], slice(k, rows)),)


def _count(batches: Sequence[Batch]) -> int:
    return sum(batch_rows(b) for b in batches)


@dataclass(frozen=True)
class Folding:
    """The repair feeds in halves ``a`` and ``b``, each half's task (face data: its people's
    own pairs; other data: the data's task), how they were folded (``how``: the note's
    words) and its record (the row's ``out_of_sample.folded``)."""

    a: tuple[Batch, ...]
    b: tuple[Batch, ...]
    tasks: tuple[Any, Any]
    how: str
    record: dict[str, Any]


def fold_feeds(data: Dataset, feeds: Sequence[Batch]) -> Folding | str:
    """The two folds of ``feeds`` (module docstring), or why they are not checked."""
    n = _count(feeds)
    if data.task is not None and not splits_by_people(data.task) and not getattr(
            data.task, "row_local", False):
        return f"its task ({getattr(data.task, 'name', 'task')}) scores all samples together"
    if n < MIN_SAMPLES:
        return f"the {n} repair sample(s) are too few to split: needs {MIN_SAMPLES}"
    if splits_by_people(data.task):
        return _by_person(data, feeds)
    a, b = halves(list(feeds))
    return Folding(a, b, (data.task, data.task), "2 folds",
                   {"by": "batch" if len(feeds) >= 2 else "row"})


def _by_person(data: Dataset, feeds: Sequence[Batch]) -> Folding | str:
    """Face data's feeds (its first chips) folded by person (``tasks.face_split``)."""
    task = data.task
    lead = tuple(data.calibration)[: len(feeds)]
    if len(lead) < len(feeds) or any(f is not c for f, c in zip(feeds, lead, strict=True)):
        return "the repair feeds are not the face data's first batches: their people are unknown"
    split = halves_by_person(take_chips(task, np.arange(_count(feeds))),  # type: ignore[arg-type]
                             tuple(feeds))
    if isinstance(split, str):
        return f"folded by person, a half would hold {split}"
    p = split.people
    return Folding(*split.batches, split.tasks, f"2 folds by person: {p[0]} and {p[1]} people",
                   {"by": "person", "halves": [half_record(t) for t in split.tasks]})


@dataclass(frozen=True)
class _Fold:
    """One fold: calibrated (and repaired) on ``fit``, measured on ``data`` (the other
    half), the original model's figures there in ``base``."""

    fit: tuple[Batch, ...]
    data: Dataset
    stats: Stats
    ref: Outputs
    base: dict[str, Any]


def _fold(model: Model, data: Dataset, stats: Stats, plan: Plan, fit: tuple[Batch, ...],
          held: tuple[Batch, ...], task: Any, *, scheme: Any, method: str | None) -> _Fold:
    on = replace(data, name=f"{data.name} (out-of-sample half)", calibration=held,
                 evaluation=held, task=task)
    s = calibrate(model, find_groups(model), iter(fit), method=stats.method)
    ref = run_model(model.proto, list(held))
    base = evaluate_plan(model, on, s, plan, method=method, scheme=scheme,
                         reference_outputs=ref)
    return _Fold(fit, on, s, ref, base)


def _clips(measured: dict[str, Any]) -> dict[str, float]:
    sat = measured.get("saturation") or {}
    return {t["tensor"]: float(t["below"]) + float(t["above"]) for t in sat.get("tensors", [])}


def _one_fold(name: str, model: Model, fold: _Fold, plan: Plan, key: str, sign: float, *,
              scheme: Any, method: str | None) -> tuple[float, dict[str, float]]:
    """The repair's gain in ``key`` on the fold's held half, and the tensors the repaired
    model clips there beyond what the original clips (fraction of values)."""
    from quantscope.repair.apply import run_repairs

    out = run_repairs(model, fold.stats, plan, list(fold.fit), repairs=[name], scheme=scheme)
    repaired = load_proto(out.proto, f"{model.source} (repaired: {name})")
    after = evaluate_plan(repaired, fold.data, out.stats, out.plan, method=method,
                          scheme=scheme, reference_outputs=fold.ref)
    before_clips = _clips(fold.base)
    more = {t: f for t, f in _clips(after).items() if f > before_clips.get(t, 0.0)}
    return sign * (after["metrics"][key] - fold.base["metrics"][key]), more


def _judge(name: str, in_gain: float, gains: list[float], clips: dict[str, float],
           key: str, folding: Folding) -> tuple[dict[str, Any], str, bool]:
    """The row entry, the note and whether the offer stands (mean gain not below zero)."""
    mean = sum(gains) / len(gains)
    keep = mean >= 0.0
    sizes = (_count(folding.a), _count(folding.b))
    folds = ", ".join(fmt_gain(key, g) for g in gains)
    by_person = folding.record["by"] == "person"
    how = (f"{fmt_gain(key, mean)} ({key}, mean of {folding.how}: {folds}; each "
           f"calibrated and repaired on one half of the {sizes[0] + sizes[1]} repair samples, "
           "measured on the other" + ("; no person in both, each half its own genuine and "
                                      "impostor pairs)" if by_person else ")"))
    clipped = ", ".join(f"{t} {f:.2%}" for t, f in sorted(clips.items(), key=lambda x: -x[1])[:4])
    entry = {"metric": key, "folds": [round(g, 6) for g in gains], "mean": round(mean, 6),
             "samples": list(sizes), "offered": keep, "folded": folding.record,
             "clips": {t: round(f, 6) for t, f in clips.items()}}
    if keep:
        return entry, f"repair {name}: offered, not worse out of sample: {how}", True
    why = (f": clips on samples it was not calibrated on ({clipped})" if clipped else "")
    return entry, (f"repair {name}: not offered, better in-sample ({fmt_gain(key, in_gain)}) "
                   f"but worse out of sample: {how}{why}"), False


def check_offer(offer: Offer, model: Model, data: Dataset, stats: Stats, sens: Sensitivity,
                target: Target, feeds: Sequence[Batch], *, method: str | None = None,
                progress: bool = False) -> Offer:
    """``offer`` with each option also judged out of sample (module docstring) where
    ``data`` evaluates on its calibration batches; unchanged otherwise."""
    if not offer.options or not same_batches(data) or not feeds:
        return offer
    folding = fold_feeds(data, feeds)
    if isinstance(folding, str):
        notes = tuple(f"repair {o.name}: not checked out of sample (the plan search measures "
                      f"on its calibration data; {folding})" for o in offer.options)
        return replace(offer, notes=(*offer.notes, *notes))
    from quantscope.plan.joint import SAME_METRIC

    plan = Plan(default=sens.low, target=target.name)
    scheme = target.scheme
    folds = [_fold(model, data, stats, plan, x, y, task, scheme=scheme, method=method)
             for x, y, task in ((folding.a, folding.b, folding.tasks[1]),
                                (folding.b, folding.a, folding.tasks[0]))]
    metrics = folds[0].base["metrics"]
    key = next((k for k in SAME_METRIC.get(sens.metric, (sens.metric,)) if k in metrics), "")
    if not key:  # the offer's metric is not among the fold's figures: nothing to judge by
        notes = tuple(f"repair {o.name}: not checked out of sample ({sens.metric} is not "
                      "measured on a half of the repair samples)" for o in offer.options)
        return replace(offer, notes=(*offer.notes, *notes))
    sign = 1.0 if sens.higher_is_better else -1.0
    rows = {r["name"]: r for r in offer.measured}
    options, notes = [], list(offer.notes)
    for option in offer.options:
        say(f"plan: checking repair {option.name} out of sample ({folding.how})",
            show=progress)
        measured = [_one_fold(option.name, model, f, plan, key, sign, scheme=scheme,
                              method=method) for f in folds]
        clips: dict[str, float] = {}
        for _, more in measured:
            clips.update({t: max(f, clips.get(t, 0.0)) for t, f in more.items()})
        entry, note, keep = _judge(option.name, option.gain, [g for g, _ in measured], clips,
                                   key, folding)
        rows[option.name] = {**rows[option.name], "out_of_sample": entry}
        notes.append(note)
        options += [option] if keep else []
    measured_rows = tuple(rows.get(r["name"], r) for r in offer.measured)
    return replace(offer, options=tuple(options), measured=measured_rows, notes=tuple(notes))
