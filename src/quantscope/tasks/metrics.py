"""Task metrics for quantized embedding models (pure numpy).

Retrieval (recall@k, MRR, top-1 agreement with the FP32 model), embedding fidelity
(cosine, SQNR), verification (TAR@FAR, TAR/FAR at a threshold, decision agreement, EER:
:mod:`quantscope.tasks.decisions`, re-exported here), pre-normalisation norm statistics
and a collapse detector for the "everyone matches" failure. Every function validates its
input and raises :class:`MetricInputError` (:mod:`quantscope.tasks.metric_inputs`) for
non-finite values or mismatched shapes instead of returning NaN.

Row convention: an embedding array is ``[n, ...]``; anything beyond the first axis is
flattened into one row per sample (a 1-D array is one row).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from quantscope import numerics
from quantscope.numerics import RESEMBLE_MIN_COSINE
from quantscope.tasks.decisions import (
    TarAtFar,
    TarFar,
    decision_agreement,
    eer,
    match_decisions,
    tar_at_far,
    tar_far_at_threshold,
)
from quantscope.tasks.metric_inputs import MetricInputError, _rows, _same_rows, _unit_rows
from quantscope.units import value

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
    "effective_rank_svd",
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
    "top1_matches",
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
# called "near chance"; with 10 documents or fewer that bound is above 100 % (every
# agreement, 100 % included, was "near chance"), so it is at most halfway from chance to 1.
AGREEMENT_CHANCE_FACTOR = 10.0


def resemblance_note(cosine_mean: float, *, agreement: float | None = None,
                     candidates: int | None = None) -> str | None:
    """One plain line when quantized outputs no longer resemble FP32's, else None.

    ==========================  ==================================================
    mean cosine to FP32         below ``RESEMBLE_MIN_COSINE`` (0.9)
    top-1 agreement with FP32   below ``AGREEMENT_CHANCE_FACTOR`` x chance (at most
                                halfway from chance to 1), chance = 1 / ``candidates``
                                (retrieval only)
    ==========================  ==================================================
    """
    why = []
    if np.isfinite(cosine_mean) and cosine_mean < RESEMBLE_MIN_COSINE:
        why.append(f"mean cosine to FP32 {cosine_mean:.3f} < {RESEMBLE_MIN_COSINE:g}")
    if agreement is not None and candidates:
        chance = 1.0 / candidates
        if agreement < min(AGREEMENT_CHANCE_FACTOR * chance, (1 + chance) / 2):
            why.append(f"top-1 agreement with FP32 {value('top1_agreement', agreement)} is "
                       f"near chance ({100 * chance:.2g} %)")
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
    The mean of :func:`top1_matches`.
    """
    return float(np.mean(top1_matches(queries_ref, docs_ref, queries, docs, chunk)))


