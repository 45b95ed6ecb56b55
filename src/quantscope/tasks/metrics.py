"""Task metrics for quantized embedding models (pure numpy).

Retrieval (recall@k, MRR, top-1 agreement with the FP32 model), embedding fidelity
(cosine, SQNR), verification (TAR@FAR, TAR/FAR at a threshold, decision agreement, EER),
pre-normalisation norm statistics and a collapse detector for the "everyone matches"
failure. Every function validates its input and raises :class:`MetricInputError` for
non-finite values or mismatched shapes instead of returning NaN.

Row convention: an embedding array is ``[n, ...]``; anything beyond the first axis is
flattened into one row per sample (a 1-D array is one row).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from quantscope import numerics
from quantscope.numerics import RESEMBLE_MIN_COSINE
from quantscope.types import QuantscopeError

__all__ = [
    "CollapseReport",
    "MetricInputError",
    "TarAtFar",
    "TarFar",
    "collapse_report",
    "resemblance_note",
    "spearman",
    "cosine_fidelity",
    "decision_agreement",
    "eer",
    "effective_rank",
    "match_decisions",
    "mean_pairwise_cosine",
    "mrr",
    "norm_stats",
    "recall_at_k",
    "retrieval_ranks",
    "row_cosines",
    "sqnr_db",
    "tar_at_far",
    "tar_far_at_threshold",
    "top1_agreement",
    "top1_indices",
]

# Query rows scored at once: 1,024 x 10,000 docs x 4 bytes = 40 MB of float32 scores.
DEFAULT_CHUNK = 1024

# --- rank correlation ----------------------------------------------------------------


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties get their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(1, len(x) + 1)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return sums[inv] / counts[inv]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation (Pearson of average ranks); NaN when one side is constant."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 3:
        raise MetricInputError("spearman needs two 1-D arrays of the same length >= 3")
    ra, rb = _ranks(a) - (len(a) + 1) / 2, _ranks(b) - (len(b) + 1) / 2
    den = float(np.sqrt((ra**2).sum() * (rb**2).sum()))
    return float((ra * rb).sum() / den) if den > 0 else float("nan")


# --- "no longer like FP32" ----------------------------------------------------------
# A quantized model whose embeddings have a mean cosine to FP32's below this computes
# something else: collapse tests (norm spread, anisotropy) can still pass (a 12-layer
# encoder at a8_w8 measured 0.18 with "collapsed 0"), so this is said separately.
# (RESEMBLE_MIN_COSINE, 0.9, lives in numerics: evaluate's output fidelity uses it too)
# Top-1 retrieval agreement with FP32 below this many times chance (1 / documents) is
# called "near chance".
AGREEMENT_CHANCE_FACTOR = 10.0


def resemblance_note(cosine_mean: float, *, agreement: float | None = None,
                     candidates: int | None = None) -> str | None:
    """One plain line when quantized outputs no longer resemble FP32's, else None.

    ==========================  ==================================================
    mean cosine to FP32         below ``RESEMBLE_MIN_COSINE`` (0.9)
    top-1 agreement with FP32   below ``AGREEMENT_CHANCE_FACTOR`` x chance, chance
                                = 1 / ``candidates`` (retrieval only)
    ==========================  ==================================================
    """
    why = []
    if np.isfinite(cosine_mean) and cosine_mean < RESEMBLE_MIN_COSINE:
        why.append(f"mean cosine to FP32 {cosine_mean:.3f} < {RESEMBLE_MIN_COSINE:g}")
    if agreement is not None and candidates:
        chance = 1.0 / candidates
        if agreement < AGREEMENT_CHANCE_FACTOR * chance:
            why.append(f"top-1 agreement with FP32 {agreement:.1%} is near chance "
                       f"({chance:.2%})")
    if not why:
        return None
    return ("NOT LIKE FP32: the quantized outputs no longer resemble FP32's ("
            + "; ".join(why) + "), whatever the collapse test says")


# --- collapse thresholds -------------------------------------------------------------
# Mean pairwise cosine above which "everyone matches": random pairs are then closer than
# the genuine pairs of any healthy face/sentence model (the INT16 face report: 0.996).
COLLAPSE_MEAN_COSINE = 0.9
# With a reference, the gap to 1 (1 - mean cosine) must also have shrunk by this factor,
# so a reference that is already anisotropic (e.g. 0.6) is not flagged for a small move.
# For a reference at 0.5 this means a test mean cosine >= 0.9.
COSINE_GAP_SHRINK = 5.0
# Without a reference, a healthy but anisotropic encoder can sit near 0.9, so only a
# mean cosine this close to 1 is flagged.
COLLAPSE_MEAN_COSINE_NO_REF = 0.98
# Effective rank dropped by this factor vs the reference: the embeddings live in a much
# smaller subspace (small quantization noise changes it by a few percent at most).
ERANK_DROP_FACTOR = 4.0
# Without a reference: an effective rank below this means one direction for everyone.
ERANK_MIN_NO_REF = 1.5
# Norm CV of the reference above which its norms really vary (below it the model
# L2-normalises itself and norm spread carries no information) ...
NORM_CV_REF_MIN = 0.02
# ... and the factor by which the test's CV must have dropped to be "constant norm"
# (the INT16 face report: pre-norm ~2 or ~4.7 for every face).
NORM_CV_DROP_FACTOR = 10.0
# Rows used for the effective rank (an SVD); the same seeded rows for test and reference.
COLLAPSE_MAX_ROWS = 2000


class MetricInputError(QuantscopeError, ValueError):
    """Metric input that cannot be measured honestly (non-finite values, bad shapes)."""


# --- helpers -------------------------------------------------------------------------


def _rows(x: np.ndarray, name: str, dtype: type = np.float64) -> np.ndarray:
    """``x`` as a finite 2-D ``[n, features]`` array of ``dtype``."""
    a = np.asarray(x)
    if a.ndim == 0 or a.size == 0:
        raise MetricInputError(f"{name}: expected a non-empty array, got shape {a.shape}")
    a = a.reshape(1, -1) if a.ndim == 1 else a.reshape(a.shape[0], -1)
    a = a.astype(dtype, copy=False)
    bad = ~np.isfinite(a).all(axis=1)
    if bad.any():
        raise MetricInputError(
            f"{name}: {int(bad.sum())} of {a.shape[0]} rows contain NaN/inf "
            f"(first at row {int(np.argmax(bad))}); the model output is broken"
        )
    return a


def _unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm; all-zero rows stay zero (cosine 0 with anything)."""
    norms = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norms > 0, norms, 1).astype(a.dtype)


