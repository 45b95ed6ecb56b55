"""The noise of a dB figure: the jackknife bound of a paired SQNR difference.

A figure in dB pooled over independent units (``10 log10(sum s / sum n)``, or the lowest
of several such columns: the worst output's SQNR, the worst channel's) has a sampling
noise of its own, as a share has its binomial one (:func:`quantscope.tasks.shares.share_noise`).
Two figures measured on the same units are paired: their difference is estimated with
the jackknife over the units (leave one unit out, the figure of each recomputed from the
sums left, Student t with ``units - 1`` degrees of freedom). The one place this is
computed: a rewrite's tiebreak (:mod:`quantscope.rewrites.tie`), the planner's choice
between measured plans without a goal (:func:`quantscope.plan.pareto.noise`) and ``run``'s
check of the plan against uniform a8_w8 held out (:mod:`quantscope.pipeline.held_out`)
read it.

==============  ========================================================================
parts           per unit the signal and noise power (:class:`Parts`): one column (the
                figure is their pooled ratio) or ``k`` columns (``[units, k]``: the
                figure is the lowest column's pooled ratio: ``sqnr_db`` over several
                outputs, ``sqnr_db_channel_min`` over channels, ``psnr_db`` over
                several image outputs); a PSNR's are ``peak² x values`` and the summed
                squared error per sample (its peak held at the whole data's when a unit
                is left out: the peak cancels in a paired difference of one output)
unit            what is left out at a time: a row (``rows``), a sample (``samples``), a
                query and its document (``pairs``, :func:`pair_powers`), the rows of one
                source (``faces``, ``photos``, a person's: ``people``: :func:`unit_powers`;
                per-sample parts summed per unit: :func:`group_parts`)
interval        :func:`gain_interval`: the difference ``after - before`` in dB with
                one-sided :data:`CONFIDENCE` bounds, and the outcome against a margin;
                :func:`mean_interval`: the mean of such differences on disjoint units
                (a repair's 2-fold out-of-sample gain: :mod:`quantscope.stages.offer_holdout`);
                :func:`left_out_interval`: the same jackknife (one formula) for a figure
                that is no pooled dB (a share), from its value with each unit left out
                (:class:`LeftOut`, computed by the task: :mod:`quantscope.tasks.left_out`)
noise         :func:`db_noise`: the half width of that bound, in words, for a rule that
                asks whether a difference is beyond noise (the planner's ``not_worse``);
                :func:`left_out_noise`: the same for a share from its left-out values
none            fewer than 3 units, units that differ, or a power of zero left by a unit
                (an infinite figure): no estimate; the caller says so
kept            :func:`parts_record` / :func:`parts_of`: the parts as a JSON file keeps
                them (``run``'s ``evaluate.json`` ``sample_powers``), read back bit for
                bit, of the columns the jackknife reads only (:func:`jackknife_columns`:
                the same figure and interval from a few floats per unit)
==============  ========================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from quantscope.numerics import t_quantile
from quantscope.tasks.shares import SHARE_CONFIDENCE

CONFIDENCE = SHARE_CONFIDENCE  # one-sided, as a share's noise


class Parts(NamedTuple):
    """Per independent unit: signal power, noise power (``[units]``, or ``[units, k]``
    for a figure that is the lowest of ``k`` pooled columns), and what a unit is
    (``rows``, ``pairs`` where a query row and its document row are one unit,
    ``samples``). A plain ``(signal, noise)`` tuple is read as rows."""

    signal: np.ndarray
    noise: np.ndarray
    unit: str = "rows"


def row_powers(ref: np.ndarray, test: np.ndarray) -> Parts:
    """Each row's signal power ``sum ref**2`` and noise power ``sum (ref - test)**2``
    (float64): the parts whose pooled ratio is :func:`quantscope.numerics.sqnr_db` of the
    whole arrays."""
    r = np.asarray(ref, np.float64).reshape(len(ref), -1)
    d = r - np.asarray(test, np.float64).reshape(len(test), -1)
    return Parts(np.sum(r * r, axis=1), np.sum(d * d, axis=1))


def pair_powers(ref: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> Parts:
    """Each pair's powers where row ``i`` of every array in ``ref`` (the queries', the
    documents') belongs to pair ``i``: the rows' :func:`row_powers` summed across the
    arrays. The pooled figure is the same as over all rows; the jackknife then leaves out
    one pair (both its rows) at a time, not one row: a query and its document are not
    independent samples."""
    rows = [row_powers(r, t) for r, t in zip(ref, test, strict=True)]
    n = len(rows[0].signal)
    if any(len(p.signal) != n for p in rows):
        raise ValueError(f"pair_powers: arrays of {[len(p.signal) for p in rows]} rows")
    return Parts(np.sum([p.signal for p in rows], axis=0),
                 np.sum([p.noise for p in rows], axis=0), "pairs")


def unit_powers(ref: np.ndarray, test: np.ndarray, units: Sequence[Any], unit: str) -> Parts:
    """Each unit's powers where row ``i`` of ``ref`` and ``test`` belongs to unit
    ``units[i]`` (rows of one source that are no independent samples: a face's chips, a
    photo's views): the rows' :func:`row_powers` summed per unit, the units in sorted
    order. The pooled figure is the same as over all rows; the jackknife then leaves out
    one unit (all its rows) at a time, as :func:`pair_powers` does a pair."""
    rows = row_powers(ref, test)
    labels = np.asarray(units)
    if labels.shape != (len(rows.signal),):
        raise ValueError(f"unit_powers: {labels.shape} unit labels for "
                         f"{len(rows.signal)} rows")
    names, index = np.unique(labels, return_inverse=True)
    signal, noise = np.zeros(len(names)), np.zeros(len(names))
    np.add.at(signal, index, rows.signal)
    np.add.at(noise, index, rows.noise)
    return Parts(signal, noise, unit)


def _columns(a: Any) -> np.ndarray:
    x = np.asarray(a, np.float64)
    return x[:, None] if x.ndim == 1 else x


def _figure(signal: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The figure of summed powers (last axis: the columns): the lowest column's dB."""
    return np.min(10.0 * np.log10(signal / noise), axis=-1)


def side_by_side(parts: Sequence[Parts]) -> Parts | None:
    """Several figures' parts on the same units as the columns of one (``[units, k]``):
    the parts of the lowest of the figures (the worst output's); None where their units
    differ in count or kind."""
    if not parts or len({len(p.signal) for p in parts}) != 1 or len({p.unit for p in parts}) != 1:
        return None
    return Parts(np.concatenate([_columns(p.signal) for p in parts], axis=1),
                 np.concatenate([_columns(p.noise) for p in parts], axis=1), parts[0].unit)


def pooled_db(parts: Parts) -> float:
    """The figure the parts pool to: ``10 log10(sum signal / sum noise)``, the lowest
    column's where there are several."""
    s, n = _columns(parts[0]), _columns(parts[1])
    return float(_figure(s.sum(axis=0), n.sum(axis=0)))


def gain_interval(after: Parts, before: Parts, *, margin: float = 0.0,
                  confidence: float = CONFIDENCE) -> dict[str, Any] | None:
    """The pooled dB gain of ``after`` over ``before`` (paired units) with one-sided
    ``confidence`` bounds from the jackknife, and the outcome against ``margin``:
    ``better`` (lower bound above it), ``not better`` (upper bound at or below it) or
    ``tie`` (the interval straddles it). None: fewer than 3 units, unequal units or
    columns, or a zero power (an infinite figure: the point rule decides). ``unit`` in
    the result: what was left out one at a time (:class:`Parts`)."""
    s_a, n_a, s_b, n_b = (_columns(p) for p in (*after[:2], *before[:2]))
    unit = after.unit if isinstance(after, Parts) else "rows"
    rows = len(s_a)
    if rows < 3 or not (s_a.shape == n_a.shape and s_b.shape == n_b.shape
                        and len(s_b) == rows):
        return None
    stacked = (s_a, n_a, s_b, n_b)
    totals = [x.sum(axis=0) for x in stacked]
    left = [t[None, :] - x for t, x in zip(totals, stacked, strict=True)]  # each unit out
    if not all(np.all(t > 0) and np.all(x > 0) for t, x in zip(totals, left, strict=True)):
        return None
    gain = float(_figure(totals[0], totals[1]) - _figure(totals[2], totals[3]))
    loo = _figure(left[0], left[1]) - _figure(left[2], left[3])
    return _jackknife(gain, loo, unit, margin=margin, confidence=confidence)


def _jackknife(gain: float, loo: np.ndarray, unit: str, *, margin: float,
               confidence: float) -> dict[str, Any]:
    """The one jackknife interval: ``gain`` (a paired difference of a figure) and ``loo``
    (the same difference with each unit left out), one-sided ``confidence`` bounds from
    the jackknife standard error, Student t with ``units - 1`` degrees of freedom."""
    rows = len(loo)
    se = float(np.sqrt((rows - 1) / rows * np.sum((loo - loo.mean()) ** 2)))
    half = t_quantile(confidence, rows - 1) * se
    lower, upper = gain - half, gain + half
    outcome = "better" if lower > margin else "not better" if upper <= margin else "tie"
    return {"n": rows, "unit": unit, "difference": gain, "lower": lower, "upper": upper,
            "half_width": half, "confidence": confidence, "margin": margin,
            "outcome": outcome}


class LeftOut(NamedTuple):
    """A figure that is no pooled dB (a share: a match rate, a top-1 agreement) with its
    value recomputed with each unit left out (``left``: ``[units]``, the units in one
    order for the figures that are paired; ``unit``: what a unit is, as :class:`Parts`'),
    by the task that computes the figure (:mod:`quantscope.tasks.left_out`)."""

    whole: float
    left: np.ndarray
    unit: str


def left_out_interval(after: LeftOut, before: LeftOut, *, margin: float = 0.0,
                      confidence: float = CONFIDENCE) -> dict[str, Any] | None:
    """The difference ``after - before`` of a figure on the same units with one-sided
    ``confidence`` jackknife bounds (as :func:`gain_interval` for a pooled dB figure: the
    one formula); None: fewer than 3 units, units that differ, or a figure that is not
    finite with a unit left out (a share of no items)."""
    a, b = np.asarray(after.left, np.float64), np.asarray(before.left, np.float64)
    if len(a) < 3 or a.shape != b.shape or after.unit != before.unit:
        return None
    if not all(np.isfinite(x).all() for x in (a, b, after.whole, before.whole)):
        return None
    return _jackknife(float(after.whole) - float(before.whole), a - b, after.unit,
                      margin=margin, confidence=confidence)


def db_noise(reference: Parts, other: Parts, *, confidence: float = CONFIDENCE
             ) -> tuple[float, str] | None:
    """The one-sided ``confidence`` noise of the dB difference ``reference - other`` on
    the same units (the half width of :func:`gain_interval`'s bound), and its words; None
    where there is no estimate (see :func:`gain_interval`)."""
    return _noise(gain_interval(reference, other, confidence=confidence), confidence,
                  "{:.3g} dB", "{:+.3f} dB", "")


def left_out_noise(reference: LeftOut, other: LeftOut, *, confidence: float = CONFIDENCE
                   ) -> tuple[float, str] | None:
    """The one-sided ``confidence`` noise of the difference ``reference - other`` of a
    figure that is no pooled dB (a share: a face verification's decision agreement) on the
    same units, from its value with each unit left out (the half width of
    :func:`left_out_interval`'s bound, as :func:`db_noise` for a dB figure), and its words;
    None where there is no estimate (see :func:`left_out_interval`)."""
    return _noise(left_out_interval(reference, other, confidence=confidence), confidence,
                  "{:.4g}", "{:+.4g}", ", each left out in turn")


def _noise(iv: dict[str, Any] | None, confidence: float, half_fmt: str, diff_fmt: str,
           how: str) -> tuple[float, str] | None:
    """An interval's half width and its words (:func:`db_noise`, :func:`left_out_noise`)."""
    if iv is None:
        return None
    half = float(iv["half_width"])
    return half, (f"one-sided {confidence:.0%} jackknife noise {half_fmt.format(half)} of the "
                  f"paired difference {diff_fmt.format(iv['difference'])} over {iv['n']} "
                  f"{iv['unit']}{how} (Student t, {iv['n'] - 1} degrees of freedom)")


def group_parts(parts: Parts, units: Sequence[Any], unit: str) -> Parts:
    """``parts`` with one row per sample summed per unit, where sample ``i`` belongs to
    unit ``units[i]`` (a face's chips: no independent samples), the units in sorted
    order: the pooled figure is the same; the jackknife then leaves out one unit at a time
    (as :func:`unit_powers` does from outputs)."""
    s, n = _columns(parts[0]), _columns(parts[1])
    labels = np.asarray(units)
    if labels.shape != (len(s),) or s.shape != n.shape:
        raise ValueError(f"group_parts: {labels.shape} unit labels for {s.shape} powers")
    names, index = np.unique(labels, return_inverse=True)
    signal, noise = np.zeros((len(names), s.shape[1])), np.zeros((len(names), s.shape[1]))
    np.add.at(signal, index, s)
    np.add.at(noise, index, n)
    return Parts(signal, noise, unit)


def mean_interval(intervals: Sequence[Mapping[str, Any]], *,
                  confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The mean of several paired dB differences measured on disjoint units (each a
    :func:`gain_interval` at ``confidence``: a fold's gain on its own held-out half) with
    one-sided ``confidence`` bounds: each difference's jackknife standard error (its half
    width over its Student t quantile), the mean's ``sqrt(sum se_i^2) / k`` (independent
    units), Student t with the Welch-Satterthwaite degrees of freedom."""
    k = len(intervals)
    if not k:
        raise ValueError("mean_interval: no intervals")
    ses = [float(iv["half_width"]) / t_quantile(float(iv["confidence"]), int(iv["n"]) - 1)
           for iv in intervals]
    dofs = [int(iv["n"]) - 1 for iv in intervals]
    var = sum(se * se for se in ses)
    quartic = sum(se**4 / d for se, d in zip(ses, dofs, strict=True))
    dof = max(1, int(var * var / quartic)) if quartic > 0 else sum(dofs)
    mean = sum(float(iv["difference"]) for iv in intervals) / k
    half = t_quantile(confidence, dof) * float(np.sqrt(var)) / k
    return {"mean": mean, "lower": mean - half, "upper": mean + half, "half_width": half,
            "dof": dof, "confidence": confidence, "n": [int(iv["n"]) for iv in intervals],
            "unit": str(intervals[0]["unit"])}


def jackknife_columns(parts: Parts) -> Parts:
    """``parts`` reduced to the columns the jackknife reads: the one the pooled figure is
    the lowest of, each one a figure with one unit left out is the lowest of, and any a
    unit's leaving empties (then :func:`gain_interval` gives no estimate, as with all).
    The figure, every left-out figure and so every interval are those of all the columns
    (a lowest-of-``k`` figure over many channels keeps a few floats per unit, not ``k``)."""
    s, n = _columns(parts[0]), _columns(parts[1])
    unit = parts.unit if isinstance(parts, Parts) else "rows"
    if s.shape != n.shape or s.shape[1] <= 1:
        return Parts(s, n, unit)
    ls, ln = s.sum(axis=0)[None, :] - s, n.sum(axis=0)[None, :] - n
    with np.errstate(divide="ignore", invalid="ignore"):
        whole = 10.0 * np.log10(s.sum(axis=0) / n.sum(axis=0))
        left = 10.0 * np.log10(ls / ln)
    keep = np.zeros(s.shape[1], bool)
    keep[np.argmin(np.nan_to_num(whole, nan=np.inf))] = True
    keep[np.argmin(np.nan_to_num(left, nan=np.inf), axis=1)] = True
    keep |= np.any((ls <= 0) | (ln <= 0), axis=0) | ~np.isfinite(whole)
    return Parts(s[:, keep], n[:, keep], unit)


def parts_record(parts: Parts) -> dict[str, Any]:
    """``parts`` as a JSON file keeps them: ``[units, k]`` lists of the float64 powers as
    they are (a JSON float reads back bit for bit), and what a unit is."""
    return {"unit": parts.unit, "signal": _columns(parts.signal).tolist(),
            "noise": _columns(parts.noise).tolist()}


def parts_of(record: Any) -> Parts | None:
    """:func:`parts_record` read back; None where ``record`` is none (an older file's
    missing entry) or its two arrays are not of one ``[units, k]`` shape."""
    if not isinstance(record, Mapping) or not {"signal", "noise"} <= set(record):
        return None
    try:
        s, n = (np.asarray(record[k], np.float64) for k in ("signal", "noise"))
    except (TypeError, ValueError):
        return None
    if s.ndim != 2 or s.shape != n.shape or not s.size:
        return None
    return Parts(s, n, str(record.get("unit", "samples")))


class WithParts(dict):  # type: ignore[type-arg]
    """A measurement's metrics (name -> figure) with the per-sample powers of its dB
    figures beside them (``parts``: metric -> :class:`Parts`) and the shares' values with
    each unit left out (``left``: metric -> :class:`LeftOut`, face data's people), which the
    planner's evaluator reads after each call (:func:`quantscope.plan.joint.sample_parts`)."""

    def __init__(self, values: Mapping[str, float], parts: Mapping[str, Parts],
                 left: Mapping[str, LeftOut] | None = None) -> None:
        super().__init__(values)
        self.parts = dict(parts)
        self.left = dict(left or {})
