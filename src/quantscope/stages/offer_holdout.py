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
against the FP32 outputs on B; then the same with A and B swapped. Each fold's gain has
its noise: the paired jackknife over the held half's units (:func:`quantscope.tasks.left_out.units_of`:
samples; on face data a PERSON's chips together, a person's photos being near-copies of
each other: h61 counted photos, and its noise was too small), from a pooled dB figure's
per-unit powers, or for any other figure (a share: a match rate, a top-1 agreement) from
the task's own figure recomputed with each unit left out (:mod:`quantscope.tasks.left_out`),
and the mean of the two folds the two combined
(:func:`quantscope.tasks.db_noise.mean_interval`, one-sided 95 %). An offer is not
offered (:func:`stands`) when

- the MEAN gain over the two folds of a pooled figure is below zero: the offer's metric
  where it is pooled (``sqnr_db``, ``embedding_sqnr_db``, ``psnr_db``), else the pooled
  figure of the same outputs (:data:`POOLED`: ``sqnr_db`` for the worst channel's
  ``sqnr_db_channel_min``). The mean, not "worse in both folds": a range fitted on half
  the samples clips in the folds whose other half holds a larger value, so the damage
  often shows in one fold only, and is large there (equalize on the token classifier:
  +0.2 dB and -4.5 dB); requiring both folds would keep exactly those repairs. The mean
  itself, not its bound: a rare clip is what such a repair risks, and a jackknife over
  the 8 samples of a half reads the one sample that clips as noise (there: -2.1 dB,
  noise 2.4 dB), so a margin would keep it too;
