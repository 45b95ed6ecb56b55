"""Racing candidates on growing prefixes of the data: stop a candidate as soon as it is
worse than its rival by more than its confidence interval (pure numpy, no model).

=================  ===================================================================
samples            the caller's per-sample scores, higher is better: ``score(i, n)``
                   is candidate ``i``'s score on each of the first ``n`` samples (the
                   same ``n`` samples for every candidate, so differences are paired)
looks              ``min_samples``, twice that, ... while at most ``max_fraction`` of
                   the samples (:meth:`RaceRule.looks`): the race never reads the
                   whole set; its survivors get the full measurement
rival              the leader (the best mean of the candidates still running on this
                   prefix), or a fixed ``incumbent`` that never stops
stop               candidate ``i`` stops at look ``n`` when the one-sided upper bound
                   of its mean paired difference to the rival is below zero:
                   ``mean(d) + t(1 - a, n - 1) * sd(d) / sqrt(n) < 0``, ``d = s_i - s_rival``;
                   with a ``margin`` (the caller's decision rule lets a candidate that
                   much below its rival still win: the planner's noise allowance), below
                   minus that margin instead
confidence         ``a = (1 - confidence) / (looks x rivals)`` (Bonferroni over every
                   look and every other candidate), so a candidate as good as the
                   best on these samples is stopped with probability at most
                   ``1 - confidence``
t quantile         Student's t by the Cornish-Fisher expansion (four terms: within
                   0.002 of the exact quantile from 15 degrees of freedom)
=================  ===================================================================

Same inputs give the same result (no random numbers; ties go to the lower index).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from quantscope.numerics import t_quantile  # noqa: F401 - the one t quantile, re-exported
from quantscope.types import Plan

Margin = Callable[[float, float, int], float]
"""``margin(mean, rival's mean, total samples) -> m >= 0``: how far below its rival a
candidate may be and still be chosen by the caller's rule (it stops only when its upper
bound is below ``-m``)."""

Score = Callable[[int, int], np.ndarray]
"""``score(candidate index, n) -> per-sample scores on the first n samples`` (higher is
better; the same samples for every candidate)."""

RULE = ("sequential elimination on growing prefixes: a candidate stops when the "
        "one-sided {confidence:.0%} upper bound of its mean per-sample difference to "
        "{rival} (Student t, Bonferroni over {looks} look(s) x {rivals} rival(s)) is "
        "below zero{margin}")


@dataclass(frozen=True)
class RaceRule:
    """When to look and how sure a stop must be."""

    confidence: float = 0.95
    min_samples: int = 16  # the first look; every look doubles it
    max_fraction: float = 0.25  # the last look reads at most this fraction of the samples

    def __post_init__(self) -> None:
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.min_samples < 3:
            raise ValueError("min_samples must be at least 3 (an interval needs a spread)")

    def looks(self, total: int) -> tuple[int, ...]:
        """The prefix sizes the race scores at (none when ``total`` is too small)."""
        out, n = [], self.min_samples
        while n < total and n <= total * self.max_fraction:
            out.append(n)
            n *= 2
        return tuple(out)


@dataclass(frozen=True)
class RaceEntry:
    """One candidate's last look: its mean score and its paired difference to the rival."""

    index: int
    name: str
    n: int  # samples read when it stopped (or at the last look, when it ran on)
    mean: float  # its mean score on those samples
    difference: float  # mean(score - rival's score) on those samples (0 for the rival)
    half_width: float  # the one-sided interval's half width on that difference
    rival: str  # whom it was compared with at that look
    stopped: bool
    margin: float = 0.0  # it stops only below minus this (the caller's noise allowance)

    def to_dict(self) -> dict[str, Any]:
        doc = {"name": self.name, "n": self.n, "mean": round(self.mean, 6),
               "difference": round(self.difference, 6),
               "half_width": round(self.half_width, 6), "rival": self.rival,
               "stopped": self.stopped}
        return doc | ({"margin": round(self.margin, 6)} if self.margin else {})


