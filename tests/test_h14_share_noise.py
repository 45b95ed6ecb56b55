"""``run --rewrites auto`` on a headline that is a share with no per-sample scores
(detection F1, a face verification's decision agreement): its one-sided 95 % binomial
noise over the items the share counts is the margin, so +1e-6 no longer keeps a rewrite;
a gain within it is a tie decided by the tiebreak, said with the figures. A share whose
items nothing counts keeps the old rule and says there is no noise estimate."""

import math

import numpy as np
import onnx
import pytest
from outside_models import feeds, mixed_scale_detector
from test_repair_tokens import SEQ, SMALL
from test_repair_tokens import _encoder as token_encoder

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.rewrites.auto import Measured, choose_rewrites
from quantscope.rewrites.tie import share_noise

ITEMS = (200, "FP32 detections")


def _fit(tmp_path, model):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (16, SEQ)).astype(np.int64),
             attention_mask=np.ones((16, SEQ), np.int64))
    return stages.at_length(stages.open_data(tmp_path / "x.npz", model, show=False), SEQ)


def _split_trial(tmp_path, gain, tiebreak_gain, share_of, base=0.7):
    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model)

    def measure(m, s):
        split = any(n.name.endswith("/tok1") for n in m.graph.node)
        return Measured(base + gain * split, 30.0 + tiebreak_gain * split, share_of=share_of)

    choice, proto = choose_rewrites(model, SMALL, SEQ,
                                    calibrate=lambda m: stages.calibrate_model(m, fit),
                                    measure=measure, reload=lambda p: load_proto(p, "enc"),
                                    metric="detection_f1", tiebreak="sqnr_db", margin=0.0)
    return next(t for t in choice.trials if t.name == "tokensplit"), proto


def test_share_noise_is_the_binomial_standard_error_one_sided():
    half, words = share_noise(0.7, 0.71, 200, "FP32 detections")
    se = math.sqrt((0.7 * 0.3 + 0.71 * 0.29) / 200)
    assert half == pytest.approx(1.6448536 * se, rel=1e-6)
    assert "n 200 FP32 detections" in words and "p 0.7, q 0.71" in words
    assert share_noise(0.7, 0.71, 0) is None and share_noise(1.5, 0.7, 10) is None


@pytest.mark.parametrize(("gain", "tiebreak_gain", "kept", "words"), [
    (1e-6, 0.0, False, "a tie within noise (gain +0.00010 pts, one-sided 95% binomial noise"),
    (0.02, 0.5, True, "a tie within noise (gain +2.00 pts, one-sided 95% binomial noise"),
    (0.2, 0.0, True, "measured better beyond noise (gain +20.00 pts, one-sided 95% binomial noise"),
    (-0.2, 0.5, False, "measured worse beyond noise (gain -20.00 pts"),
])
def test_a_share_headline_gain_within_its_binomial_noise_is_a_tie(tmp_path, gain,
                                                                  tiebreak_gain, kept, words):
    t, proto = _split_trial(tmp_path, gain, tiebreak_gain, ITEMS)
    assert t.tried and t.kept is kept and (proto is not None) is kept
    assert words in t.reason, t.reason
    assert "n 200 FP32 detections" in t.reason
    if gain == 0.02:
        assert "decided by better sqnr_db" in t.reason


def test_a_share_whose_items_are_not_known_says_no_noise_estimate(tmp_path):
    t, _ = _split_trial(tmp_path, 1e-6, 0.0, None)
    assert t.kept and "no per-sample scores: no noise estimate" in t.reason, t.reason


def test_the_run_measure_counts_a_detection_shares_items(tmp_path):
    """``run``'s measure on a detector's data says the F1 is over FP32's detections."""
    from quantscope.pipeline.auto import max_legal_measure
    from quantscope.pipeline.data import open_fit_data
    from quantscope.targets import load_target

    onnx.save(mixed_scale_detector(), tmp_path / "det.onnx")
    np.savez(tmp_path / "data.npz", **feeds("mixed_scale_detector"))
    model = stages.open_model(tmp_path / "det.onnx")
    fit = open_fit_data(model, str(tmp_path / "data.npz"), eval_data=None, pairs=None,
                        tokenizer=None)
    stats = stages.calibrate_model(model, fit, progress=False)
    got = max_legal_measure(fit, load_target("ort-cpu"), "detection_f1", seq_len=None,
                            tiebreak="sqnr_db")(model, stats)
    assert got.share_of is not None
    assert got.share_of[1] == "detections of either model (a matched pair once)"
    assert got.share_of[0] > 0 and 0 <= got.value <= 1


def test_a_verification_decision_agreement_is_over_its_pairs():
    from quantscope.tasks.faces import VerificationPairs
    from quantscope.tasks.headline import share_items
    from quantscope.tasks.maps import ScoreTask
    from quantscope.tasks.registry import VerificationTask

    n = 7
    pairs = VerificationPairs(first=np.arange(n), second=np.arange(n) + n,
                              genuine=np.arange(n) % 2 == 0, distance=np.array(["near"] * n),
                              change=np.array(["orig"] * n))
    task = VerificationTask("faces", pairs, threshold=0.6)
    assert share_items(task, "decision_agreement", {}) == (n, "verification pairs")
    # a score output's decision agreement: its count is in its figures (test_h18)
    assert share_items(ScoreTask("s", "y"), "decision_agreement", {}) is None
    assert share_items(ScoreTask("s", "y"), "decision_agreement",
                       {"decision_agreement_items": 9.0}) == (9, "decisions")
    assert share_items(None, "sqnr_db_channel_min", {"detections_fp32": 5.0}) is None