- or the worst channel's mean gain is below zero beyond its noise. Only beyond: a
  minimum over an output's columns, which may be another channel in each half and with
  and without the repair, has several times the pooled figure's noise over a few faces
  a half (mobileface, 7 + 7 faces: ``ranges`` -0.25 dB, noise 3.4 dB, where the pooled
  figure gained +0.34 dB, noise 1.1 dB, and ``ranges`` fitted on all the chips gained
  +1.55 dB on the held-out people; h57 dropped it on the worst channel's mean);
- or, where the offer's metric is a share (or any figure that is no pooled dB), its mean
  gain is below zero beyond its noise (h66; before, the sign of its mean decided: on
  the tiny embedder's fit half ``ranges`` lost 0.7 pts of decision agreement in one
  fold, 0 in the other, noise 0.8 pts over 7 + 5 people). Without a noise estimate (under
  3 units a half) its mean decides, and the reason says so.

The reason names the noise and its units ("beyond its noise (-1.3 dB ± 0.6 dB over 5 + 7
people)"). The notes say each figure's folds, mean and noise, what decided, and what the repaired
model clips on the half it was not calibrated on; the row's ``out_of_sample`` the offer's
metric (``folds``, ``mean``, ``noise``: the mean's bounds, half width, degrees of
freedom, each fold's held units), ``judged_by`` and, for a worst channel, ``pooled``
(the same for the pooled figure). Without a noise estimate (a figure with no per-sample
powers and none the task recomputes per unit, under 3 units a half) the noise says why,
and the rule reads the mean. :data:`CHECK_KEY` is the check's version in ``run``'s plan
stage key: a folder whose offers an older check judged plans again.
Halves are pessimistic for a repair that fits ranges or chooses them: each fold fits on
half the samples, so it clips more on new data than the repair ``run`` fits on all of
them (mobileface's ``ranges``: +0.34 dB out of sample on halves, +1.55 dB fitted on all);
the check is a guard against in-sample-only gains, not an estimate of the gain.
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
from quantscope.tasks.db_noise import (
    gain_interval,
    left_out_interval,
    mean_interval,
)
from quantscope.tasks.face_split import half_record, halves_by_person, splits_by_people, take_chips
from quantscope.tasks.left_out import unit_parts
from quantscope.types import Batch, Dataset, Plan, Stats, batch_rows, take_rows
from quantscope.units import gain as fmt_gain
from quantscope.units import is_db

if TYPE_CHECKING:
    from quantscope.plan.joint import Offer
    from quantscope.targets.profile import Target
    from quantscope.types import Outputs, Sensitivity

# a figure that is the lowest of several pooled columns -> the pooled figure of the same
# outputs, which judges an offer in its stead (module docstring)
POOLED = {"sqnr_db_channel_min": "sqnr_db"}
MIN_SAMPLES = 4  # fewer repair-feed samples: two halves too small to judge; said, not checked
# the check's version, in the key of ``run``'s plan stage (pipeline.steps.plan_rules): a
# new rule gets a new key, so a run folder whose offers an older check kept or withdrew
# (none before h57; faces by photo, shares by their mean alone before h66) plans again
CHECK_KEY = "offers held out: noise by person, shares by unit/2"


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
    left_out: tuple[str, ...]  # the figures recomputed with each unit left out (shares)


def _fold(model: Model, data: Dataset, stats: Stats, plan: Plan, fit: tuple[Batch, ...],
          held: tuple[Batch, ...], task: Any, *, scheme: Any, method: str | None,
          left_out: tuple[str, ...]) -> _Fold:
    on = replace(data, name=f"{data.name} (out-of-sample half)", calibration=held,
                 evaluation=held, task=task)
    s = calibrate(model, find_groups(model), iter(fit), method=stats.method)
    ref = run_model(model.proto, list(held))
    base = evaluate_plan(model, on, s, plan, method=method, scheme=scheme,
                         reference_outputs=ref, sample_parts=True, left_out=left_out)
    return _Fold(fit, on, s, ref, base, left_out)


def _clips(measured: dict[str, Any]) -> dict[str, float]:
    sat = measured.get("saturation") or {}
    return {t["tensor"]: float(t["below"]) + float(t["above"]) for t in sat.get("tensors", [])}


def _interval(fold: _Fold, after: dict[str, Any], key: str, sign: float
              ) -> dict[str, Any] | str:
    """The paired jackknife interval of the repair's gain in ``key`` on the fold's held
    half, or why none: a pooled dB figure's from its per-unit powers
    (``tasks.db_noise``), any other figure's from its value with each unit left out
    (``tasks.left_out``: a share's); units: people on face data, else samples."""
    got = [(m.get("sample_parts") or {}).get(key) for m in (after, fold.base)]
    if all(p is not None for p in got):
        a, b = (unit_parts(p, fold.data.task) for p in got)
        iv = gain_interval(a, b) if sign > 0 else gain_interval(b, a)
        return iv if iv is not None else (f"under 3 {a.unit} in a half, or a power of zero")
    left = [(m.get("left_out") or {}).get(key) for m in (after, fold.base)]
    if any(p is None for p in left):
        return (f"{key} keeps no per-sample powers" if is_db(key) else
                f"the task does not recompute {key} with a unit left out")
    x, y = left
    iv = left_out_interval(x, y) if sign > 0 else left_out_interval(y, x)
    return iv if iv is not None else (f"under 3 {x.unit} in a half, or {key} not finite "
                                      "with one left out")


def _one_fold(name: str, model: Model, fold: _Fold, plan: Plan, *, scheme: Any,
              method: str | None) -> tuple[dict[str, Any], dict[str, float]]:
    """The repaired model's measurement on the fold's held half (with per-sample powers)
    and the tensors it clips there beyond what the original clips (fraction of values)."""
    from quantscope.repair.apply import run_repairs

    out = run_repairs(model, fold.stats, plan, list(fold.fit), repairs=[name], scheme=scheme)
    repaired = load_proto(out.proto, f"{model.source} (repaired: {name})")
    after = evaluate_plan(repaired, fold.data, out.stats, out.plan, method=method,
                          scheme=scheme, reference_outputs=fold.ref, sample_parts=True,
                          left_out=fold.left_out)
    before_clips = _clips(fold.base)
    more = {t: f for t, f in _clips(after).items() if f > before_clips.get(t, 0.0)}
    return after, more


def _noise(intervals: list[dict[str, Any] | str]) -> dict[str, Any] | str:
    """The mean gain's one-sided interval from the folds' jackknife intervals
    (``tasks.db_noise.mean_interval``), or why there is none."""
    why = next((iv for iv in intervals if isinstance(iv, str)), None)
    if why is not None:
        return why
    return mean_interval([iv for iv in intervals if not isinstance(iv, str)])


@dataclass(frozen=True)
class Figure:
    """One figure's out-of-sample gain: per fold, their mean, and the noise of that mean
    (:func:`quantscope.tasks.db_noise.mean_interval`; a string: why none)."""

    key: str
    folds: tuple[float, ...]
    noise: dict[str, Any] | str

    @property
    def mean(self) -> float:
        return sum(self.folds) / len(self.folds)

    @property
    def upper(self) -> float | None:
        """The one-sided upper bound of the mean; None without a noise estimate."""
        return None if isinstance(self.noise, str) else float(self.noise["upper"])

    def spread(self) -> str:
        """The mean with its noise and units: ``-1.2 pts ± 0.8 pts over 5 + 7 people``."""
        if isinstance(self.noise, str):
            return f"{fmt_gain(self.key, self.mean)}, no noise estimate"
        n = self.noise
        return (f"{fmt_gain(self.key, self.mean)} ± "
                f"{fmt_gain(self.key, n['half_width']).lstrip('+')} over "
                f"{' + '.join(str(k) for k in n['n'])} {n['unit']}")

    def record(self) -> dict[str, Any]:
        noise = ({"missing": self.noise} if isinstance(self.noise, str) else
                 {k: (round(v, 6) if isinstance(v, float) else v)
                  for k, v in self.noise.items() if k != "mean"})
        return {"metric": self.key, "folds": [round(g, 6) for g in self.folds],
                "mean": round(self.mean, 6), "noise": noise}

    def words(self, how: str) -> str:
        folds = ", ".join(fmt_gain(self.key, g) for g in self.folds)
        if isinstance(self.noise, str):
            noise = f"no noise estimate: {self.noise}"
        else:
            n = self.noise
            noise = (f"noise {fmt_gain(self.key, n['half_width']).lstrip('+')}: one-sided "
                     f"{n['confidence']:.0%} jackknife over "
                     f"{' + '.join(str(k) for k in n['n'])} {n['unit']}, {n['dof']} degrees of "
                     f"freedom, upper bound {fmt_gain(self.key, n['upper'])}")
        return f"{fmt_gain(self.key, self.mean)} ({self.key}, mean of {how}: {folds}; {noise})"


def figure(key: str, folds: Sequence[_Fold], afters: Sequence[dict[str, Any]],
           sign: float) -> Figure | None:
    """``key``'s out-of-sample gain over the folds; None where a fold does not measure it."""
    if any(key not in m["metrics"] for f in folds for m in (f.base, *afters)):
        return None
    gains = tuple(sign * (a["metrics"][key] - f.base["metrics"][key])
                  for f, a in zip(folds, afters, strict=True))
    return Figure(key, gains, _noise([_interval(f, a, key, sign)
                                      for f, a in zip(folds, afters, strict=True)]))


def stands(own: Figure, pooled: Figure | None) -> tuple[bool, str]:
    """Whether an offer stands out of sample, and what decided (module docstring): a
    pooled dB figure's mean gain not below zero (the offer's own figure where it is
    pooled), and any other figure (a worst column, a share) not below zero beyond its
    noise; without a noise estimate a figure of its own is judged by its mean."""
    if pooled is not None:
        if pooled.mean < 0.0:
            return False, f"its pooled {pooled.key} is worse out of sample"
        if own.upper is not None and own.upper < 0.0:
            return False, f"its {own.key} is worse out of sample beyond its noise ({own.spread()})"
        return True, ""
    if is_db(own.key):
        keep, why = own.mean >= 0.0, f"its {own.key} is worse out of sample"
    elif own.upper is None:
        keep, why = own.mean >= 0.0, (f"its {own.key} is worse out of sample (no noise "
                                      f"estimate: {own.noise}; its mean decides)")
    else:
        keep, why = own.upper >= 0.0, (f"its {own.key} is worse out of sample beyond its "
                                       f"noise ({own.spread()})")
    return keep, "" if keep else why


def _judge(name: str, in_gain: float, own: Figure, pooled: Figure | None,
           clips: dict[str, float], folding: Folding) -> tuple[dict[str, Any], str, bool]:
    """The row entry, the note and whether the offer stands (:func:`stands`)."""
    keep, why = stands(own, pooled)
    sizes = (_count(folding.a), _count(folding.b))
    by_person = folding.record["by"] == "person"
    alone = own.words(folding.how) + (", judged against its noise" if not is_db(own.key)
                                       and own.upper is not None else "")
    figures = alone if pooled is None else (
        f"{pooled.words(folding.how)}; the worst channel's {own.words('the same folds')}, "
        f"judged against its noise")
    how = (f"{figures}; each calibrated and repaired on one half of the "
           f"{sizes[0] + sizes[1]} repair samples, measured on the other"
           + ("; no person in both, each half its own genuine and impostor pairs"
              if by_person else ""))
    clipped = ", ".join(f"{t} {f:.2%}" for t, f in sorted(clips.items(), key=lambda x: -x[1])[:4])
    entry = {**own.record(), "samples": list(sizes), "offered": keep,
             "judged_by": own.key if pooled is None else pooled.key,
             **({"pooled": pooled.record()} if pooled is not None else {}),
             "folded": folding.record, "clips": {t: round(f, 6) for t, f in clips.items()}}
    if keep:
        return entry, f"repair {name}: offered, not worse out of sample: {how}", True
    clip = (f": clips on samples it was not calibrated on ({clipped})" if clipped else "")
    return entry, (f"repair {name}: not offered, better in-sample "
                   f"({fmt_gain(own.key, in_gain)}) but {why}: {how}{clip}"), False


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
    # a figure that is no pooled dB gets its noise from the task's figure with each unit
    # left out (tasks.left_out): asked for of the offer's candidate metrics
    left_out = tuple(k for k in SAME_METRIC.get(sens.metric, (sens.metric,)) if not is_db(k))
    folds = [_fold(model, data, stats, plan, x, y, task, scheme=scheme, method=method,
                   left_out=left_out)
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
        measured = [_one_fold(option.name, model, f, plan, scheme=scheme, method=method)
                    for f in folds]
        clips: dict[str, float] = {}
        for _, more in measured:
            clips.update({t: max(f, clips.get(t, 0.0)) for t, f in more.items()})
        afters = [m for m, _ in measured]
        own = figure(key, folds, afters, sign)
        pool = POOLED.get(key)
        pooled = None if pool is None else figure(pool, folds, afters, 1.0)
        if own is None:  # the repaired model's measurement lacks the offer's metric
            notes.append(f"repair {option.name}: not checked out of sample ({key} is not "
                         "measured on the repaired model)")
            options.append(option)
            continue
        entry, note, keep = _judge(option.name, option.gain, own, pooled, clips, folding)
        rows[option.name] = {**rows[option.name], "out_of_sample": entry}
        notes.append(note)
        options += [option] if keep else []
    measured_rows = tuple(rows.get(r["name"], r) for r in offer.measured)
    return replace(offer, options=tuple(options), measured=measured_rows, notes=tuple(notes))