@dataclass(frozen=True)
class RaceResult:
    """Who stopped where, the leader at the last look and the rule, in words."""

    rule: str
    confidence: float
    total: int  # samples in the whole set
    looks: tuple[int, ...]
    entries: tuple[RaceEntry, ...]  # in candidate order
    leader: int  # the best mean at the last look (the full measurement decides)

    @property
    def survivors(self) -> tuple[int, ...]:
        """The candidates still running after the last look (to measure in full)."""
        return tuple(e.index for e in self.entries if not e.stopped)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "confidence": self.confidence, "samples": self.total,
                "looks": list(self.looks), "leader": self.entries[self.leader].name,
                "candidates": [e.to_dict() for e in self.entries]}


def race(names: Sequence[str], score: Score, total: int, rule: RaceRule = RaceRule(), *,
         incumbent: int | None = None, may_stop: np.ndarray | None = None,
         margin: Margin | None = None) -> RaceResult:
    """Race the candidates ``names`` on prefixes of ``total`` samples (module docstring);
    ``incumbent``: compare with that candidate only (it never stops), else with the
    leader of each look; ``may_stop[i, j]``: only a running ``j`` with it true may stop
    ``i`` (e.g. a rival no more expensive anywhere), each one compared; ``margin``: a
    candidate stops only when its bound is below minus ``margin(its mean, the rival's,
    total)``."""
    k = len(names)
    looks = rule.looks(total) if k > 1 else ()
    rivals = 1 if incumbent is not None else max(k - 1, 1)
    alpha = (1.0 - rule.confidence) / max(len(looks) * rivals, 1)
    whom = ("the incumbent" if incumbent is not None else "the leader" if may_stop is None
            else "each running rival allowed to stop it")
    text = RULE.format(confidence=rule.confidence, looks=len(looks), rivals=rivals, rival=whom,
                       margin="" if margin is None else
                       " by more than the caller's noise allowance (its margin)")
    alive = list(range(k))
    last: dict[int, RaceEntry] = {i: RaceEntry(i, names[i], 0, math.nan, 0.0, 0.0, "", False)
                                  for i in range(k)}
    leader = incumbent if incumbent is not None else 0
    for n in looks:
        scores = {i: _checked(score(i, n), n, names[i]) for i in alive}
        means = {i: float(np.mean(s)) for i, s in scores.items()}
        leader = incumbent if incumbent is not None else max(alive, key=lambda i: (means[i], -i))
        t = t_quantile(1.0 - alpha, n - 1)
        running = tuple(alive)
        for i in running:
            against = [j for j in running if j != i and may_stop[i, j]] if may_stop is not None \
                else [] if i == leader else [leader]
            if not against:
                last[i] = RaceEntry(i, names[i], n, means[i], 0.0, 0.0, names[i], False)
                continue
            diff, hw, j, m = min((_bound(scores[i] - scores[j], t)
                                  + (j, _room(margin, means[i], means[j], total))
                                  for j in against), key=lambda x: x[0] + x[1] + x[3])
            last[i] = RaceEntry(i, names[i], n, means[i], diff, hw, names[j],
                                diff + hw < -m, m)
        alive = [i for i in running if not last[i].stopped]
    return RaceResult(rule=text, confidence=rule.confidence, total=total, looks=looks,
                      entries=tuple(last[i] for i in range(k)), leader=leader)


def _room(margin: Margin | None, mean: float, rival: float, total: int) -> float:
    """The caller's allowance below the rival (0 without a margin; never negative)."""
    return 0.0 if margin is None else max(float(margin(mean, rival, total)), 0.0)


def _bound(d: np.ndarray, t: float) -> tuple[float, float]:
    """(mean, one-sided half width) of paired differences ``d``."""
    return float(np.mean(d)), t * float(np.std(d, ddof=1)) / math.sqrt(len(d))


def _checked(scores: np.ndarray, n: int, name: str) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if s.shape != (n,) or not np.all(np.isfinite(s)):
        raise ValueError(f"candidate {name}: expected {n} finite per-sample scores, "
                         f"got shape {s.shape}")
    return s


class RacePlans(Protocol):
    """``racer(plans, margin=None)``: race plans on prefixes of the planner's data (the
    stages bind it to real emulation; ``margin`` as :func:`race`'s): the planner measures
    in full only the survivors."""

    def __call__(self, plans: Sequence[Plan], margin: Margin | None = None) -> RaceResult:
        ...
