"""Tests for quantscope.tasks.metrics: hand-computed cases, brute force, properties."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from quantscope.tasks.metrics import (
    COLLAPSE_MEAN_COSINE_NO_REF,
    MetricInputError,
    collapse_report,
    cosine_fidelity,
    decision_agreement,
    eer,
    effective_rank,
    effective_rank_svd,
    match_decisions,
    mean_pairwise_cosine,
    mrr,
    norm_stats,
    recall_at_k,
    retrieval_ranks,
    row_cosines,
    sqnr_db,
    tar_at_far,
    tar_far_at_threshold,
    top1_agreement,
    top1_indices,
)

E = np.eye(4, dtype=np.float32)


# --- retrieval -----------------------------------------------------------------------


def test_ranks_hand_case_with_ties():
    # docs e0, e0, e1, e3; query i = e_i. Scores (rows = queries):
    # q0 [1 1 0 0] rel 1 -> rank 0 (tie with doc 1, a higher index, does not count)
    # q1 [0 0 1 0] rel 0 -> doc 2 above, doc 0 tied below index 1 -> rank 2
    # q2 [0 0 0 0] rel 0 -> docs 0, 1 tied with lower index -> rank 2
    # q3 [0 0 0 1] rel 1 -> rank 0
    docs = np.stack([E[0], E[0], E[1], E[3]])
    assert retrieval_ranks(E, docs).tolist() == [0, 2, 2, 0]
    assert recall_at_k(E, docs, ks=(1, 2, 3)) == {1: 0.5, 2: 0.5, 3: 1.0}
    assert mrr(E, docs) == pytest.approx((1 + 1 / 3 + 1 / 3 + 1) / 4)


def test_swapped_docs_recall_zero_mrr_half():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    d = np.array([[0.0, 1.0], [1.0, 0.0]])
    assert recall_at_k(q, d, ks=(1, 2)) == {1: 0.0, 2: 1.0}
    assert mrr(q, d) == pytest.approx(0.5)


def test_graded_scores_and_distractors():
    # query 0 at angle 0; docs at angles 10 (relevant), 5, 20, 2 (distractors) degrees.
    ang = np.deg2rad([10.0, 5.0, 20.0, 2.0])
    docs = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    q = np.array([[3.0, 0.0]])  # unnormalised on purpose
    assert retrieval_ranks(q, docs).tolist() == [2]
    assert recall_at_k(q, docs, ks=(2, 3)) == {2: 0.0, 3: 1.0}
    assert mrr(q, docs) == pytest.approx(1 / 3)


def test_ranks_match_float64_brute_force():
    rng = np.random.default_rng(1)
    q, d = rng.normal(size=(60, 16)), rng.normal(size=(80, 16))
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    s = qn @ dn.T
    expected = [int(np.sum(s[i] > s[i, i])) for i in range(60)]
    assert retrieval_ranks(q, d, chunk=7).tolist() == expected
    assert top1_indices(q, d, chunk=7).tolist() == np.argmax(s, axis=1).tolist()


@settings(max_examples=40, deadline=None)
@given(
    arrays(np.float32, (9, 3), elements=st.integers(-3, 3).map(float)),
    st.integers(1, 10),
)
def test_retrieval_invariant_to_chunk_and_scale(x, chunk):
    q, d = x[:4], x
    ranks = retrieval_ranks(q, d, chunk=chunk)
    assert ranks.tolist() == retrieval_ranks(q, d, chunk=1000).tolist()
    assert (ranks >= 0).all() and (ranks < len(d)).all()
    rec = recall_at_k(q, d, ks=(1, 3, 9))
    assert rec[1] <= rec[3] <= rec[9] == 1.0
    assert rec[1] <= mrr(q, d) <= 1.0
    assert top1_indices(q * 7.0, d * 0.5).tolist() == top1_indices(q, d).tolist()


def test_top1_agreement_exactly_half():
    # reference top-1 = [0, 1, 2, 3]; test docs swap 0 and 1 -> top-1 = [1, 0, 2, 3]
    test_docs = E[[1, 0, 2, 3]]
    assert top1_agreement(E, E, E, test_docs) == 0.5
    assert top1_agreement(E, E, E, E) == 1.0


def test_top1_ties_go_to_lowest_index_and_zero_query():
    docs = np.stack([E[1], E[0], E[0], E[2]])
    q = np.stack([E[0], np.zeros(4, np.float32)])
    assert top1_indices(q, docs).tolist() == [1, 0]


def test_top1_agreement_ignores_relevance():
    # both models retrieve the wrong doc, the same wrong doc: agreement 1, recall@1 0
    q, d = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 1.0], [1.0, 0.0]])
    assert top1_agreement(q, d, q * 2, d * 3) == 1.0
    assert recall_at_k(q, d, ks=(1,))[1] == 0.0


def test_retrieval_chunked_memory_stays_bounded():
    n = 6000  # a full float32 score matrix would be 144 MB, float64 288 MB
    rng = np.random.default_rng(0)
    q = rng.normal(size=(n, 16)).astype(np.float32)
    d = (q + 0.3 * rng.normal(size=q.shape)).astype(np.float32)
    tracemalloc.start()
    rec = recall_at_k(q, d, ks=(1,), chunk=256)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 40e6
    assert 0.5 < rec[1] <= 1.0


def test_retrieval_rejects_nan_and_shape_mismatch():
    with pytest.raises(MetricInputError, match="NaN"):
        mrr(np.array([[np.nan, 1.0]]), np.array([[1.0, 0.0]]))
    with pytest.raises(MetricInputError):
        mrr(np.ones((3, 2)), np.ones((2, 2)))
    with pytest.raises(MetricInputError):
        top1_agreement(E, E, E, E[:3])


# --- fidelity ------------------------------------------------------------------------


def test_cosine_identical_is_one_and_hand_value():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, 8))
    fid = cosine_fidelity(x, x * 3.0)
    assert fid["mean"] == pytest.approx(1.0, abs=1e-12)
    assert fid["min"] == pytest.approx(1.0, abs=1e-12)
    assert fid["p01"] == pytest.approx(1.0, abs=1e-12)
    fid = cosine_fidelity(np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([[1.0, 1.0], [0.0, 1.0]]))
    assert fid["min"] == pytest.approx(1 / math.sqrt(2))
    assert fid["mean"] == pytest.approx((1 + 1 / math.sqrt(2)) / 2)
    assert fid["note"] == ""


def test_cosine_p01_is_first_percentile():
    ref = np.tile([[1.0, 0.0]], (101, 1))
    ang = np.linspace(0, np.pi / 2, 101)  # cosines from 1 down to 0
    test = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    fid = cosine_fidelity(ref, test)
    assert fid["p01"] == pytest.approx(np.cos(ang[-2]))
    assert fid["min"] == pytest.approx(0.0, abs=1e-12)


def test_cosine_zero_rows_no_nan_and_noted():
    ref = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    test = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    fid = cosine_fidelity(ref, test)
    # one side zero: 0 (no direction to agree on); both zero: identical rows, 1
    np.testing.assert_array_equal(row_cosines(ref, test), [1.0, 0.0, 0.0, 1.0])
    assert fid["mean"] == pytest.approx(0.5)
    assert fid["min"] == 0.0
    assert (fid["n_zero_ref"], fid["n_zero_test"]) == (2, 2)
    assert "zero-norm" in fid["note"]


def test_cosine_flattens_3d_rows():
    ref = np.zeros((2, 3, 4))
    ref[0, 0, 0] = ref[1, 2, 3] = 1.0
    test = ref.copy()
    test[1, 0, 0] = 1.0  # row 1 becomes e0 + e11 -> cosine 1/sqrt2
    fid = cosine_fidelity(ref, test)
    assert fid["n"] == 2
    assert fid["min"] == pytest.approx(1 / math.sqrt(2))


def test_cosine_rejects_inf():
    with pytest.raises(MetricInputError):
        cosine_fidelity(np.ones((2, 2)), np.array([[1.0, np.inf], [1.0, 1.0]]))


def test_sqnr_known_noise():
    ref = np.full(1000, 2.0)  # signal power 4 per element
    noise = np.where(np.arange(1000) % 2 == 0, 0.02, -0.02)  # power 4e-4
    assert sqnr_db(ref, ref + noise) == pytest.approx(40.0)
    assert sqnr_db(ref, ref) == math.inf
    assert sqnr_db(np.zeros(3), np.ones(3)) == -math.inf


def test_sqnr_gaussian_noise():
    rng = np.random.default_rng(3)
    ref = rng.normal(size=200_000)
    test = ref + 0.1 * rng.normal(size=ref.shape)
    assert sqnr_db(ref, test) == pytest.approx(20.0, abs=0.1)


@settings(max_examples=30, deadline=None)
@given(
    arrays(np.float64, (5, 3), elements=st.floats(-10, 10)),
    # |noise| >= 1e-6 so that (ref + noise) - ref keeps its precision
    arrays(np.float64, (5, 3), elements=st.floats(1e-6, 1) | st.floats(-1, -1e-6)),
    st.floats(0.01, 100),
)
def test_sqnr_invariant_to_joint_scale(ref, noise, scale):
    a = sqnr_db(ref, ref + noise)
    b = sqnr_db(ref * scale, (ref + noise) * scale)
    # below -300 dB the signal's squares, scaled by the noise's magnitude, are subnormal
    # (hypothesis found ref = 3.5e-161 against noise 1: -3209.05 against -3209.01 dB, the
    # same on stop 61's code): no figure there is meaningful in float64
    if math.isfinite(a) and a > -300:
        assert b == pytest.approx(a, abs=1e-6)


# --- verification --------------------------------------------------------------------


def _brute_tar_at_far(dist, labels, far):
    gen, imp = dist[labels == 1], dist[labels == 0]
    best = 0.0
    for t in np.concatenate(([-np.inf, np.inf], dist)):
        if np.mean(imp <= t) <= far:
            best = max(best, float(np.mean(gen <= t)))
    return best


def test_tar_at_far_gaussian_vs_brute_force():
    rng = np.random.default_rng(4)
    gen, imp = rng.normal(0.4, 0.1, 1000), rng.normal(0.9, 0.1, 5000)
    dist = np.concatenate((gen, imp))
    labels = np.concatenate((np.ones(1000), np.zeros(5000))).astype(int)
    for far in (1e-3, 1e-2, 0.1):
        res = tar_at_far(dist, labels, far)
        assert res.tar == pytest.approx(_brute_tar_at_far(dist, labels, far))
        assert res.far <= far and res.resolved and res.note == ""
        assert tar_far_at_threshold(dist, labels, res.threshold) == (res.tar, res.far)
    # 1e-3 of 5000 impostors = 5 false accepts allowed: threshold just below the 6th
    res = tar_at_far(dist, labels, 1e-3)
    assert res.far == 5 / 5000
    assert np.sort(imp)[4] <= res.threshold < np.sort(imp)[5]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1)), min_size=2, max_size=40),
    st.sampled_from([0.01, 0.1, 0.25, 0.29, 0.5, 1.0]),
)
def test_tar_at_far_brute_force_with_ties(pairs, far):
    dist = np.array([p[0] for p in pairs], dtype=float)
    labels = np.array([p[1] for p in pairs])
    if labels.min() == labels.max():
        with pytest.raises(MetricInputError):
            tar_at_far(dist, labels, far)
        return
    res = tar_at_far(dist, labels, far)
    assert res.tar == pytest.approx(_brute_tar_at_far(dist, labels, far))
    assert res.far <= far
    assert tar_far_at_threshold(dist, labels, res.threshold) == (res.tar, res.far)
    sim = tar_at_far(-dist, labels, far, higher_is_match=True)
    assert (sim.tar, sim.far, sim.threshold) == (res.tar, res.far, -res.threshold)
    assert tar_far_at_threshold(-dist, labels, sim.threshold, higher_is_match=True) == (
        res.tar,
        res.far,
    )


def test_tar_at_far_reports_too_few_impostors():
    dist = np.array([0.1, 0.2, 0.3, 0.5, 0.6, 0.7])
    labels = np.array([1, 1, 1, 0, 0, 0])
    res = tar_at_far(dist, labels, 1e-3)
    assert not res.resolved
    assert res.far == 0.0 and res.tar == 1.0
    assert "only 3 impostor" in res.note
    assert tar_at_far(dist, labels, 1 / 3).resolved


def test_tar_at_far_allowed_count_is_not_lost_to_rounding():
    # 0.29 * 100 == 28.999999999999996 in floating point; 29 false accepts are allowed
    dist = np.concatenate(([0.0], np.arange(1.0, 101.0)))
    labels = np.concatenate(([1], np.zeros(100, dtype=int)))
    res = tar_at_far(dist, labels, 0.29)
    assert res.far == 0.29 and 29.0 <= res.threshold < 30.0


def test_tar_far_at_threshold_hand_case():
    dist = np.array([0.2, 0.5, 0.7, 0.4, 0.6, 0.9])
    labels = np.array([1, 1, 1, 0, 0, 0])
    assert tar_far_at_threshold(dist, labels, 0.6) == (2 / 3, 2 / 3)  # <= is a match
    assert tar_far_at_threshold(dist, labels, 0.45) == (1 / 3, 1 / 3)
    assert tar_far_at_threshold(1 - dist, labels, 0.4, higher_is_match=True) == (2 / 3, 2 / 3)


def test_decisions_and_agreement():
    assert match_decisions(np.array([0.5, 0.6, 0.7]), 0.6).tolist() == [True, True, False]
    assert match_decisions(np.array([0.5, 0.6]), 0.6, higher_is_match=True).tolist() == [
        False,
        True,
    ]
    assert decision_agreement([1, 0, 0, 1], [1, 0, 1, 0]) == 0.5  # both-reject agrees
    assert decision_agreement([0, 0], [0, 0]) == 1.0
    with pytest.raises(MetricInputError):
        decision_agreement([1, 0], [1])


def test_eer_hand_and_separated():
    labels = np.array([1, 1, 0, 0])
    assert eer(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 0.0
    # genuine 0.1, 0.6; impostor 0.4, 0.9: at t = 0.4 FAR 1/2, FRR 1/2
    assert eer(np.array([0.1, 0.6, 0.4, 0.9]), labels) == 0.5
    assert eer(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 1.0  # inverted scores
    assert eer(np.array([0.9, 0.8, 0.2, 0.1]), labels, higher_is_match=True) == 0.0
    # genuine .1 .2 .5 .6, impostor .4 .7 .8: |FAR - FRR| smallest at t = .5 (1/3 vs 1/4)
    dist = np.array([0.1, 0.2, 0.5, 0.6, 0.4, 0.7, 0.8])
    assert eer(dist, np.array([1, 1, 1, 1, 0, 0, 0])) == pytest.approx((1 / 3 + 1 / 4) / 2)


def test_eer_gaussian():
    # genuine N(0,1), impostor N(2,1): EER = Phi(-1) = 0.158655
    rng = np.random.default_rng(5)
    dist = np.concatenate((rng.normal(0, 1, 20000), rng.normal(2, 1, 20000)))
    labels = np.concatenate((np.ones(20000), np.zeros(20000))).astype(int)
    assert eer(dist, labels) == pytest.approx(0.158655, abs=0.006)


def test_verification_rejects_bad_labels():
    with pytest.raises(MetricInputError):
        tar_at_far(np.array([0.1, 0.2]), np.array([1, 2]))
    with pytest.raises(MetricInputError):
        eer(np.array([0.1, np.nan]), np.array([1, 0]))


# --- norms and collapse --------------------------------------------------------------


def test_norm_stats_hand_case():
    x = np.array([[3.0, 4.0], [0.0, 10.0], [6.0, 8.0], [0.0, 15.0]])  # norms 5, 10, 10, 15
    st_ = norm_stats(x, below=10)
    assert st_["mean"] == 10.0 and st_["min"] == 5.0 and st_["max"] == 15.0
    assert st_["std"] == pytest.approx(math.sqrt(12.5))
    assert st_["cv"] == pytest.approx(math.sqrt(12.5) / 10)
    assert st_["p01"] == pytest.approx(5.15) and st_["p99"] == pytest.approx(14.85)
    assert st_["frac_below"] == 0.25
    assert norm_stats(np.zeros((3, 2)))["cv"] == 0.0


def test_effective_rank_identity_and_gaussian():
    assert effective_rank(np.eye(32) * 5) == pytest.approx(32.0)
    rng = np.random.default_rng(6)
    assert effective_rank(rng.normal(size=(4000, 32))) > 0.95 * 32
    assert effective_rank(np.tile([1.0, 2.0, 3.0], (10, 1))) == pytest.approx(1.0)
    assert effective_rank(np.zeros((4, 3))) == 0.0
    # rows e0, e0, e0, e1: singular values sqrt(3), 1 (of unit rows), not their squares
    p = np.array([math.sqrt(3), 1.0]) / (math.sqrt(3) + 1)
    x = np.array([[2.0, 0.0], [1.0, 0.0], [5.0, 0.0], [0.0, 3.0]])
    assert effective_rank(x) == pytest.approx(math.exp(-np.sum(p * np.log(p))))


def test_mean_pairwise_cosine_matches_brute_force():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(30, 5)) + 1.0
    x[3] = 0.0
    u = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
    g = u @ u.T
    expected = (g.sum() - np.trace(g)) / (30 * 29)
    assert mean_pairwise_cosine(x) == pytest.approx(expected)


def _fp32_like(n=1500, d=64, seed=8):
    """Pre-norm embeddings: isotropic directions, log-normal norms (CV ~ 0.3)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x * rng.lognormal(np.log(20), 0.3, size=(n, 1)), rng


