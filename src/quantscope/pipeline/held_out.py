"""Whether the held-out data contradict the plan's price: the plan that ships measured
worse held out than uniform a8_w8 (the cost unit, never dearer) beyond the noise of the
difference, which ``run``'s verdict says with what to do.

============  ==============================================================================
chosen on     the FIT data, always: choosing between the plan and a8_w8 on the held-out
              data would make the held-out figure of what ships no longer held out (the
              choice would be fitted to it), so the held-out data only *contradict*
compared      the plan's and uniform a8_w8's held-out figure of the headline metric, in its
              direction; only where the plan costs more than a8_w8 (1.0x) and the search
              did not find a8_w8 enough for the goal already (then the plan is a8_w8)
noise         a share on face data with its values per person left out kept for both
              (``evaluate.json`` ``share_left_out``, :func:`headline_left_out`; the same
              held-out people, so paired): the one-sided 95 % jackknife half width of the
              paired difference over people (:func:`quantscope.tasks.db_noise.left_out_noise`:
              a pair spans two people and a person's pairs err together, h71); a share the
              task counts items for (``KEY_items`` in both figures; on face data only
              where those values are not at hand, which the noise says): the
              one-sided 95 % binomial noise of the difference
              (:func:`quantscope.tasks.shares.share_noise`); a figure in dB with its
              per-sample powers kept for both (``evaluate.json`` ``sample_powers``,
              :func:`headline_parts`; the two passes are on the same held-out samples, so
              the difference is paired): the one-sided 95 % jackknife half width of the
              paired difference (:func:`quantscope.tasks.db_noise.db_noise`); a figure in
              dB without them (an older run folder; a figure no one keeps them for:
              ``psnr_min_db``, a ``*_db`` key of a task that gives none) or whose
              powers give none (fewer than 3 units): the 0.1 dB margin the auto
              rewrites use (:data:`quantscope.rewrites.tie.TIE_MARGIN`), said as no
              noise estimate and why; any other figure: none
kept          by ``run``'s evaluate stage (:func:`keep_powers`), for a headline in dB: the
              plan's and a8_w8's per-sample powers of it, of the columns the jackknife
              reads (:func:`quantscope.tasks.db_noise.jackknife_columns`): an output's
              SQNR and worst channel's per sample, a text retrieval's embedding SQNR per
              pair, a picture's PSNR per sample (``psnr_db``; ``psnr_db:OUTPUT`` of
              several image outputs, the unprefixed worst one's as their columns side by
              side), a face verification's embedding SQNR per person and image views' per
              photo (the rows of one source are no independent samples; on face data
              the outputs' figures per person too: ``tasks.left_out.unit_parts``), an embedding's
              (``--layout OUT=embedding``) per sample: the powers the planner's choice
              reads too (:func:`quantscope.analyze.measure.figure_parts`, one place); an
              ``evaluate.json`` written before has none and is read as such; for a
              share headline on face data (:func:`quantscope.tasks.left_out.share_left_out`)
              the plan's and a8_w8's values with each held-out person left out
              (``share_left_out``: one float per person)
said          ``verdict.json`` ``worse_held_out`` (figures, margin, ``noise`` in words,
              ``noise_from``: binomial / jackknife / margin / none, ``beyond_noise``,
              line) and the verdict's plan line: "held out, the plan is worse than uniform
              a8_w8 by X (...; beyond <its noise>): ship uniform a8_w8 or add data"; worse
              within noise is said with its noise
============  ==============================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from quantscope.rewrites.tie import TIE_MARGIN
from quantscope.tasks.db_noise import (
    LeftOut,
    Parts,
    db_noise,
    jackknife_columns,
    left_out_noise,
    parts_of,
    parts_record,
    pooled_db,
)
from quantscope.tasks.left_out import left_out_of, left_out_record
from quantscope.tasks.shares import items_key, share_noise
from quantscope.units import gain, is_db, is_share, value

UNIFORM_COST = 1.0  # uniform a8_w8: the cost unit
COMPARED = ("plan", "a8_w8")
POWERS = "sample_powers"  # evaluate.json, beside a result's metrics: its headline's powers
LEFT = "share_left_out"  # evaluate.json: a share headline's values per person left out


def worse_held_out(metric: str, unit: str, quality: dict[str, dict[str, Any]],
                   plan_cost: float | None, *, higher: bool,
                   uniform_meets_goal: bool, parts: Mapping[str, Parts] | None = None,
                   left: Mapping[str, LeftOut] | None = None) -> dict[str, Any] | None:
    """The record when the plan, dearer than uniform a8_w8, is worse held out
    (``beyond_noise``: by more than the margin, module table), else None. ``parts``:
    label (``plan``, ``a8_w8``) -> the per-sample powers of a figure in dB
    (:func:`headline_parts`); ``left``: label -> a share's values with each unit
    (person) left out (:func:`headline_left_out`)."""
    plan, uni = (quality.get(k, {}) for k in COMPARED)
    p, u = plan.get(metric), uni.get(metric)
    if p is None or u is None or plan_cost is None or uniform_meets_goal \
            or plan_cost <= UNIFORM_COST + 1e-9:
        return None
    margin, noise, source = _margin(metric, unit, plan, uni, parts or {}, left or {})
    worse_by = (u - p) if higher else (p - u)
    if not worse_by > 0:
        return None
    record = {"plan": p, "a8_w8": u, "worse_by": worse_by, "margin": margin, "noise": noise,
              "noise_from": source, "plan_cost": plan_cost}
    # a difference under one unit shown (1 dB, 1 pt) with the digits that show it
    fine = abs(worse_by) * (100 if is_share(metric) else 1) < 1.0
    if not worse_by > margin:
        return {**record, "beyond_noise": False,
                "line": f"held out, the plan is {gain(metric, p - u, fine=fine)} against "
                        f"uniform a8_w8 (chosen on the fit data; within {noise})"}
    line = (f"held out, the plan is worse than uniform a8_w8 by "
            f"{gain(metric, worse_by, fine=fine).lstrip('+')} "
            f"({value(metric, p, fine=fine)} at {plan_cost:.3f}x against "
            f"{value(metric, u, fine=fine)} at 1x; "
            f"beyond {noise}): ship uniform a8_w8 or add data (the plan was chosen "
            "on the fit data; choosing on the held-out data would leave no held-out figure)")
    return {**record, "beyond_noise": True, "line": line}


def keep_powers(results: dict[str, dict[str, Any]], metric: str) -> None:
    """In place: each result's per-sample powers (``sample_parts``, as
    :func:`quantscope.analyze.measure.evaluate_plans` gives them, arrays) taken out, and
    those of ``metric`` kept for ``plan`` and ``a8_w8`` as JSON keeps them (``POWERS``:
    ``[samples, k]`` sums of the ``k`` columns the jackknife reads, a few floats per
    sample, never the outputs)."""
    for label, r in results.items():
        got = (r.pop("sample_parts", None) or {}).get(metric)
        if label in COMPARED and isinstance(got, Parts):
            r[POWERS] = {"metric": metric, **parts_record(jackknife_columns(got))}
        # a share's values per person left out (asked for on face data): kept the same way
        share = (r.pop("left_out", None) or {}).get(metric)
        if label in COMPARED and isinstance(share, LeftOut):
            r[LEFT] = left_out_record(share, metric)


def headline_left_out(results: Mapping[str, Any], metric: str) -> dict[str, LeftOut]:
    """The values with each unit left out that ``run``'s evaluate kept for the share
    ``metric`` (label -> :class:`LeftOut`, of ``plan`` and ``a8_w8``): those whose whole
    figure is the result's ``metric``; an older ``evaluate.json`` keeps none (then {})."""
    out: dict[str, LeftOut] = {}
    for label in COMPARED:
        r = results.get(label) or {}
        got = left_out_of(r.get(LEFT), metric)
        figure = (r.get("metrics") or {}).get(metric)
        if got is not None and isinstance(figure, int | float) \
                and abs(got.whole - figure) <= 1e-9:
            out[label] = got
    return out


