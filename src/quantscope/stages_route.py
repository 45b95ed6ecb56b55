"""The names ``quantscope.stages_route`` had, kept importable: length buckets now live
where each part belongs.

=========================================  ==============================================
:mod:`quantscope.plan.buckets`             which bucket a text runs on (``route``), the
                                           exact choice (``solve``, ``solve_budget``,
                                           ``solve_legal``): pure numpy
:mod:`quantscope.plan.deployment`          ``Bucket``, ``Deployment``, ``Candidate``; the
                                           deployment and candidates files' checks,
                                           ``deployment_file``
:mod:`quantscope.plan.deployment_results`  ``RouteResult``, ``DeploymentChoice`` (frozen;
                                           ``to_dict()`` is the JSON the commands write)
:mod:`quantscope.stages.route`             ``quantscope route``: ``read_deployment``,
                                           ``routed_outputs``, ``deployment_costs``,
                                           ``evaluate_deployment``, ``deployment_verdict``
:mod:`quantscope.stages.buckets`           ``quantscope buckets``: ``read_candidates``,
                                           ``choose_deployment`` (a pipeline of steps)
:mod:`quantscope.report.deployment`        the console forms
=========================================  ==============================================

The functions here whose results were dicts still give and take those dicts (the JSON
forms: ``evaluate_deployment``, ``deployment_costs``, ``deployment_verdict``,
``choose_deployment``, ``deployment_file``, ``format_deployment``, ``format_choice``), so
older callers (tests) run unchanged; the CLI and new code use the typed
modules above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from quantscope.model.load import Model
from quantscope.plan import deployment as _files
from quantscope.plan.buckets import (
    CHOICE_LENGTHS,
    COST_LEVELS,
    MAX_BUCKETS,
    route,
)
from quantscope.plan.buckets import allocation_figures as _allocation_figures
from quantscope.plan.buckets import solve as _solve
from quantscope.plan.buckets import solve_budget as _solve_budget
from quantscope.plan.deployment import (
    BUCKET_KEYS,
    CANDIDATE_KEYS,
    Bucket,
    Candidate,
    Deployment,
)
from quantscope.plan.deployment import first_repeat as _first_repeat
from quantscope.plan.deployment import one_target as _one_target
from quantscope.plan.deployment_results import DeploymentChoice, RouteResult
from quantscope.report import deployment as _console
from quantscope.report.deployment import HEADLINE
from quantscope.stages import buckets as _buckets
from quantscope.stages import route as _route
from quantscope.stages.buckets import read_candidates
from quantscope.stages.route import (
    Routed,
    _rows_by_batch,
    read_deployment,
    routed_outputs,
)
from quantscope.stages.route import check_compatible as _check_compatible
from quantscope.stages.route import cost_unit as _cost_unit
from quantscope.stages.route import open_entry as _open_entry
from quantscope.tasks.registry import TextTask
from quantscope.tasks.registry import retrieval_figures as _retrieval_figures
from quantscope.types import Dataset

__all__ = [
    "BUCKET_KEYS", "CANDIDATE_KEYS", "CHOICE_LENGTHS", "COST_LEVELS", "HEADLINE", "MAX_BUCKETS",
    "Bucket", "Candidate", "Deployment", "Routed", "choose_deployment", "deployment_costs",
    "deployment_file", "deployment_verdict", "evaluate_deployment", "format_choice",
    "format_deployment", "read_candidates", "read_deployment", "route", "routed_outputs",
]

# private names of the old module, kept for callers that reached them (tests: the solvers)
_PRIVATE = (_allocation_figures, _solve, _solve_budget, _first_repeat, _one_target,
            _check_compatible, _cost_unit, _open_entry, _rows_by_batch, _retrieval_figures)


def deployment_costs(reference: Model, deployment: Deployment) -> list[dict[str, Any]]:
    """:func:`quantscope.stages.route.deployment_costs`, each bucket's as its JSON dict."""
    return [c.to_dict() for c in _route.deployment_costs(reference, deployment)]


def evaluate_deployment(
    reference: Model, data: Dataset, deployment: Deployment, *, progress: bool = False,
) -> dict[str, Any]:
    """:func:`quantscope.stages.route.evaluate_deployment` as the JSON dict ``route
    --json`` writes."""
    return _route.evaluate_deployment(reference, data, deployment, progress=progress).to_dict()


def deployment_verdict(result: dict[str, Any], *, max_cost: float | None = None,
                       goal: float | None = None) -> dict[str, Any] | None:
    """:func:`quantscope.stages.route.deployment_verdict` of a route result's dict, as a
    dict (None when neither ``max_cost`` nor ``goal`` is asked)."""
    v = _route.deployment_verdict(RouteResult.from_dict(result), max_cost=max_cost, goal=goal)
    return None if v is None else v.to_dict()


def format_deployment(result: dict[str, Any]) -> str:
    """:func:`quantscope.report.deployment.format_deployment` of a route result's dict."""
    return _console.format_deployment(RouteResult.from_dict(result))


def choose_deployment(
    reference: Model, data: Dataset, candidates: tuple[Candidate, ...], target_name: str, *,
    max_cost: float, seq_lens: tuple[int, ...] = CHOICE_LENGTHS,
    max_buckets: int = MAX_BUCKETS, skip_pairs: int = 0, progress: bool = False,
) -> dict[str, Any]:
    """:func:`quantscope.stages.buckets.choose_deployment` as the JSON dict ``buckets
    --json`` writes."""
    return _buckets.choose_deployment(
        reference, data, candidates, target_name, max_cost=max_cost, seq_lens=seq_lens,
        max_buckets=max_buckets, skip_pairs=skip_pairs, progress=progress).to_dict()


def deployment_file(choice: dict[str, Any], out: str | Path) -> dict[str, Any]:
    """:func:`quantscope.plan.deployment.deployment_file` of a choice's dict."""
    return _files.deployment_file(DeploymentChoice.from_dict(choice), out)


def format_choice(choice: dict[str, Any]) -> str:
    """:func:`quantscope.report.deployment.format_choice` of a choice's dict."""
    return _console.format_choice(DeploymentChoice.from_dict(choice))


def _only_rows(task: TextTask, rows: np.ndarray) -> TextTask:
    return task.only_texts(rows)