def test_collapse_flagged_for_constant_direction():
    ref, rng = _fp32_like()
    direction = rng.normal(size=64)
    collapsed = direction * 4.7 / np.linalg.norm(direction) + 1e-3 * rng.normal(size=ref.shape)
    rep = collapse_report(collapsed, ref)
    assert rep.collapsed
    assert rep.mean_pairwise_cosine > 0.99
    assert len(rep.reasons) == 3  # cosine, effective rank and constant norm all fire
    assert rep.effective_rank_ratio < 0.1
    alone = collapse_report(collapsed)
    assert alone.collapsed and alone.ref_effective_rank is None
    assert rep.to_dict()["reasons"] == list(rep.reasons)


def test_healthy_quantization_noise_not_flagged():
    ref, rng = _fp32_like()
    noisy = ref + 0.01 * np.abs(ref).mean() * rng.normal(size=ref.shape)
    rep = collapse_report(noisy, ref)
    assert not rep.collapsed, rep.reasons
    assert rep.effective_rank_ratio == pytest.approx(1.0, abs=0.05)
    assert not collapse_report(noisy).collapsed


def test_anisotropic_reference_not_flagged_for_noise():
    # a healthy model whose embeddings share a strong common component (mean cos ~0.8)
    rng = np.random.default_rng(9)
    ref = 2.0 * np.ones(64) + rng.normal(size=(1000, 64))
    assert 0.7 < mean_pairwise_cosine(ref) < COLLAPSE_MEAN_COSINE_NO_REF
    noisy = ref * (1 + 0.01 * rng.normal(size=ref.shape))
    assert not collapse_report(noisy, ref).collapsed


