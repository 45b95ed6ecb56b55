"""Each share headline counts its items where it is computed (``KEY_items``,
:mod:`quantscope.tasks.shares`), so ``run --rewrites auto`` gives it a binomial margin:
a class output's top-1 agreement (per position: the effective count, positions clustered
by sample), a score output's decisions, image views, detection F1 over the detections of
either model (a matched pair once). Before, these had no count: the reason said "no noise
estimate" and a gain of one item kept a rewrite; now one item is a tie.

Real ORT sessions on tiny models (``run``'s own measure) for the class, score and
detection outputs; the view task's metrics on arrays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from outside_models import feeds, mixed_scale_detector, scalar_probability
from test_h14_share_noise import _split_trial
from tiny_models import _rng, _with_weights

from quantscope import stages
from quantscope.pipeline.auto import max_legal_measure
from quantscope.pipeline.data import open_fit_data
from quantscope.targets import load_target
from quantscope.tasks.classes import ClassTask
from quantscope.tasks.detection import DetectionLayout, DetectionTask
from quantscope.tasks.headline import share_items
from quantscope.tasks.images import ViewRetrievalTask
from quantscope.tasks.layout import OutputTasks, parse_layout
from quantscope.tasks.shares import clustered_items
from quantscope.types import Outputs


def per_position_classifier(seed: int = 21) -> onnx.ModelProto:
    """``x [N, 4, 6, 6]`` -> 1x1 Conv -> Softmax over axis 1 -> ``probs [N, 5, 6, 6]``: a
    class per position (a segmentation's, a per-token classifier's)."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    seg (float[N, 4, 6, 6] x) => (float[N, 5, 6, 6] probs) {
        c = Conv (x, w, b)
        probs = Softmax <axis = 1> (c)
    }
    """
    return _with_weights(text, {"w": r.normal(0, 0.5, (5, 4, 1, 1)).astype(np.float32),
                                "b": r.normal(0, 0.1, 5).astype(np.float32)})


def _run_measure(tmp_path, proto, data, metric, layout=(), target="ort-cpu"):
    """``run``'s measure (``plan --max-legal`` emulated in ORT on the fit rows) of the
    model on ``data``."""
    onnx.save(proto, tmp_path / "m.onnx")
    np.savez(tmp_path / "data.npz", **data)
    model = stages.open_model(tmp_path / "m.onnx")
    fit = open_fit_data(model, str(tmp_path / "data.npz"), eval_data=None, pairs=None,
                        tokenizer=None, layout=tuple(parse_layout(s) for s in layout))
    stats = stages.calibrate_model(model, fit, progress=False)
    got = max_legal_measure(fit, load_target(target), metric, seq_len=None,
                            tiebreak="sqnr_db")(model, stats)
    return got, sum(len(next(iter(b.values()))) for b in fit.evaluation)


def _one_item_apart(tmp_path, value, share_of):
    """The tokensplit trial of test_h14 with a headline one item better (``share_of``'s
    count) and an equal tiebreak: (trial, kept proto)."""
    (tmp_path / "auto").mkdir(exist_ok=True)
    step = 1.0 / share_of[0]
    return _split_trial(tmp_path / "auto", step, 0.0, share_of, base=min(value, 1.0 - step))


def _says_a_tie(trial, share_of):
    assert trial.tried and not trial.kept, trial.reason
    assert "a tie within noise" in trial.reason and "binomial noise" in trial.reason
    assert f"n {share_of[0]} {share_of[1]}" in trial.reason, trial.reason
    assert "no per-sample scores: no noise estimate" not in trial.reason


def test_without_a_count_one_item_keeps_the_rewrite(tmp_path):
    """What the cases below had before: no count, no noise estimate, one item kept it."""
    t, proto = _split_trial(tmp_path, 1.0 / 288, 0.0, None, base=0.9)
    assert t.kept and proto is not None and "no noise estimate" in t.reason


def test_a_per_position_class_output_counts_its_positions_clustered_by_sample(tmp_path):
    x = np.random.default_rng(0).normal(0, 1, (32, 4, 6, 6)).astype(np.float32)
    # QNN's max-legal plan flips a position or so: a share below 1, a count to estimate
    got, samples = _run_measure(tmp_path, per_position_classifier(), {"x": x},
                                "top1_agreement", target="qnn-htp-v73")
    assert got.share_of is not None, "no count: no noise estimate"
    n, what = got.share_of
    assert 0.9 < got.value < 1.0
    assert samples < n <= samples * 36  # between the samples and every position
    assert f"positions clustered by their {samples} samples" in what
    _says_a_tie(_one_item_apart(tmp_path, got.value, got.share_of)[0], got.share_of)


def test_the_effective_count_follows_how_positions_cluster():
    sizes = np.full(8, 100)
    # every sample agrees on the same share of its positions: as if independent
    assert clustered_items(np.full(8, 90), sizes) == 800
    # whole samples agree or not: the positions of one sample are one item
    assert clustered_items(np.array([100] * 6 + [0] * 2), sizes) == 8
    mixed = clustered_items(np.array([95, 85, 90, 92, 88, 80, 99, 91]), sizes)
    assert 8 < mixed < 800
    assert clustered_items(np.full(8, 100), sizes) == 800  # all agree: no sign of clusters
    assert clustered_items(np.array([50]), np.array([100])) == 1  # one sample: no spread


def test_a_class_output_per_sample_counts_its_samples():
    rng = np.random.default_rng(1)
    r = rng.normal(0, 1, (12, 5))
    t = r + rng.normal(0, 0.5, r.shape)
    out = lambda a: Outputs(names=("y",), batches=((a[:7],), (a[7:],)))  # noqa: E731
    v = ClassTask("c", "y").metrics(out(r), out(t)).values
    assert share_items(None, "top1_agreement", v) == (12, "top-1 picks")


def test_a_score_output_counts_its_decisions(tmp_path):
    got, samples = _run_measure(tmp_path, scalar_probability(),
                                feeds("scalar_probability", 32), "decision_agreement",
                                layout=("speech=score",))
    assert got.share_of == (samples, "decisions")
    _says_a_tie(_one_item_apart(tmp_path, got.value, got.share_of)[0], got.share_of)


def test_image_views_count_their_views(tmp_path):
    rng = np.random.default_rng(0)
    photo = np.repeat(np.arange(4, dtype=np.int32), 3)
    tokens = rng.normal(0, 1, (4, 5, 8))[photo] + rng.normal(0, 0.3, (12, 5, 8))
    noisy = tokens + rng.normal(0, 0.3, tokens.shape)
    out = lambda a: Outputs(names=("tokens",), batches=((a[:6],), (a[6:],)))  # noqa: E731
    v = ViewRetrievalTask(name="t", photo=photo).metrics(out(tokens), out(noisy)).values
    share = share_items(None, "top1_agreement", v)
    assert share == (12, "top-1 picks")
    _says_a_tie(_one_item_apart(tmp_path, v["top1_agreement"], share)[0], share)


def _det(scores: np.ndarray) -> np.ndarray:
    a = scores.shape[1]
    boxes = np.stack([20.0 * np.arange(a) + 5, np.full(a, 5.0), np.full(a, 10.0),
                      np.full(a, 10.0)])
    return np.concatenate([boxes, scores])[None].astype(np.float32)


def test_detection_f1_counts_the_detections_of_either_model_a_matched_pair_once():
    task = DetectionTask(name="d", output="det", layout=DetectionLayout())
    ref = _det(np.array([[0.9, 0.1, 0.6, 0.1], [0.1, 0.8, 0.1, 0.1]]))
    test = _det(np.array([[0.9, 0.1, 0.1, 0.1], [0.1, 0.1, 0.7, 0.9]]))
    one = lambda a: Outputs(names=("det",), batches=((a,),))  # noqa: E731
    v = task.metrics(one(ref), one(test)).values
    # FP32 keeps 3, the quantized model 3 (one matched, two extra), F1 = 2 x 1 / 6
    assert (v["detections_fp32"], v["detections_quantized"]) == (3, 3)
    assert v["detection_f1"] == pytest.approx(1 / 3)
    assert share_items(task, "detection_f1", v) == (
        5, "detections of either model (a matched pair once)")
    assert share_items(task, "detection_recall", v) == (3, "FP32 detections")
    assert share_items(task, "detection_precision", v) == (3, "quantized detections")


def test_run_measures_detection_f1_over_both_models_detections(tmp_path):
    got, _ = _run_measure(tmp_path, mixed_scale_detector(),
                          feeds("mixed_scale_detector"), "detection_f1")
    assert got.share_of is not None
    assert got.share_of[1] == "detections of either model (a matched pair once)"
    _says_a_tie(_one_item_apart(tmp_path, got.value, got.share_of)[0], got.share_of)


def test_several_outputs_give_the_worst_outputs_own_count():
    rng = np.random.default_rng(2)
    a = rng.normal(0, 1, (10, 4))
    b = rng.normal(0, 1, (10, 3, 2, 2))
    b_test = b + rng.normal(0, 1.0, b.shape)  # b loses more of its top-1 picks
    tasks = (ClassTask("a", "a"), ClassTask("b", "b"))
    both = OutputTasks(name="o", tasks=tasks, headline="top1_agreement")
    ref = Outputs(names=("a", "b"), batches=((a, b),))
    test = Outputs(names=("a", "b"), batches=((a, b_test),))
    v = both.metrics(ref, test).values
    assert v["top1_agreement"] == v["top1_agreement:b"] < 1.0
    assert v["top1_agreement_items"] == v["top1_agreement_items:b"]
    assert v["top1_agreement_clusters"] == 10
    assert share_items(both, "top1_agreement:a", v) == (10, "top-1 picks")


def test_a_share_whose_count_differs_between_plans_uses_each_figures_own(tmp_path, capsys):
    """Detection F1's items are both models' detections: the model with the rewrite
    counts other ones. Before, unequal counts meant no noise estimate (and one item kept
    the rewrite); now each figure's binomial error is over its own count."""
    from test_h14_share_noise import SEQ, SMALL, _fit, token_encoder

    from quantscope.model.load import load_proto
    from quantscope.rewrites.auto import Measured, choose_rewrites

    what = "detections of either model (a matched pair once)"
    model = load_proto(token_encoder(), "enc")
    fit = _fit(tmp_path, model)

    def measure(m, s):
        split = any(n.name.endswith("/tok1") for n in m.graph.node)
        n = 165 if split else 163
        return Measured((150 + 2 * split) / n, 30.0, share_of=(n, what))  # +0.1 pt

    choice, proto = choose_rewrites(model, SMALL, SEQ,
                                    calibrate=lambda m: stages.calibrate_model(m, fit),
                                    measure=measure, reload=lambda p: load_proto(p, "enc"),
                                    metric="detection_f1", tiebreak="sqnr_db", progress=True)
    t = next(t for t in choice.trials if t.name == "tokensplit")
    assert t.tried and not t.kept and proto is None, t.reason
    assert f"n 163, n' 165 {what}" in t.reason and "q(1-q)/n')" in t.reason, t.reason
    # the console says the count once the model without rewrites is measured
    assert (f"rewrites auto: without rewrites detection_f1 92.0 % is a share over 163 {what}"
            in capsys.readouterr().err)