def headline_parts(results: Mapping[str, Any], metric: str) -> dict[str, Parts]:
    """The per-sample powers ``run``'s evaluate kept for ``metric`` (label -> parts, of
    ``plan`` and ``a8_w8``): those whose pooled figure is the result's ``metric`` (within
    1e-6 dB); an older ``evaluate.json`` keeps none (then {})."""
    out: dict[str, Parts] = {}
    for label in COMPARED:
        r = results.get(label) or {}
        kept = r.get(POWERS) or {}
        got = parts_of(kept) if kept.get("metric") == metric else None
        figure = (r.get("metrics") or {}).get(metric)
        if got is None or not isinstance(figure, int | float):
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            pooled = pooled_db(got)
        if np.isfinite(pooled) and abs(pooled - figure) <= 1e-6:
            out[label] = got
    return out


def _margin(metric: str, unit: str, plan: dict[str, Any], uni: dict[str, Any],
            parts: Mapping[str, Parts], left: Mapping[str, LeftOut]
            ) -> tuple[float, str, str]:
    """(how much worse is still noise, its words, where it comes from) for this metric's
    two held-out figures."""
    if all(k in left for k in COMPARED):
        got = left_out_noise(left["a8_w8"], left["plan"])  # a8_w8 - plan
        if got is not None:
            return (*got, "jackknife")
    key = items_key(metric)
    if plan.get(key) and uni.get(key):
        half = share_noise(float(uni[metric]), float(plan[metric]), int(uni[key]), "items",
                           n_after=int(plan[key]))
        if half is not None:
            why = "" if not left else (
                f" (not over {next(iter(left.values())).unit}: kept for one figure only, "
                "under 3 of them, or a figure not finite with one left out)")
            return half[0], half[1] + why, "binomial"
    if unit == "dB" or is_db(metric):
        if all(k in parts for k in COMPARED):
            got = db_noise(parts["plan"], parts["a8_w8"])  # plan - a8_w8
            if got is not None:
                return (*got, "jackknife")
            why = ("its per-sample powers give none: fewer than 3 samples, samples that "
                   "differ, or one sample holding all of a power")
        else:
            why = (f"evaluate.json keeps no per-sample powers of {metric} for both (a run "
                   "folder written before they were kept, or a figure they are not kept "
                   "for)")
        return TIE_MARGIN, f"the {TIE_MARGIN:g} dB margin, no noise estimate: {why}", "margin"
    return 0.0, "any difference: no noise estimate of this figure", "none"