def test_already_anisotropic_reference_small_move_not_flagged():
    # reference mean cosine ~0.92; the test moves it a little above, not 5x closer to 1
    rng = np.random.default_rng(10)
    common, noise = 3.5 * np.ones(64), rng.normal(size=(1000, 64))
    ref, test = common + noise, common + 0.9 * noise
    assert 0.9 < mean_pairwise_cosine(ref) < mean_pairwise_cosine(test) < 0.98
    assert not collapse_report(test, ref).collapsed


def test_moderate_degradation_is_not_collapse():
    # rank halved-ish and norm spread halved: worse, but not the "everyone matches" failure
    ref, rng = _fp32_like()
    test = ref.copy()
    test[:, 32:] *= 0.3
    norms = np.linalg.norm(ref, axis=1, keepdims=True)
    test *= np.sqrt(norms.mean() / norms)  # log-normal spread roughly halved
    rep = collapse_report(test, ref)
    assert rep.effective_rank_ratio < 0.95 and rep.norm_cv_ratio < 0.6
    assert not rep.collapsed, rep.reasons


def test_constant_norm_flagged_only_when_reference_norms_vary():
    ref, _ = _fp32_like()
    unit = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    rep = collapse_report(unit * 2.0, ref)  # directions kept, pre-norm constant ~2
    assert rep.collapsed and len(rep.reasons) == 1 and "norm" in rep.reasons[0]
    assert not collapse_report(unit * 2.0, unit).collapsed  # L2-normalised reference
    near_unit = unit * (1 + 0.01 * np.random.default_rng(0).normal(size=(len(unit), 1)))
    assert not collapse_report(unit * 2.0, near_unit).collapsed  # reference CV ~0.01