class _Stop(Exception):
    pass


def test_the_choosing_line_says_a_detection_shares_items_come_when_measured(
        tmp_path, capsys, monkeypatch):
    """It gave the fit samples alone, as if F1 were a share of them."""
    from types import SimpleNamespace

    import quantscope.pipeline.auto as auto

    def stop(*a, **k):  # the line is said before any trial: stop there
        raise _Stop

    monkeypatch.setattr(auto, "choose_rewrites", stop)
    onnx.save(mixed_scale_detector(), tmp_path / "det.onnx")
    np.savez(tmp_path / "data.npz", **feeds("mixed_scale_detector"))
    opts = SimpleNamespace(data=str(tmp_path / "data.npz"), eval_data=None, tokenizer=None,
                           prefixes=None, calib_texts=None, pairs=None, seq_len=None, input_shapes=(),
                           target="ort-cpu", method="minmax", metric=None, layout=(),
                           batch_axes=(), repair_batches=1, allow_warnings=())
    with pytest.raises(_Stop):
        auto.choose(opts, stages.open_model(tmp_path / "det.onnx"), progress=True)
    err = capsys.readouterr().err
    assert ("rewrites auto: choosing by detection_f1 on 16 fit samples (a share: its items "
            "are counted where a rewrite is measured) (a tie: by sqnr_db)") in err, err


