"""The results of ``quantscope route`` (:class:`RouteResult`) and ``quantscope buckets``
(:class:`DeploymentChoice`): frozen values whose ``to_dict()`` is the JSON the commands
write (key for key, in order) and whose ``from_dict`` reads that JSON back.

The files carry no ``format`` tag (they never had one; ``quantscope report`` tells them
by their keys: ``longest_alone`` a route result, ``candidates`` a choice).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

Problem = Mapping[str, Any]  # one ``check`` problem as ``plan_problems`` gives it


# ---------------------------------------------------------------- quantscope route


@dataclass(frozen=True)
class BucketCost:
    """A bucket's plan at its own length: legality, its cost relative to its own uniform
    a8_w8 (``cost_own``) and to the reference's uniform a8_w8 at the longest length
    (``cost``)."""

    seq_len: int
    cost_own: float
    cost: float
    legal: bool
    problems: tuple[Problem, ...]  # the errors
    warnings: tuple[Problem, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "cost_own": self.cost_own, "cost": self.cost,
                "legal": self.legal, "problems": list(self.problems),
                "warnings": list(self.warnings)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BucketCost:
        return cls(seq_len=d["seq_len"], cost_own=d["cost_own"], cost=d["cost"],
                   legal=d["legal"], problems=tuple(d["problems"]),
                   warnings=tuple(d["warnings"]))


@dataclass(frozen=True)
class RoutedBucket:
    """One bucket of a measured deployment: its cost, files, share of the texts, plan (its
    file form) and the QDQ writer's notes."""

    cost: BucketCost
    files: Mapping[str, str]  # model, stats, plan as the deployment file names them
    model: str  # the model as opened
    share: float
    texts: int
    plan: Mapping[str, Any]  # ``plan_to_dict`` of the bucket's plan
    notes: tuple[str, ...]

    @property
    def seq_len(self) -> int:
        return self.cost.seq_len

    def to_dict(self) -> dict[str, Any]:
        return {**self.cost.to_dict(), "files": dict(self.files), "model": self.model,
                "share": self.share, "texts": self.texts, "plan": dict(self.plan),
                "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RoutedBucket:
        return cls(cost=BucketCost.from_dict(d), files=dict(d["files"]), model=d["model"],
                   share=d["share"], texts=d["texts"], plan=dict(d["plan"]),
                   notes=tuple(d["notes"]))


@dataclass(frozen=True)
class LongestAlone:
    """The longest bucket alone on every text (one compiled model), for comparison."""

    seq_len: int
    cost: float
    metrics: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "cost": self.cost, "metrics": dict(self.metrics)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LongestAlone:
        return cls(seq_len=d["seq_len"], cost=d["cost"], metrics=dict(d["metrics"]))


@dataclass(frozen=True)
class RouteVerdict:
    """Whether the routed deployment is legal, within ``max_cost`` (mean) and at ``goal``
    (the task's metric); the ``max_cost`` and ``goal`` parts only when asked."""

    legal: bool
    metric: str
    value: float | None
    met: bool
    max_cost: float | None = None
    within_cost: bool | None = None
    goal: float | None = None
    goal_met: bool | None = None
    short_by: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"legal": self.legal, "metric": self.metric, "value": self.value}
        if self.max_cost is not None:
            out["max_cost"] = self.max_cost
            out["within_cost"] = self.within_cost
        if self.goal is not None:
            out["goal"] = self.goal
            out["goal_met"] = self.goal_met
            out["short_by"] = self.short_by
        out["met"] = self.met
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RouteVerdict:
        return cls(legal=d["legal"], metric=d["metric"], value=d["value"], met=d["met"],
                   max_cost=d.get("max_cost"), within_cost=d.get("within_cost"),
                   goal=d.get("goal"), goal_met=d.get("goal_met"), short_by=d.get("short_by"))


@dataclass(frozen=True)
class RouteResult:
    """A routed deployment measured against the FP32 reference (``quantscope route``)."""

    reference: str
    data: str
    target: str
    metric: str  # the task's headline metric
    deployment: str  # the deployment file
    seq_lens: tuple[int, ...]
    buckets: tuple[RoutedBucket, ...]
    cost_mean: float  # each bucket's cost weighted by its share of the texts
    cost_max: float
    legal: bool
    metrics: Mapping[str, float]  # of the routed outputs
    notes: tuple[str, ...]
    longest_alone: LongestAlone
    verdict: RouteVerdict | None = None

    def with_verdict(self, verdict: RouteVerdict | None) -> RouteResult:
        return replace(self, verdict=verdict)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "reference": self.reference, "data": self.data, "target": self.target,
            "metric": self.metric, "deployment": self.deployment,
            "seq_lens": list(self.seq_lens), "buckets": [b.to_dict() for b in self.buckets],
            "cost_mean": self.cost_mean, "cost_max": self.cost_max, "legal": self.legal,
            "metrics": dict(self.metrics), "notes": list(self.notes),
            "longest_alone": self.longest_alone.to_dict(),
        }
        if self.verdict is not None:
            out["verdict"] = self.verdict.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RouteResult:
        v = d.get("verdict")
        return cls(
            reference=d["reference"], data=d["data"], target=d["target"], metric=d["metric"],
            deployment=d["deployment"], seq_lens=tuple(d["seq_lens"]),
            buckets=tuple(RoutedBucket.from_dict(b) for b in d["buckets"]),
            cost_mean=d["cost_mean"], cost_max=d["cost_max"], legal=d["legal"],
            metrics=dict(d["metrics"]), notes=tuple(d["notes"]),
            longest_alone=LongestAlone.from_dict(d["longest_alone"]),
            verdict=None if v is None else RouteVerdict.from_dict(v))