def test_rank_drop_flagged():
    ref, rng = _fp32_like()
    low = ref.copy()
    low[:, 2:] = 0.0  # only 2 of 64 directions survive
    low += 1e-6 * rng.normal(size=low.shape)
    rep = collapse_report(low, ref)
    assert rep.collapsed and any("effective rank" in r for r in rep.reasons)


def test_collapse_subset_is_seeded_and_bounded():
    ref, _ = _fp32_like(n=3000)
    a = collapse_report(ref, ref, max_rows=500, seed=1)
    b = collapse_report(ref, ref, max_rows=500, seed=1)
    assert a == b
    assert a.effective_rank <= 64 and not a.collapsed
    with pytest.raises(MetricInputError):
        collapse_report(ref, ref[:10])


def test_resemblance_note_fires_below_the_cosine_threshold_or_near_chance():
    from quantscope.tasks.metrics import RESEMBLE_MIN_COSINE, resemblance_note

    assert resemblance_note(0.999, agreement=0.97, candidates=1000) is None
    low = resemblance_note(0.18)
    assert low and low.startswith("NOT LIKE FP32") and "0.180" in low
    assert resemblance_note(RESEMBLE_MIN_COSINE) is None
    chance = resemblance_note(0.95, agreement=0.005, candidates=1000)
    assert chance and "near chance" in chance
    assert resemblance_note(0.95, agreement=0.5, candidates=1000) is None