def test_a_folder_chosen_under_the_old_share_rule_chooses_again(tmp_path):
    """The keep rule is in the auto choice's key (``pipeline.auto.auto_key``): a choice
    made when these shares had no count (one item kept a rewrite) is not reused."""
    from types import SimpleNamespace

    from quantscope.pipeline.auto import auto_key
    from quantscope.rewrites.auto import KEEP_RULE

    old = ("kept when the paired per-sample gain's one-sided 95% lower bound (Student t) is "
           "above 0; a tie within noise is decided by the tiebreak: its gain's one-sided 95% "
           "lower bound (jackknife over pairs) above 0.1, else the model without it; without "
           "per-sample scores a gain within the headline's margin (0.1 dB for a figure in dB; "
           "for a share over n items its one-sided 95% binomial noise) is a tie")
    opts = SimpleNamespace(model=str(tmp_path / "m.onnx"), data="d.npz", eval_data=None,
                           tokenizer=None, prefixes=None, calib_texts=None, pairs=None, seq_len=None, input_shapes=(), target="ort-cpu",
                           method="minmax", metric=None, layout=(), batch_axes=(), allow_warnings=())
    rule = auto_key(opts, str)["keep_rule"]
    assert rule == KEEP_RULE != old and "each figure over its own n" in rule
