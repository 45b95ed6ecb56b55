"""How many items a share metric counts: the figure its binomial noise needs.

A share (a fraction of items that agree with FP32) has a noise of its own,
``sqrt(p(1 - p) / n)`` over its ``n`` items (:func:`share_noise`: a rewrite's gain
(:mod:`quantscope.rewrites.tie`) and the planner's choice between measured plans
(:mod:`quantscope.plan.pareto`) are decided by it). The task that computes the share counts its items in the
same pass, as the value ``KEY_items`` beside ``KEY`` (:func:`items_key`), so the count
cannot drift from the figure; :func:`quantscope.tasks.headline.share_items` reads it.
Where items cluster in units no count here describes (a face's pairs touch two people),
the repair offers' out-of-sample check, the planner's choice, ``run``'s held-out check and
``run --rewrites auto`` read the jackknife of the task's own share with each unit left
out instead (:mod:`quantscope.tasks.left_out`: by person on face data; all but the offers'
since h71), this binomial only where those values are not at hand (said).

====================  ==================================================================
``top1_agreement``    a class output: its samples ([N, C]); per position ([N, C, H, W]:
                      a segmentation, a per-token classifier) the positions of one sample
                      flip together, so the count is the effective one
                      (:func:`clustered_items`) and ``KEY_clusters`` gives the samples;
                      image views: the views (each one's nearest other view); text
                      retrieval: the queries (each one's top-1 document)
``top5_agreement``    its top-1 picks, as ``top1_agreement``
``decision_agreement``  a score output: its decisions (one per sample)
``string_agreement``  a CTC output: its decoded strings (one per sample)
``neighbour_agreement``  an embedding output: its samples (each one's nearest other)
``score_side_agreement``  a detection output's anchors, clustered by sample
``pixel_flip_share``  a map output's values (pixels), clustered by sample
``detection_f1``      the detections of either model, a matched pair once
                      (:func:`quantscope.tasks.detection.item_counts` says why);
                      recall: FP32's detections; precision: the quantized model's
====================  ==================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import NormalDist

import numpy as np

from quantscope.units import (  # the count keys' one spelling
    CLUSTERS,
    ITEMS,
    count_key,
)

SHARE_CONFIDENCE = 0.95  # one-sided: a difference beyond it is beyond noise

# what a share's items are, in words (the reason of a rewrite's keep or drop says them)
# shares whose items are pairs of samples (a verification's same/different decisions,
# clustered by each pair's first sample for the effective count): their ``KEY_clusters``
# counts anchors, not the samples judged, so no "n of N samples judged" is read from it
PAIR_SHARES: frozenset[str] = frozenset({"decision_agreement"})

ITEM_WORDS: dict[str, str] = {
    "top1_agreement": "top-1 picks",
    "top5_agreement": "top-5 picks",
    "decision_agreement": "decisions",
    "string_agreement": "decoded strings (one per sample)",
    "exact_agreement": "samples (an int output's, compared exactly)",
    "score_side_agreement": "anchors",
    "pixel_flip_share": "pixels",
    "depth_delta1": "depth pixels",
    "point_agreement": "points",
    "point_flag_agreement": "point flags",
    "pitch_agreement": "voiced frames",
    "neighbour_agreement": "samples (each one's nearest other sample)",
    "neighbour_label_agreement": "samples (each one's nearest other sample's label)",
    "voicing_agreement": "frames",
    "point_agreement_flagged": "points FP32 flags (a host keeps)",
    "detection_f1": "detections of either model (a matched pair once)",
    "detection_recall": "FP32 detections",
    "detection_precision": "quantized detections",
}


def items_key(metric: str) -> str:
    """The value that counts the items of the share ``metric`` (of one output's,
    ``KEY:OUTPUT``: ``KEY_items:OUTPUT``)."""
    return count_key(metric, ITEMS)


def clusters_key(metric: str) -> str:
    """The value that counts the samples the items of ``metric`` cluster in."""
    return count_key(metric, CLUSTERS)


def clustered_items(hits: np.ndarray, sizes: np.ndarray) -> float:
    """The effective item count of a share ``sum(hits) / sum(sizes)`` over samples of
    ``sizes`` items each (``hits``: each sample's agreeing items): the ``n`` whose
    binomial variance ``p(1 - p) / n`` equals the share's variance estimated over the
    samples (the cluster standard error of a ratio of sums, as
    :func:`quantscope.tasks.lm.cluster_se`). Items of one sample (the pixels of one image,
    the tokens of one text) are not independent, so the plain count would make the noise
    too small. Bounded by the samples (every item of a sample alike) and the items (each
    independent); fewer than two samples (no spread to estimate): the samples; ``p`` of 0
    or 1, or every sample's share the same (no sign of clustering; the binomial variance
    of a ``p`` of 0 or 1 is 0 whatever the count): the items."""
    hits, sizes = np.asarray(hits, np.float64), np.asarray(sizes, np.float64)
    k, total = len(sizes), float(sizes.sum())
    if k < 2 or total <= 0:
        return float(k)
    p = float(hits.sum()) / total
    var = k / (k - 1) * float(((hits - p * sizes) ** 2).sum()) / total ** 2
    if not 0.0 < p < 1.0 or var <= 0.0:
        return total
    return float(min(max(p * (1 - p) / var, k), total))


def share_counts(metric: str, hits: np.ndarray, sizes: np.ndarray) -> dict[str, float]:
    """``KEY_items`` (and ``KEY_clusters``) of the share ``metric``, ``sum(hits) /
    sum(sizes)`` over samples of ``sizes`` items each (``hits``: each sample's counted
    items): one item per sample, the samples; several, the effective count
    (:func:`clustered_items`, rounded down) and the samples it clusters in; no sample
    holding any (a ``where=`` gate nothing passes): 0 items in 0 samples, so that what
    reads the count says none was judged (the verdict had read the samples', "n=18").
    One item in each sample that holds any, where some hold none (a gate on a ``[N, 2]``
    point output): the items and, equal to them, the samples judged (the headline had said
    ``n=N`` of every sample, h70; :func:`quantscope.units.one_per_sample`)."""
    hits, sizes = np.asarray(hits, np.float64), np.asarray(sizes, np.int64)
    keep = sizes > 0
    hits, sizes = hits[keep], sizes[keep]
    if not len(sizes):
        return {items_key(metric): 0.0, clusters_key(metric): 0.0}
    if np.all(sizes == 1):
        n = {items_key(metric): float(len(sizes))}
        return n if keep.all() else {**n, clusters_key(metric): float(len(sizes))}
    return {items_key(metric): float(np.floor(clustered_items(hits, sizes))),
            clusters_key(metric): float(len(sizes))}


def judged_samples(metric: str, values: Mapping[str, float], samples: int | None
                   ) -> int | None:
    """How many of ``samples`` the share ``metric`` judged (``values``: its figures), where
    fewer than all (None: all, or not counted): its items cluster in the samples that hold
    any (``KEY_clusters``, :func:`share_counts`), and a sample with none (a ``where=`` gate
    no FP32 score passes there, no point FP32 flags) is not judged; 0: none was, the figure
    has no value. A pair share's clusters are its pairs' anchors, not the samples judged
    (:data:`PAIR_SHARES`): None."""
    if metric.partition(":")[0] in PAIR_SHARES:
        return None
    k = values.get(clusters_key(metric))
    if not isinstance(k, int | float) or not isinstance(samples, int) or k != k:
        return None
    return int(k) if int(k) < samples else None


def worst_counts(per_task: list[Mapping[str, float]], worst: Mapping[str, float]
                 ) -> dict[str, float]:
    """For several outputs (``per_task``: each one's values): the counts
    ``KEY_items`` / ``KEY_clusters`` of the output whose ``KEY`` is ``worst[KEY]`` (the
    figure the unprefixed ``KEY`` is): the worst output's own items, not the least of
    every output's."""
    out: dict[str, float] = {}
    for values in per_task:
        for key, count in values.items():
            suffix = ITEMS if key.endswith(ITEMS) else CLUSTERS if key.endswith(CLUSTERS) else ""
            share = key[: -len(suffix)] if suffix else ""
            if share and key not in out and share in worst and share in values and (
                    values[share] == worst[share]
                    or (np.isnan(values[share]) and np.isnan(worst[share]))):
                out[key] = count
    return out


def share_noise(before: float, after: float, n: int, what: str = "items", *,
                n_after: int | None = None, confidence: float = SHARE_CONFIDENCE
                ) -> tuple[float, str] | None:
    """The one-sided ``confidence`` noise of the difference of two shares ``before`` over
    ``n`` items and ``after`` over ``n_after`` (default: the same ``n``):
    ``z * sqrt(p(1-p)/n + q(1-q)/n_after)`` (binomial standard errors combined, ``z`` the
    normal quantile), and the figures in words. Each figure's own count: a detection
    F1's items are both models' detections, so they differ from plan to plan. None: no
    items, or a figure that is no share (outside 0..1)."""
    m = n if n_after is None else n_after
    if n < 1 or m < 1 or not all(0.0 <= v <= 1.0 for v in (before, after)):
        return None
    z = NormalDist().inv_cdf(confidence)
    half = z * float(np.sqrt(before * (1 - before) / n + after * (1 - after) / m))
    count = f"n {n}" if m == n else f"n {n}, n' {m}"
    return half, (f"one-sided {confidence:.0%} binomial noise {half:.4g} = {z:.3f} x "
                  f"sqrt(p(1-p)/n + q(1-q)/n{'' if m == n else chr(39)}) with p "
                  f"{before:.4g}, q {after:.4g}, {count} {what}")