def test_reference_indicators_are_computed_once_per_contents_and_follow_a_changed_reference():
    """The reference's collapse indicators (an SVD) are memoised on its bytes: a second
    report against the same reference reads them back bit for bit, and a reference
    changed in place gets its own numbers, never the stale ones."""
    from quantscope.tasks import metrics as M

    rng = np.random.default_rng(3)
    ref = rng.normal(size=(64, 16)).astype(np.float32)
    test = ref + 0.05 * rng.normal(size=ref.shape).astype(np.float32)
    M._REF_INDICATORS.clear()
    first = M.collapse_report(test, reference=ref)
    assert len(M._REF_INDICATORS) == 1
    assert M.collapse_report(test, reference=ref) == first
    assert len(M._REF_INDICATORS) == 1  # read back, not computed again
    ref[:, 0] = 0.0  # the same array object, other contents
    changed = M.collapse_report(test, reference=ref)
    M._REF_INDICATORS.clear()
    assert changed == M.collapse_report(test, reference=ref)  # as computed afresh
    assert changed.ref_effective_rank != first.ref_effective_rank


@pytest.mark.parametrize("case", ["gaussian", "tall", "anisotropic", "near_collapse",
                                  "collapse_1e-6", "identical_rows", "rank_one", "zeros"])
def test_effective_rank_by_the_gram_matrix_is_the_svd_figure(case):
    """The Gram-matrix eigenvalues give the SVD's effective rank within 1e-6 relative, on
    wide and tall matrices, anisotropic and nearly collapsed rows, rank one and zeros."""
    rng = np.random.default_rng(7)
    x = {"gaussian": lambda: rng.normal(size=(64, 384)),
         "tall": lambda: rng.normal(size=(900, 48)),
         "anisotropic": lambda: rng.normal(size=(64, 384)) * np.logspace(0, -4, 384) + 3,
         "near_collapse": lambda: 1 + 1e-3 * rng.normal(size=(64, 384)),
         "collapse_1e-6": lambda: 1 + 1e-6 * rng.normal(size=(64, 384)),
         "identical_rows": lambda: np.tile(rng.normal(size=384), (64, 1)),
         "rank_one": lambda: np.tile([1.0, 2.0, 3.0], (10, 1)),
         "zeros": lambda: np.zeros((4, 3))}[case]().astype(np.float32)
    assert effective_rank(x) == pytest.approx(effective_rank_svd(x), rel=1e-6, abs=1e-12)


def test_effective_rank_at_float32_rounding_noise_differs_by_at_most_1e_5():
    """Rows equal up to float32 rounding: both figures are noise (~1.00001), within 1e-5."""
    rng = np.random.default_rng(8)
    for _ in range(4):
        x = (np.tile(rng.normal(size=384), (64, 1))
             + 1e-7 * rng.normal(size=(64, 384))).astype(np.float32)
        assert effective_rank(x) == pytest.approx(effective_rank_svd(x), rel=1e-5)