def top1_matches(
    queries_ref: np.ndarray,
    docs_ref: np.ndarray,
    queries: np.ndarray,
    docs: np.ndarray,
    chunk: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """Per query: is its top-1 doc under the test embeddings the reference's top-1 doc?
    (bool, one per query; :func:`top1_agreement` is their mean)."""
    ref = top1_indices(queries_ref, docs_ref, chunk)
    test = top1_indices(queries, docs, chunk)
    if ref.shape != test.shape or np.shape(docs_ref)[0] != np.shape(docs)[0]:
        raise MetricInputError("reference and test must have the same queries and docs")
    return ref == test


# --- fidelity ------------------------------------------------------------------------


def row_cosines(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per-row cosine between checked ``ref`` and ``test`` rows (float64), by
    :func:`quantscope.numerics.row_cosines`: 1 for identical rows (two zero rows too),
    0 where only one row is zero."""
    r, t = _rows(ref, "ref", None), _rows(test, "test", None)
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
    r, t = _rows(ref, "ref", None), _rows(test, "test", None)
    _same_rows(r, t, "sqnr")
    return numerics.sqnr_db(r, t)


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

    The singular values are the square roots of the eigenvalues of the smaller Gram
    matrix (``U Uᵀ`` or ``Uᵀ U``, float64, :func:`numpy.linalg.eigvalsh`; eigenvalues
    below its resolution, eps x the largest, are zero): about ten times cheaper than the
    ``n x d`` SVD of :func:`effective_rank_svd` (which was most of a plan's scoring
    time), and the same figure within 1e-6 relative (``tests/test_metrics.py``), except
    for rows equal up to float32 rounding (noise ~1e-7 of the largest singular value,
    effective rank ~1.00001), where the two differ by up to 1e-5: both are rounding
    noise there, and no collapse rule is near its threshold.
    """
    u = _unit_rows(_rows(embeddings, "embeddings")).astype(np.float64)
    gram = u @ u.T if u.shape[0] <= u.shape[1] else u.T @ u
    eig = np.linalg.eigvalsh(gram)
    # below the Gram's resolution (eps x the largest): zero, as an SVD
    # finds it (only rounding noise lives there; a square root would lift it to 1e-8)
    floor = np.finfo(np.float64).eps * float(eig.max(initial=0.0))
    return _entropy_rank(np.sqrt(np.where(eig > floor, eig, 0.0)))


def effective_rank_svd(embeddings: np.ndarray) -> float:
    """:func:`effective_rank` by an SVD of the rows (the definition, and the code before
    the Gram form: ``bench/search.py``'s baseline measures with it)."""
    return _entropy_rank(np.linalg.svd(_unit_rows(_rows(embeddings, "embeddings")),
                                       compute_uv=False))


def _entropy_rank(sv: np.ndarray) -> float:
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
    """(norm CV, mean pairwise cosine over all rows, effective rank over ``rows``); a
    large array with fewer rows than values from its Gram matrix (:func:`_gram_indicators`)."""
    if x.size > numerics.BLOCK_VALUES and x.shape[0] <= x.shape[1]:
        return _gram_indicators(x, rows)
    x = x.astype(np.float64, copy=False)
    return _cv(np.linalg.norm(x, axis=1)), mean_pairwise_cosine(x), effective_rank(x[rows])


def _gram_indicators(x: np.ndarray, rows: np.ndarray) -> tuple[float, float, float]:
    """:func:`_indicators` of a large ``[n, d]`` array (n <= d) from its float64 Gram
    matrix, summed a block of columns at a time (an image model's rows: every output
    value, 474 MB for 4 IS-Net samples, whose float64 copies were GBs): the norms are its
    diagonal's roots, the unit rows' Gram is it scaled by them, the pairwise cosines are
    its off-diagonal entries and the effective rank comes from its eigenvalues, as in
    :func:`mean_pairwise_cosine` and :func:`effective_rank` (the same figures up to the
    summation order)."""
    n = x.shape[0]
    gram = np.zeros((n, n))
    for b in numerics.column_blocks(x):
        part = x[:, b].astype(np.float64)
        gram += part @ part.T
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    inv = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)
    unit = gram * np.outer(inv, inv)
    mcos = (float(unit.sum()) - float(np.trace(unit))) / (n * (n - 1))
    eig = np.linalg.eigvalsh(unit[np.ix_(rows, rows)])
    floor = np.finfo(np.float64).eps * float(eig.max(initial=0.0))
    return _cv(norms), mcos, _entropy_rank(np.sqrt(np.where(eig > floor, eig, 0.0)))


# The reference of a search is the same FP32 array for every plan measured against it,
# and its indicators (an SVD of up to COLLAPSE_MAX_ROWS rows: most of a plan's scoring
# time) are computed once: keyed by the array's bytes, so equal inputs give the same
# numbers bit for bit. A few entries (one reference per data set in use).
_REF_INDICATORS: dict[tuple[bytes, tuple[int, ...], bytes], tuple[float, float, float]] = {}
_REF_CACHE_SIZE = 4


def _reference_indicators(r: np.ndarray, rows: np.ndarray) -> tuple[float, float, float]:
    """:func:`_indicators` of a reference, memoised on its contents and ``rows``."""
    import hashlib

    a = np.ascontiguousarray(r)
    key = (hashlib.sha1(a.view(np.uint8).reshape(-1)).digest() + a.dtype.str.encode(),
           a.shape, hashlib.sha1(np.ascontiguousarray(rows).view(np.uint8)).digest())
    hit = _REF_INDICATORS.get(key)
    if hit is None:
        hit = _indicators(r, rows)
        if len(_REF_INDICATORS) >= _REF_CACHE_SIZE:
            _REF_INDICATORS.pop(next(iter(_REF_INDICATORS)))
        _REF_INDICATORS[key] = hit
    return hit


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
    x = _rows(embeddings, "embeddings", None)  # float64 a block at a time when large
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
    r = _rows(reference, "reference", None)
    if r.shape[0] != x.shape[0]:
        raise MetricInputError(f"reference has {r.shape[0]} rows, embeddings {x.shape[0]}")
    ref = _reference_indicators(r, rows)
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
