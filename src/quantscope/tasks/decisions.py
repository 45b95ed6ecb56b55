"""Verification decisions (pure numpy): TAR@FAR, TAR/FAR at a threshold, decision
agreement and EER over genuine/impostor pair scores. Re-exported by
:mod:`quantscope.tasks.metrics`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from quantscope.tasks.metric_inputs import MetricInputError


class TarFar(NamedTuple):
    """True accept rate (on genuine pairs) and false accept rate (on impostor pairs)."""

    tar: float
    far: float


@dataclass(frozen=True)
class TarAtFar:
    """TAR at the loosest threshold whose empirical FAR is <= ``far_target``.

    ``resolved`` is False when there are too few impostors to measure ``far_target``
    (fewer than 1 / far_target): the threshold then rejects every impostor (FAR 0 on
    this sample) and ``note`` says what FAR the sample can actually resolve.
    """

    tar: float
    threshold: float
    far: float
    far_target: float
    n_genuine: int
    n_impostor: int
    resolved: bool
    note: str


def _split_scores(
    scores: np.ndarray, labels: np.ndarray, higher_is_match: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (genuine, impostor) distances; similarities are negated into distances."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    lab = np.asarray(labels).ravel()
    if s.shape != lab.shape:
        raise MetricInputError(f"{s.size} scores but {lab.size} labels")
    if not np.isfinite(s).all():
        raise MetricInputError(f"{int((~np.isfinite(s)).sum())} scores are NaN/inf")
    if not np.isin(lab, (0, 1)).all():
        raise MetricInputError("labels must be 1 (genuine) or 0 (impostor)")
    d = -s if higher_is_match else s
    gen, imp = np.sort(d[lab == 1]), np.sort(d[lab == 0])
    if gen.size == 0 or imp.size == 0:
        raise MetricInputError(f"need both kinds of pairs: {gen.size} genuine, {imp.size} impostor")
    return gen, imp


def _rates(gen: np.ndarray, imp: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, ...]:
    """(TAR, FAR) with the rule ``distance <= threshold`` on sorted distance arrays."""
    tar = np.searchsorted(gen, thresholds, side="right") / gen.size
    far = np.searchsorted(imp, thresholds, side="right") / imp.size
    return tar, far


def match_decisions(
    scores: np.ndarray, threshold: float, *, higher_is_match: bool = False
) -> np.ndarray:
    """Accept decisions: ``distance <= threshold``, or ``similarity >= threshold``."""
    s = np.asarray(scores, dtype=np.float64)
    return s >= threshold if higher_is_match else s <= threshold


def tar_far_at_threshold(
    scores: np.ndarray, labels: np.ndarray, threshold: float, *, higher_is_match: bool = False
) -> TarFar:
    """TAR and FAR of the rule :func:`match_decisions` at a fixed ``threshold``.

    TAR = accepted genuine / genuine, FAR = accepted impostor / impostor.
    """
    gen, imp = _split_scores(scores, labels, higher_is_match)
    t = -threshold if higher_is_match else threshold
    tar, far = _rates(gen, imp, np.array([t], dtype=np.float64))
    return TarFar(float(tar[0]), float(far[0]))


def tar_at_far(
    scores: np.ndarray, labels: np.ndarray, far: float = 1e-3, *, higher_is_match: bool = False
) -> TarAtFar:
    """Highest TAR over thresholds whose empirical FAR is <= ``far``.

    With ``k = floor(far * n_impostor)`` false accepts allowed, the threshold sits just
    inside the (k+1)-th closest impostor (``numpy.nextafter``), so passing it back to
    :func:`tar_far_at_threshold` reproduces ``tar`` and ``far`` exactly. See
    :class:`TarAtFar` for the too-few-impostors case.
    """
    if not 0.0 < far <= 1.0:
        raise ValueError(f"far must be in (0, 1], got {far}")
    gen, imp = _split_scores(scores, labels, higher_is_match)
    k = int(np.floor(far * imp.size + 1e-9))
    t = np.inf if k >= imp.size else float(np.nextafter(imp[k], -np.inf))
    tar, got = _rates(gen, imp, np.array([t]))
    note = ""
    if k == 0:
        note = (
            f"only {imp.size} impostor pairs: the smallest non-zero FAR they resolve is "
            f"{1 / imp.size:.3g} > target {far:g}; threshold rejects every impostor "
            f"(FAR 0 on this sample, true FAR unknown below {1 / imp.size:.3g})"
        )
    return TarAtFar(
        tar=float(tar[0]),
        threshold=float(-t if higher_is_match else t),
        far=float(got[0]),
        far_target=float(far),
        n_genuine=int(gen.size),
        n_impostor=int(imp.size),
        resolved=k > 0,
        note=note,
    )


def decision_agreement(ref_decisions: np.ndarray, test_decisions: np.ndarray) -> float:
    """Fraction of pairs on which the test model makes the same accept/reject decision
    as the reference model."""
    r = np.asarray(ref_decisions, dtype=bool).ravel()
    t = np.asarray(test_decisions, dtype=bool).ravel()
    if r.shape != t.shape or r.size == 0:
        raise MetricInputError(f"decision arrays differ or are empty: {r.size} vs {t.size}")
    return float(np.mean(r == t))


def eer(scores: np.ndarray, labels: np.ndarray, *, higher_is_match: bool = False) -> float:
    """Equal error rate: (FAR + FRR) / 2 at the threshold where |FAR - FRR| is smallest.

    Thresholds swept over every observed score plus "accept nothing"; FRR = 1 - TAR.
    No ROC curve or interpolation: 0 for perfectly separated scores.
    """
    gen, imp = _split_scores(scores, labels, higher_is_match)
    t = np.concatenate(([-np.inf], np.unique(np.concatenate((gen, imp)))))
    tar, far = _rates(gen, imp, t)
    frr = 1.0 - tar
    i = int(np.argmin(np.abs(far - frr)))
    return float((far[i] + frr[i]) / 2)