def _same_rows(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.shape != b.shape:
        raise MetricInputError(f"{what}: shapes differ, {a.shape} vs {b.shape}")


# --- retrieval -----------------------------------------------------------------------


def _retrieval_inputs(queries: np.ndarray, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = _unit_rows(_rows(queries, "queries", np.float32))
    d = _unit_rows(_rows(docs, "docs", np.float32))
    if q.shape[1] != d.shape[1]:
        raise MetricInputError(f"queries have {q.shape[1]} features, docs {d.shape[1]}")
    if d.shape[0] < q.shape[0]:
        raise MetricInputError(f"{q.shape[0]} queries but only {d.shape[0]} docs")
    return q, d


def retrieval_ranks(
    queries: np.ndarray, docs: np.ndarray, chunk: int = DEFAULT_CHUNK
) -> np.ndarray:
    """0-based rank of the relevant doc for every query, under cosine similarity.

    Query ``i``'s relevant doc is ``docs[i]`` (extra docs beyond ``len(queries)`` are
    distractors). rank_i = #{j : s_ij > s_ii} + #{j < i : s_ij == s_ii}: ties go to the
    lowest doc index. Scores are float32, computed ``chunk`` queries at a time.
    """
    q, d = _retrieval_inputs(queries, docs)
    cols = np.arange(d.shape[0])
    ranks = np.empty(q.shape[0], dtype=np.int64)
    for start in range(0, q.shape[0], chunk):
        s = q[start : start + chunk] @ d.T
        rows = np.arange(start, start + s.shape[0])
        rel = s[np.arange(s.shape[0]), rows][:, None]
        ties_before = (s == rel) & (cols[None, :] < rows[:, None])
        ranks[rows] = np.count_nonzero(s > rel, axis=1) + np.count_nonzero(ties_before, axis=1)
    return ranks


def recall_at_k(
    queries: np.ndarray,
    docs: np.ndarray,
    ks: Iterable[int] = (1, 5, 10),
    chunk: int = DEFAULT_CHUNK,
) -> dict[int, float]:
    """Recall@k = fraction of queries whose relevant doc ranks in the top ``k``.

    Ranks as in :func:`retrieval_ranks` (cosine, ties to the lowest index).
    Returns ``{k: recall}``.
    """
    ks = tuple(int(k) for k in ks)
    if any(k < 1 for k in ks):
        raise ValueError(f"k must be >= 1, got {ks}")
    ranks = retrieval_ranks(queries, docs, chunk)
    return {k: float(np.mean(ranks < k)) for k in ks}


def mrr(queries: np.ndarray, docs: np.ndarray, chunk: int = DEFAULT_CHUNK) -> float:
    """Mean reciprocal rank = mean over queries of 1 / (1-based rank of the relevant doc)."""
    return float(np.mean(1.0 / (retrieval_ranks(queries, docs, chunk) + 1)))


def top1_indices(queries: np.ndarray, docs: np.ndarray, chunk: int = DEFAULT_CHUNK) -> np.ndarray:
    """Index of the most cosine-similar doc for every query (ties: lowest index)."""
    q, d = _retrieval_inputs(queries, docs)
    out = np.empty(q.shape[0], dtype=np.int64)
    for start in range(0, q.shape[0], chunk):
        out[start : start + chunk] = np.argmax(q[start : start + chunk] @ d.T, axis=1)
    return out


def top1_agreement(
    queries_ref: np.ndarray,
    docs_ref: np.ndarray,
    queries: np.ndarray,
    docs: np.ndarray,
    chunk: int = DEFAULT_CHUNK,
) -> float:
    """Fraction of queries whose top-1 doc under the test embeddings equals the top-1 doc
    under the reference (FP32) embeddings, whether or not that doc is the relevant one.

    This is the field report's "70.8 % top-1 vs 100 % FP32" metric. Ties: lowest index.
    """
    ref = top1_indices(queries_ref, docs_ref, chunk)
    test = top1_indices(queries, docs, chunk)
    if ref.shape != test.shape or np.shape(docs_ref)[0] != np.shape(docs)[0]:
        raise MetricInputError("reference and test must have the same queries and docs")
    return float(np.mean(ref == test))


# --- fidelity ------------------------------------------------------------------------


def row_cosines(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per-row cosine between checked ``ref`` and ``test`` rows (float64), by
    :func:`quantscope.numerics.row_cosines`: 1 for identical rows (two zero rows too),
    0 where only one row is zero."""
    r, t = _rows(ref, "ref"), _rows(test, "test")
    _same_rows(r, t, "cosine")
    return numerics.row_cosines(r, t)


def cosine_fidelity(ref: np.ndarray, test: np.ndarray) -> dict[str, float | int | str]:
    """Statistics of the per-row cosine between reference and test embeddings.

    Keys: ``mean``, ``min``, ``p01`` (1st percentile, linear interpolation), ``n``,
    ``n_zero_ref``, ``n_zero_test`` (rows with zero norm: cosine 0 against a non-zero
    row, 1 against a zero row) and ``note`` (empty unless zero rows were seen).
    """
    r, t = _rows(ref, "ref"), _rows(test, "test")
    cos = row_cosines(r, t)
    n_zero_ref = int(np.count_nonzero(~np.any(r, axis=1)))
    n_zero_test = int(np.count_nonzero(~np.any(t, axis=1)))
    note = ""
    if n_zero_ref or n_zero_test:
        note = (
            f"zero-norm rows (reference {n_zero_ref}, test {n_zero_test}) have no "
            "direction: cosine 0 against a non-zero row, 1 where both rows are zero"
        )
    return {
        "mean": float(np.mean(cos)),
        "min": float(np.min(cos)),
        "p01": float(np.percentile(cos, 1)),
        "n": int(cos.size),
        "n_zero_ref": n_zero_ref,
        "n_zero_test": n_zero_test,
        "note": note,
    }


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """:func:`quantscope.numerics.sqnr_db` of checked (finite, same-shape) arrays.

    ``+inf`` when test equals ref exactly; ``-inf`` when ref is all zero but test is not.
    """
    r, t = _rows(ref, "ref"), _rows(test, "test")
    _same_rows(r, t, "sqnr")
    return numerics.sqnr_db(r, t)


# --- verification --------------------------------------------------------------------


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


# --- norms and collapse --------------------------------------------------------------


def _cv(values: np.ndarray) -> float:
    mean = float(np.mean(values))
    return float(np.std(values) / mean) if mean > 0 else 0.0


def norm_stats(embeddings: np.ndarray, below: float | None = None) -> dict[str, float | int]:
    """Statistics of the per-row L2 norms of PRE-normalisation embeddings.

    Keys: ``n``, ``mean``, ``std`` (population), ``cv`` (std / mean; 0 if all norms are
    0), ``min``, ``max``, ``p01``, ``p99``, and ``frac_below`` (fraction of norms <
    ``below``) when ``below`` is given, e.g. 10 for the INT8 face "cliff".
    """
    norms = np.linalg.norm(_rows(embeddings, "embeddings"), axis=1)
    out = {
        "n": int(norms.size),
        "mean": float(np.mean(norms)),
        "std": float(np.std(norms)),
        "cv": _cv(norms),
        "min": float(np.min(norms)),
        "max": float(np.max(norms)),
        "p01": float(np.percentile(norms, 1)),
        "p99": float(np.percentile(norms, 99)),
    }
    if below is not None:
        out["frac_below"] = float(np.mean(norms < below))
    return out


def mean_pairwise_cosine(embeddings: np.ndarray) -> float:
    """Mean cosine over all pairs i != j of rows (zero rows count as cosine 0).

    Exact and O(n d): sum_{i != j} u_i . u_j = |sum_i u_i|^2 - sum_i |u_i|^2 for unit u.
    """
    u = _unit_rows(_rows(embeddings, "embeddings"))
    n = u.shape[0]
    if n < 2:
        raise MetricInputError("mean pairwise cosine needs at least 2 rows")
    total = float(np.sum(u.sum(axis=0) ** 2)) - float(np.sum(u**2))
    return total / (n * (n - 1))


def effective_rank(embeddings: np.ndarray) -> float:
    """Effective rank (Roy & Vetterli 2007) of the matrix of L2-normalised rows.

    exp(H(p)) with p = singular values / their sum, H the Shannon entropy; not centred,
    so "every row points the same way" gives ~1. ``d`` orthonormal rows give ``d``.
    0 for an all-zero matrix.
    """
    sv = np.linalg.svd(_unit_rows(_rows(embeddings, "embeddings")), compute_uv=False)
    if sv.sum() <= 0:
        return 0.0
    p = sv / sv.sum()
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


@dataclass(frozen=True)
class CollapseReport:
    """Collapse indicators of test embeddings (and of the reference, when given).

    ``collapsed`` is True when any rule fires; ``reasons`` says which, in words.
    Ratios are test / reference (None without a reference or when the reference is 0).
    """

    n_rows: int
    norm_cv: float
    mean_pairwise_cosine: float
    effective_rank: float
    ref_norm_cv: float | None = None
    ref_mean_pairwise_cosine: float | None = None
    ref_effective_rank: float | None = None
    norm_cv_ratio: float | None = None
    effective_rank_ratio: float | None = None
    collapsed: bool = False
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """Plain dict (reasons as a list) for JSON output."""
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        return out


def _indicators(x: np.ndarray, rows: np.ndarray) -> tuple[float, float, float]:
    """(norm CV, mean pairwise cosine over all rows, effective rank over ``rows``)."""
    return _cv(np.linalg.norm(x, axis=1)), mean_pairwise_cosine(x), effective_rank(x[rows])


def _ratio(test: float, ref: float) -> float | None:
    return test / ref if ref > 0 else None


def _reasons_no_ref(mcos: float, erank: float, dim: int) -> list[str]:
    """Rules without a reference (a constant norm alone is normal: models L2-normalise)."""
    reasons = []
    if mcos > COLLAPSE_MEAN_COSINE_NO_REF:
        reasons.append(f"mean pairwise cosine {mcos:.3f} > {COLLAPSE_MEAN_COSINE_NO_REF}")
    if dim >= 4 and erank < ERANK_MIN_NO_REF:
        reasons.append(f"effective rank {erank:.2f} < {ERANK_MIN_NO_REF}: one direction")
    return reasons


def _reasons_vs_ref(test: tuple[float, float, float], ref: tuple[float, float, float]) -> list[str]:
    (cv, mcos, erank), (rcv, rmcos, rerank) = test, ref
    reasons = []
    if mcos > COLLAPSE_MEAN_COSINE and (1 - mcos) * COSINE_GAP_SHRINK <= (1 - rmcos):
        reasons.append(
            f"mean pairwise cosine {mcos:.3f} vs reference {rmcos:.3f}: everyone matches"
        )
    if erank * ERANK_DROP_FACTOR < rerank:
        reasons.append(
            f"effective rank {erank:.1f} vs reference {rerank:.1f} "
            f"(dropped more than {ERANK_DROP_FACTOR:g}x)"
        )
    if rcv > NORM_CV_REF_MIN and cv * NORM_CV_DROP_FACTOR < rcv:
        reasons.append(f"embedding norm nearly constant: CV {cv:.4f} vs reference {rcv:.3f}")
    return reasons


def collapse_report(
    embeddings: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    max_rows: int = COLLAPSE_MAX_ROWS,
    seed: int = 0,
) -> CollapseReport:
    """Detect the "everyone matches" collapse of (pre-normalisation) embeddings.

    Indicators: coefficient of variation of row norms, mean pairwise cosine (all rows,
    exact) and effective rank (of up to ``max_rows`` rows drawn with ``seed``; the same
    rows of the reference). Rules (module constants): mean cosine near 1 where the
    reference's is not, effective rank down by ``ERANK_DROP_FACTOR``, norm CV down by
    ``NORM_CV_DROP_FACTOR`` where the reference's norms vary. Without a reference only
    the mean-cosine and single-direction rules apply, with stricter thresholds.
    """
    x = _rows(embeddings, "embeddings")
    if x.shape[0] < 2:
        raise MetricInputError("collapse_report needs at least 2 rows")
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.permutation(x.shape[0])[:max_rows])
    cv, mcos, erank = test = _indicators(x, rows)
    if reference is None:
        reasons = _reasons_no_ref(mcos, erank, x.shape[1])
        return CollapseReport(
            x.shape[0], cv, mcos, erank, collapsed=bool(reasons), reasons=tuple(reasons)
        )
    r = _rows(reference, "reference")
    if r.shape[0] != x.shape[0]:
        raise MetricInputError(f"reference has {r.shape[0]} rows, embeddings {x.shape[0]}")
    ref = _indicators(r, rows)
    reasons = _reasons_vs_ref(test, ref)
    return CollapseReport(
        n_rows=x.shape[0],
        norm_cv=cv,
        mean_pairwise_cosine=mcos,
        effective_rank=erank,
        ref_norm_cv=ref[0],
        ref_mean_pairwise_cosine=ref[1],
        ref_effective_rank=ref[2],
        norm_cv_ratio=_ratio(cv, ref[0]),
        effective_rank_ratio=_ratio(erank, ref[2]),
        collapsed=bool(reasons),
        reasons=tuple(reasons),
    )
