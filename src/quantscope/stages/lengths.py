"""Compiled lengths decided by ``quantscope run`` (its ``deploy`` stage): whether several
compiled lengths pay, the candidates at each length, the choice on the fit texts as
``quantscope buckets`` makes it, and its measurement on the held-out texts as ``quantscope
route`` makes it.

=================  ===================================================================
decide_lengths     buckets only when the data has short texts (at least
                   :data:`SHORT_SHARE` of the fit texts fit in a shorter length) AND the
                   model's cost depends on its length (uniform a8_w8 at the shortest
                   length costs less than at the longest); else one model, and why. With
                   ``--lengths auto`` the compiled lengths are chosen from the fine grid
                   :data:`quantscope.plan.buckets.CHOICE_LENGTHS` below the longest (as
                   ``quantscope buckets`` chooses: a text's error does not depend on its
                   padding, so more lengths cost only their legality checks), while the
                   candidates are made at a few (:data:`AUTO_LENGTHS`, at most
                   :data:`AUTO_BELOW` below the longest); given lengths serve as both
length_candidates  the planner's rule-made candidates at each candidate length (``plan
                   --max-legal --variants``: :mod:`quantscope.plan.candidates`), a plan
                   made at two lengths kept once, after the run's own plan
deploy_lengths     every candidate once on the fit texts (:mod:`quantscope.stages.buckets`
                   steps), the best allocation with up to ``max_buckets`` lengths and the
                   best single model at the longest length, each within the cost cap
                   with a margin: its fit texts' mean cost plus :data:`COST_Z` standard
                   errors at most ``--max-cost`` (the allocation's budget lowered until
                   it is: :func:`allocate_with_margin`), so that texts it has not seen
                   stay within the cap too; one model is kept when the
                   buckets do not lower the fit texts' mean error by more than two
                   standard errors of the paired difference; the kept deployment measured
                   on the held-out texts (:func:`quantscope.stages.route.evaluate_deployment`)
=================  ===================================================================

Switching between compiled models (loading, context switches) is not modelled: the cost
is each text's compiled model's cost, averaged over the texts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from quantscope.emulate.release import STAGE_RELEASE_GROWTH, release_memory
from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes
from quantscope.plan.buckets import CHOICE_LENGTHS, MAX_BUCKETS, route
from quantscope.plan.candidates import max_legal, variants
from quantscope.plan.deployment import Bucket, Candidate, Deployment
from quantscope.plan.deployment_results import DeploymentChoice, RouteResult
from quantscope.serde import plan_to_dict
from quantscope.stages import buckets as B
from quantscope.stages.route import Routed, cost_unit, evaluate_deployment, routed_outputs
from quantscope.targets.profile import Target
from quantscope.types import Dataset, QuantscopeError, Stats

AUTO_LENGTHS = (32, 64, 128, 256, 512)  # ``--lengths auto`` makes candidates at these
AUTO_BELOW = 2  # (at most this many of them below the longest length)
SHORT_SHARE = 0.1  # "short texts": at least this share of the fit texts fit a shorter length
CHEAPER = 0.99  # "the cost depends on the length": the shortest costs below this x the longest
SWITCHING = "switching between compiled models is not modelled"
COST_Z = 2.0  # the cap holds for fit mean cost + COST_Z standard errors (one-sided ~97.7 %)
MARGIN_TRIES = 8  # budgets tried by allocate_with_margin before it says none fits


@dataclass(frozen=True)
class LengthDecision:
    """Whether the run chooses among several compiled lengths, from which, and why."""

    buckets: bool
    seq_lens: tuple[int, ...]  # the lengths to choose from, increasing (the longest last)
    reason: str
    short_share: float | None = None  # share of the fit texts within the second longest
    candidate_lens: tuple[int, ...] = ()  # the lengths candidates are made at (() = seq_lens)

    @property
    def made_at(self) -> tuple[int, ...]:
        return self.candidate_lens or self.seq_lens


def choice_lengths(longest: int, given: tuple[int, ...] | None) -> tuple[int, ...]:
    """The lengths candidates are made at: ``given`` (those up to ``longest``), else
    :data:`AUTO_LENGTHS` below ``longest`` (at most :data:`AUTO_BELOW`); ``longest`` last."""
    if given:
        below = sorted({n for n in given if n < longest})
    else:
        below = [n for n in AUTO_LENGTHS if n < longest][-AUTO_BELOW:]
    return (*below, longest)


def routing_lengths(longest: int, given: tuple[int, ...] | None) -> tuple[int, ...]:
    """The compiled lengths to choose from: ``given`` as :func:`choice_lengths`, else the
    fine grid :data:`CHOICE_LENGTHS` and :data:`AUTO_LENGTHS` below ``longest``; ``longest``
    last."""
    if given:
        return choice_lengths(longest, given)
    return (*sorted({n for n in (*CHOICE_LENGTHS, *AUTO_LENGTHS) if n < longest}), longest)


def decide_lengths(model: Model, target: Target, token_lengths: np.ndarray | None, *,
                   longest: int | None, given: tuple[int, ...] | None = None) -> LengthDecision:
    """Buckets only when the data has short texts and the model's cost depends on its
    length (the module table); the reason in words either way."""
    if token_lengths is None or longest is None:
        return LengthDecision(False, (), "the data has no token counts (not text data): one "
                              "compiled model")
    lens = choice_lengths(longest, given)
    fine = routing_lengths(longest, given)
    if len(lens) < 2:
        return LengthDecision(False, lens, f"no compiled length below the longest ({longest}) "
                              "to choose: one compiled model")
    lengths = np.asarray(token_lengths)
    share = float(np.mean(lengths <= lens[-2]))
    if share < SHORT_SHARE:
        return LengthDecision(False, lens, f"the data has few short texts ({share:.0%} of the "
                              f"fit texts within {lens[-2]} tokens, below {SHORT_SHARE:.0%}): "
                              f"one compiled model at {longest}", share)
    short, long = cost_unit(model, lens[0], target), cost_unit(model, longest, target)
    if not short < CHEAPER * long:
        return LengthDecision(False, lens, f"the model's cost does not depend on its length "
                              f"(uniform a8_w8 at {lens[0]} costs {short / long:.2f}x that at "
                              f"{longest}; a fixed input shape?): one compiled model", share)
    made = (f" (candidates made at {', '.join(map(str, lens))})" if fine != lens else "")
    return LengthDecision(True, fine, f"{share:.0%} of the fit texts fit in {lens[-2]} tokens "
                          f"and uniform a8_w8 at {lens[0]} costs {short / long:.2f}x that at "
                          f"{longest}: compiled lengths chosen from "
                          f"{', '.join(map(str, fine))}{made}", share, candidate_lens=lens)


def length_candidates(model: Model, stats: Stats, target: Target, seq_lens: tuple[int, ...],
                      *, plan_target: str | None, own: Candidate | None = None,
                      allowed: frozenset[str] = frozenset(),
                      ) -> tuple[tuple[Candidate, ...], tuple[str, ...]]:
    """``own`` (the run's plan) first, then ``max_legal`` and its family variants made at
    each length (named ``NAME@LENGTH``; a plan made at an earlier length kept once), every
    plan naming ``plan_target``; notes on what was left out."""
    out = [own] if own is not None else []
    seen: set[str] = set()
    notes: list[str] = []
    for n in seq_lens:
        shapes = given_shapes(model, n)
        try:
            base = max_legal(model, target, shapes, allowed=allowed)
        except QuantscopeError as e:
            notes.append(f"at {n} tokens: {e}")
            continue
        more, left = variants(model, target, shapes, base, allowed=allowed)
        notes.extend(f"at {n} tokens: {x}" for x in left)
        for c in (base, *more):
            plan = replace(c.plan, target=plan_target)
            key = json.dumps(plan_to_dict(plan), sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                out.append(Candidate(name=f"{c.name}@{n}", model=model, stats=stats, plan=plan))
    return tuple(out), tuple(dict.fromkeys(notes))


@dataclass(frozen=True)
class CostMargin:
    """How the deployment kept its cost cap on the fit texts: ``fit_mean + z * fit_se``
    (the mean cost over the fit texts and its standard error) at most ``cap``, found
    with the allocation's budget lowered to ``budget``."""

    cap: float
    z: float
    fit_mean: float
    fit_se: float
    budget: float

    @property
    def bound(self) -> float:
        return self.fit_mean + self.z * self.fit_se

    @property
    def sentence(self) -> str:
        return (f"chosen with a margin: fit mean cost {self.fit_mean:.3f}x + {self.z:g} "
                f"standard errors ({self.fit_se:.3f}x) = {self.bound:.3f}x <= --max-cost "
                f"{self.cap:g}" + (f" (allocation budget lowered to {self.budget:.3f}x)"
                                    if self.budget < self.cap else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"cap": self.cap, "z": self.z, "fit_mean": self.fit_mean,
                "fit_se": self.fit_se, "bound": self.bound, "budget": self.budget,
                "rule": f"fit mean cost + {self.z:g} x its standard error <= the cap",
                "sentence": self.sentence}


def cost_figures(sel: B.Selection, costs: np.ndarray, alloc: B.Allocation
                 ) -> tuple[float, float]:
    """The allocation's mean cost over the selection texts and its standard error."""
    which = route(sel.lengths, tuple(sel.seq_lens[j] for j, _ in alloc.picks))
    per_text = np.asarray([costs[ci, j] for j, ci in alloc.picks])[which]
    n = len(per_text)
    se = float(np.std(per_text, ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    return float(np.mean(per_text)), se


def allocate_with_margin(allocate: Callable[[float], B.Allocation],
                         figures: Callable[[B.Allocation], tuple[float, float]], cap: float,
                         *, z: float = COST_Z) -> tuple[B.Allocation, CostMargin]:
    """``allocate(budget)`` at ``cap``, then at a budget lowered by the excess while the
    allocation's ``mean + z * se`` (``figures``) is over ``cap``: the cheapest budget
    tried is the first whose choice keeps the margin. One-line error when none of
    :data:`MARGIN_TRIES` budgets does (``allocate``'s own error when nothing fits)."""
    budget, mean, se = cap, float("nan"), float("nan")
    for _ in range(MARGIN_TRIES):
        try:
            alloc = allocate(budget)
        except QuantscopeError:
            if budget == cap:
                raise  # nothing fits the cap itself: allocate's own line
            break
        mean, se = figures(alloc)
        if mean + z * se <= cap + 1e-12:
            return alloc, CostMargin(cap=cap, z=z, fit_mean=mean, fit_se=se, budget=budget)
        budget = min(budget, mean) - (mean + z * se - cap) - 1e-9
        if budget <= 0:
            break
    raise QuantscopeError(
        f"no deployment keeps --max-cost {cap:g} with a margin of {z:g} standard errors of "
        f"its mean cost on the fit texts (the last tried: {mean:.3f}x + {z:g} x {se:.3f}x): "
        "raise --max-cost or give more pairs (a smaller standard error)")


@dataclass(frozen=True, eq=False)
class LengthsResult:
    """The deployment kept, what it was chosen against, and its held-out measurement."""

    choice: DeploymentChoice  # the best with up to max_buckets lengths (fit texts)
    one_model: DeploymentChoice  # the best single model at the longest length (fit texts)
    kept_one: bool
    reason: str  # why this deployment was kept
    deployment: Deployment  # the kept one
    route: RouteResult  # the kept one on the held-out texts
    cost_per_query: float | None  # held out (retrieval: queries and documents apart)
    cost_per_document: float | None
    cost_mean_se: float  # standard error of the held-out mean cost
    margin: CostMargin | None = None  # the cap's margin on the fit texts (None: no cap)
    # the held-out outputs ``route`` was scored on (pooled rows; not in the file form):
    # the deployment as its scripts carry it reuses them (``routed_outputs``' ``reuse``)
    routed: Routed | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"kept_one": self.kept_one, "reason": self.reason,
                "models": len(self.deployment.buckets),
                "seq_lens": list(self.deployment.seq_lens),
                "cost_per_query": self.cost_per_query,
                "cost_per_document": self.cost_per_document,
                "cost_mean": self.route.cost_mean, "cost_mean_se": self.cost_mean_se,
                "cost_margin": None if self.margin is None else self.margin.to_dict(),
                "switching": SWITCHING, "held_out": self.route.to_dict(),
                "chosen_fit": self.choice.to_dict(), "one_model_fit": self.one_model.to_dict()}


def deploy_lengths(reference: Model, fit: Dataset, held_out: Dataset,
                   candidates: tuple[Candidate, ...], target: Target, target_spec: str, *,
                   max_cost: float | None, seq_lens: tuple[int, ...],
                   max_buckets: int = MAX_BUCKETS, progress: bool = False,
                   cost_z: float = COST_Z, allowed: frozenset[str] = frozenset(),
                   ) -> LengthsResult:
    """Choose on ``fit`` (the module table), measure the kept deployment on ``held_out``.
    With ``max_cost`` each choice keeps its fit mean cost + ``cost_z`` standard errors
    within it (:func:`allocate_with_margin`). Without ``max_cost`` every candidate is
    affordable (the budget is the dearest one at the longest length; no margin). One-line
    errors when nothing is legal or within the cost."""
    sel = B.select_texts(reference, fit, candidates, seq_lens, max_buckets, 0)
    err = B.measure_errors(reference, candidates, sel, progress=progress)
    # the candidates' evaluators (sessions, activation cache, the shared arena's chunks)
    # are gone: given back whatever the resident set grew by since measure_errors' last
    # release (its releases per candidate leave the growth rule under its threshold, and
    # the held-out measurement then ran on top: minilm-l3, 100 pairs, 1,005 MiB resident
    # after the candidates against 241 once given back)
    release_memory(growth=STAGE_RELEASE_GROWTH)
    costs = B.length_costs(reference, candidates, target, sel.seq_lens, progress=progress)
    cap = float(costs[:, -1].max()) if max_cost is None else max_cost
    figures, margins = {}, {}
    for k in (max_buckets, 1):
        def alloc_at(budget: float, k: int = k) -> B.Allocation:
            return B.allocate(candidates, sel, err, costs, max_cost=budget, max_buckets=k,
                              target_name=target_spec, progress=progress, allowed=allowed)

        if max_cost is None:
            alloc, margins[k] = alloc_at(cap), None
        else:
            alloc, margins[k] = allocate_with_margin(
                alloc_at, lambda a: cost_figures(sel, costs, a), cap, z=cost_z)
        figures[k] = (alloc, B.summarise(reference, candidates, sel, err, costs, alloc,
                                         target_name=target_spec, max_cost=cap,
                                         max_buckets=k))
    many, one = figures[max_buckets], figures[1]
    kept_one, reason = _keep_one(sel, err, many[0], one[0])
    alloc = one[0] if kept_one else many[0]
    deployment = Deployment(buckets=tuple(
        Bucket(seq_len=sel.seq_lens[j], model=candidates[ci].model, stats=candidates[ci].stats,
               plan=candidates[ci].plan) for j, ci in alloc.picks),
        target=target_spec, source="deployment.json")
    release_memory(growth=STAGE_RELEASE_GROWTH)
    routed = routed_outputs(reference, held_out, deployment, progress=progress)
    measured = evaluate_deployment(reference, held_out, deployment, routed=routed)
    per_q, per_d, se = _held_out_costs(held_out, deployment, measured)
    return LengthsResult(choice=many[1], one_model=one[1], kept_one=kept_one, reason=reason,
                         deployment=deployment, route=measured, cost_per_query=per_q,
                         cost_per_document=per_d, cost_mean_se=se,
                         margin=margins[1 if kept_one else max_buckets], routed=routed)


def _per_text_errors(sel: B.Selection, err: B.Errors, alloc: B.Allocation) -> np.ndarray:
    which = route(sel.lengths, tuple(sel.seq_lens[j] for j, _ in alloc.picks))
    chosen = np.asarray([ci for _, ci in alloc.picks])[which]
    return err.errors[chosen, np.arange(len(sel.lengths))]


def _keep_one(sel: B.Selection, err: B.Errors, many: B.Allocation, one: B.Allocation
              ) -> tuple[bool, str]:
    """One model unless the buckets lower the mean error by more than two standard errors
    of the per-text (paired) difference on the fit texts."""
    if len(many.picks) == 1:
        return True, "the best deployment within the cost is one model at one length"
    diff = _per_text_errors(sel, err, one) - _per_text_errors(sel, err, many)
    n = len(diff)
    se = float(np.std(diff, ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    gain = float(np.mean(diff))
    lens = ", ".join(str(sel.seq_lens[j]) for j, _ in many.picks)
    if gain > 2 * se:
        return False, (f"{len(many.picks)} compiled lengths ({lens}) lower the fit texts' mean "
                       f"1 - cosine by {gain:.2e} (standard error {se:.2e}) against one model "
                       f"at {sel.seq_lens[-1]}")
    return True, (f"one model at {sel.seq_lens[-1]} is as good within the cost: the best "
                  f"{len(many.picks)} compiled lengths ({lens}) lower the fit texts' mean "
                  f"1 - cosine by {gain:.2e}, within two standard errors ({se:.2e})")


def _held_out_costs(held_out: Dataset, deployment: Deployment, measured: RouteResult
                    ) -> tuple[float | None, float | None, float]:
    """Mean cost per query and per document (retrieval pairs: queries first, then their
    documents) and the standard error of the mean cost, over the held-out texts."""
    lengths = np.asarray(held_out.token_lengths)
    per_text = np.asarray([b.cost.cost for b in measured.buckets])[
        route(lengths, deployment.seq_lens)]
    n = len(per_text)
    se = float(np.std(per_text, ddof=1) / np.sqrt(n)) if n > 1 else 0.0
    pairs = getattr(held_out.task, "n_pairs", None)
    if not pairs or 2 * pairs != n:
        return None, None, se
    return float(per_text[:pairs].mean()), float(per_text[pairs:].mean()), se


__all__ = ["AUTO_LENGTHS", "COST_Z", "SHORT_SHARE", "SWITCHING", "CostMargin", "LengthDecision",
           "LengthsResult", "allocate_with_margin", "choice_lengths", "cost_figures",
           "decide_lengths", "deploy_lengths", "length_candidates", "routing_lengths"]
