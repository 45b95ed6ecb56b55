"""The independent units of a task's samples, and a figure recomputed with each left out.

A pooled dB figure has its noise from its per-unit powers (:mod:`quantscope.tasks.db_noise`);
a share (a match rate, a top-1 agreement) or any other figure a task computes from all its
samples together has none there. Its noise by unit is the jackknife of the task's OWN
figure: the task's metrics recomputed on the samples of every unit but one, for each unit
(:func:`left_out_figures`; the interval: :func:`quantscope.tasks.db_noise.left_out_interval`,
the one jackknife formula), so the figure is computed in one place, the task.

==============  ======================================================================
unit            :func:`units_of`: face data's person (``people``: a person's photos
                and their chips are no independent samples, :mod:`quantscope.tasks.face_split`),
                else a face's chips (``faces``), else each sample (``samples``)
left out        face verification: the task on the other people's chips
                (:func:`quantscope.tasks.face_split.take_chips`: every pair with a chip
                of the person left out is dropped); a task whose metrics read each
                sample alone (``row_local``): the same task on the other samples' rows
none            a task that scores all samples together, outputs whose first axis is not
                the samples, a figure the task does not compute: no entry (the caller
                says there is no noise estimate)
cost            one scoring of the task's metrics per unit (no model is run): asked for
                by the repair offers' out-of-sample check (a few people a half) and, for
                a share on data whose units are not its samples (:func:`share_left_out`:
                face data's people), by the planner's measurements (each plan) and
                ``run``'s evaluate stage (the plan and uniform a8_w8 held out)
share noise     on such data a share's noise is this jackknife of the paired difference
                (:func:`quantscope.tasks.db_noise.left_out_noise`): the planner's
                no-goal choice (:func:`quantscope.plan.pareto.noise`) and ``run``'s
                held-out check (:mod:`quantscope.pipeline.held_out`); a pair spans two
                people and a person's pairs err together, so the binomial noise over
                pairs (:func:`quantscope.tasks.shares.share_noise`) is too small there.
                Where the left-out values are not at hand (an ``evaluate.json`` written
                before h71, under 3 people) the binomial, said as such; an evaluation
                cache entry stored without them is not read (its key names the units)
powers          a dB figure's per-sample powers summed per unit (:func:`unit_parts`),
                wherever they are measured (:func:`quantscope.analyze.measure.figure_parts`):
                the planner's no-goal choice, ``run``'s held-out check, a torch ranking
                and the offers' check all leave out one unit (a person) at a time
==============  ======================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quantscope.tasks.db_noise import LeftOut, Parts, group_parts
from quantscope.tasks.face_split import splits_by_people, take_chips
from quantscope.tasks.metric_inputs import MetricInputError
from quantscope.types import Outputs
from quantscope.units import is_db


def units_of(task: Any, rows: int) -> tuple[np.ndarray, str]:
    """Per sample (row) of ``task``'s data the unit it belongs to, and what a unit is
    (module table): the person where the task knows each chip's (``identity``), else the
    face (``faces``), else the sample itself."""
    for attr, unit in (("identity", "people"), ("faces", "faces")):
        labels = getattr(task, attr, None)
        if labels is not None and len(labels) == rows:
            return np.asarray(labels), unit
    return np.arange(rows), "samples"


# the units a figure's noise counts, in the keys of ``run``'s plan and evaluate stages on
# face data (pipeline.steps.noise_rules): a folder whose choice or held-out powers counted
# photos (before h69), or whose shares' noise counted pairs (before h71), runs them again
UNITS_KEY = "noise by person/2"


def unit_parts(parts: Parts, task: Any) -> Parts:
    """``parts`` (a dB figure's powers per sample, or per face: a verification's
    ``sample_parts``) summed per unit of ``task``'s data (:func:`units_of`): on face data
    a person's chips together (a person's photos are no independent samples), a face's
    chips where only the faces are known; parts of any other unit (``pairs``,
    ``photos``), already per person, or whose rows are not the samples: as given. The
    pooled figure is the same; the jackknife then leaves out one unit at a time."""
    n = len(parts[0])
    if parts.unit in ("rows", "samples"):
        labels, unit = units_of(task, n)
        return parts if unit == "samples" else group_parts(parts, labels, unit)
    people, faces = getattr(task, "identity", None), getattr(task, "faces", None)
    if parts.unit == "faces" and people is not None and faces is not None:
        names, first = np.unique(np.asarray(faces), return_index=True)  # the parts' order
        if len(names) == n and len(people) == len(faces):
            return group_parts(parts, np.asarray(people)[first], "people")
    return parts


def _rows(out: Outputs) -> list[int]:
    return [len(b[0]) if b else 0 for b in out.batches]


def take_output_rows(out: Outputs, keep: np.ndarray) -> Outputs | None:
    """The samples ``keep`` (indices in data order) of ``out``, batch by batch; None where
    an output's first axis is not its batch's samples."""
    batches, start = [], 0
    for b, n in zip(out.batches, _rows(out), strict=True):
        if any(len(a) != n for a in b):
            return None
        local = keep[(keep >= start) & (keep < start + n)] - start
        start += n
        if local.size:
            batches.append(tuple(np.asarray(a)[local] for a in b))
    return Outputs(names=out.names, batches=tuple(batches))


def _scores_each_unit(task: Any, rows: int) -> bool:
    """Whether ``task`` can score its data less one unit (module table): face verification
    over ``rows`` chips, or a task whose metrics read each sample alone."""
    if splits_by_people(task):
        return len(task.identity) == rows
    return bool(getattr(task, "row_local", False))


def _task_on(task: Any, keep: np.ndarray) -> Any:
    """``task`` on the samples ``keep`` (:func:`_scores_each_unit` holds)."""
    return take_chips(task, keep) if splits_by_people(task) else task


def left_out_figures(task: Any, ref: Outputs, test: Outputs, keys: Sequence[str]
                     ) -> dict[str, LeftOut]:
    """Each of ``keys`` that ``task`` computes on ``ref`` and ``test`` (FP32's and the
    measured model's outputs as the task keeps them), with its value recomputed with each
    unit left out (module table); a key the task does not compute, or data it cannot
    score without a unit (a unit left out leaves pairs of one kind only), is absent."""
    rows = sum(_rows(ref))
    if not keys or rows != sum(_rows(test)) or not _scores_each_unit(task, rows):
        return {}
    whole = task.metrics(ref, test).values
    wanted = [k for k in keys if k in whole]
    labels, unit = units_of(task, rows)
    left: dict[str, list[float]] = {k: [] for k in wanted}
    for u in np.unique(labels) if wanted else ():
        keep = np.flatnonzero(labels != u)
        r, t = take_output_rows(ref, keep), take_output_rows(test, keep)
        if r is None or t is None:
            return {}
        try:  # the other units may not hold what the figure needs (one person: no impostor)
            values = _task_on(task, keep).metrics(r, t).values
        except MetricInputError:
            return {}
        for k in wanted:
            left[k].append(float(values.get(k, np.nan)))
    return {k: LeftOut(float(whole[k]), np.asarray(left[k], np.float64), unit)
            for k in wanted}


def share_left_out(task: Any, metric: str) -> tuple[str, ...]:
    """``(metric,)`` where the share ``metric``'s noise goes over units other than its
    items (module table, ``share noise``): ``task``'s data knows each chip's person or
    face and the task scores it with one left out; else ``()`` (text, retrieval and any
    data whose units are its samples: the binomial over the items, as before)."""
    known = any(getattr(task, a, None) is not None for a in ("identity", "faces"))
    able = splits_by_people(task) or bool(getattr(task, "row_local", False))
    return (metric,) if metric and not is_db(metric) and known and able else ()


def left_out_record(figure: LeftOut, metric: str) -> dict[str, Any]:
    """``figure`` as a JSON file keeps it (``evaluate.json``, an evaluation cache entry):
    a few floats, one per unit."""
    return {"metric": metric, "unit": figure.unit, "whole": float(figure.whole),
            "left": [float(v) for v in figure.left]}


def left_out_of(record: Any, metric: str) -> LeftOut | None:
    """The :class:`LeftOut` of ``metric`` kept by :func:`left_out_record`; None: none
    kept, another metric's, or not readable (an older file)."""
    if not isinstance(record, dict) or record.get("metric") != metric:
        return None
    whole, left, unit = record.get("whole"), record.get("left"), record.get("unit")
    if not isinstance(whole, int | float) or not isinstance(left, list) \
            or not isinstance(unit, str) or not all(isinstance(v, int | float) for v in left):
        return None
    return LeftOut(float(whole), np.asarray(left, np.float64), unit)