# ---------------------------------------------------------------- quantscope buckets


@dataclass(frozen=True)
class ChosenBucket:
    """One chosen compiled length: its candidate, cost, share of the selection texts and
    their mean cosine to FP32 (None when no selection text runs on it)."""

    seq_len: int
    candidate: str
    paths: Mapping[str, str]  # the candidate's model, stats and plan as opened
    cost: float
    share: float
    texts: int
    cosine_mean: float | None
    legal: bool

    def to_dict(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "candidate": self.candidate, "paths": dict(self.paths),
                "cost": self.cost, "share": self.share, "texts": self.texts,
                "cosine_mean": self.cosine_mean, "legal": self.legal}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChosenBucket:
        return cls(seq_len=d["seq_len"], candidate=d["candidate"], paths=dict(d["paths"]),
                   cost=d["cost"], share=d["share"], texts=d["texts"],
                   cosine_mean=d["cosine_mean"], legal=d["legal"])


@dataclass(frozen=True)
class CandidateFigures:
    """One candidate alone: its mean cosine on the selection texts, its cost at the longest
    length, and its legality at the lengths the choice asked about."""

    cosine_mean: float
    cost_at_longest: float
    legal_lengths_checked: Mapping[str, bool]  # str(seq_len) -> legal

    def to_dict(self) -> dict[str, Any]:
        return {"cosine_mean": self.cosine_mean, "cost_at_longest": self.cost_at_longest,
                "legal_lengths_checked": dict(self.legal_lengths_checked)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CandidateFigures:
        return cls(cosine_mean=d["cosine_mean"], cost_at_longest=d["cost_at_longest"],
                   legal_lengths_checked=dict(d["legal_lengths_checked"]))


@dataclass(frozen=True)
class DeploymentChoice:
    """Bucket lengths and a candidate per bucket within ``max_cost`` (``quantscope
    buckets``), with what it was chosen on."""

    reference: str
    data: str
    target: str
    max_cost: float
    max_buckets: int
    lengths: tuple[int, ...]  # the lengths it chose from
    skip_pairs: int
    texts: int  # the selection texts
    buckets: tuple[ChosenBucket, ...]
    cost_mean: float
    cost_mean_se: float
    cosine_mean: float
    selection_metrics: Mapping[str, float]  # retrieval figures on the selection pairs
    candidates: Mapping[str, CandidateFigures]
    notes: tuple[str, ...]
    race: Mapping[str, Any] | None = None  # buckets --race: who stopped where (else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference, "data": self.data, "target": self.target,
            "max_cost": self.max_cost, "max_buckets": self.max_buckets,
            "lengths": list(self.lengths), "skip_pairs": self.skip_pairs, "texts": self.texts,
            "buckets": [b.to_dict() for b in self.buckets], "cost_mean": self.cost_mean,
            "cost_mean_se": self.cost_mean_se, "cosine_mean": self.cosine_mean,
            "selection_metrics": dict(self.selection_metrics),
            "candidates": {k: c.to_dict() for k, c in self.candidates.items()},
            "notes": list(self.notes),
            **({} if self.race is None else {"race": dict(self.race)}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeploymentChoice:
        return cls(
            reference=d["reference"], data=d["data"], target=d["target"],
            max_cost=d["max_cost"], max_buckets=d["max_buckets"], lengths=tuple(d["lengths"]),
            skip_pairs=d["skip_pairs"], texts=d["texts"],
            buckets=tuple(ChosenBucket.from_dict(b) for b in d["buckets"]),
            cost_mean=d["cost_mean"], cost_mean_se=d.get("cost_mean_se", 0.0),
            cosine_mean=d["cosine_mean"], selection_metrics=dict(d.get("selection_metrics") or {}),
            candidates={k: CandidateFigures.from_dict(c) for k, c in d["candidates"].items()},
            notes=tuple(d["notes"]), race=d.get("race"))
