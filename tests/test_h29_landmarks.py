"""A MediaPipe hand-landmark-style model: ``landmarks [N, 3 * P]`` (x, y, z per point, in
input pixels) and a hand-presence probability ``flag [N, 1]`` (Sigmoid) beside them.

On data without hands FP32's flag is below 0.5 on every sample: the one-value-per-sample
fidelity printed ``100.0 % of samples decided as FP32`` and said nothing else (the declared
``score`` task said the agreement says little; the undeclared scoring did not)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from evaluate_cli import assert_layout_refused, evaluated
from tiny_models import _rng, _with_weights

from quantscope.cli import main

POINTS = 4


def hand_landmarks(seed: int = 29, flag_bias: float = -6.0) -> onnx.ModelProto:
    r = _rng(seed)
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    hand (float[N, 8] input) => (float[N, {3 * POINTS}] landmarks, float[N, 1] flag) {{
        h = Gemm (input, w1, b1)
        a = Relu (h)
        landmarks = Gemm (a, wl, bl)
        f = Gemm (a, wf, bf)
        flag = Sigmoid (f)
    }}
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.5, (8, 16)).astype(np.float32),
        "b1": r.normal(0, 0.1, 16).astype(np.float32),
        "wl": r.normal(0, 8.0, (16, 3 * POINTS)).astype(np.float32),
        "bl": np.tile(np.array([112.0, 112.0, 0.0], np.float32), POINTS),
        "wf": r.normal(0, 0.3, (16, 1)).astype(np.float32),
        "bf": np.array([flag_bias], np.float32),
    })


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    d = tmp_path_factory.mktemp("hand")
    onnx.save(hand_landmarks(), d / "hand.onnx")
    np.savez(d / "hand.npz", input=np.random.default_rng(0).normal(0, 1, (32, 8)).astype(
        np.float32))
    assert main(["calibrate", str(d / "hand.onnx"), "--data", str(d / "hand.npz"),
                 "--out", str(d / "stats.npz")]) == 0
    return d


def _evaluate(d, capsys, *extra: str) -> dict:
    return evaluated(capsys, d, "hand.onnx", "hand.npz", *extra)


def test_a_flag_fp32_never_raises_is_said_to_say_little(hand, capsys):
    r = _evaluate(hand, capsys)
    notes = [n for n in r["notes"] if "'flag'" in n]
    assert any("FP32 decides the same on every sample at 0.5" in n and "says little" in n
               for n in notes), notes


def test_points_task_measures_the_distance_over_x_y():
    from quantscope.tasks.points import PointsTask
    from quantscope.types import Outputs

    ref = np.array([[10.0, 10.0, 0.0, 50.0, 50.0, 5.0], [20.0, 20.0, 0.0, 90.0, 90.0, 5.0]])
    test = ref.copy()
    test[0, 3:5] += [3.0, 4.0]  # one point moves 5 px
    test[1, 2] += 100.0  # a depth change is not measured
    out = lambda a: Outputs(names=("lm",), batches=((a.astype(np.float32),),))  # noqa: E731
    m = PointsTask(name="p", output="lm", dims=3, tolerance=2.0).metrics(out(ref), out(test))
    v = m.values
    assert v["point_agreement"] == pytest.approx(0.75)
    assert v["point_error_max"] == pytest.approx(5.0) and v["point_error_mean"] == pytest.approx(1.25)
    assert any("NOT LIKE FP32: output 'lm': 1 of 4 points move more than 2" in n for n in m.notes)
    default = PointsTask(name="p", output="lm", dims=3).metrics(out(ref), out(test)).values
    assert default["point_tolerance"] == pytest.approx(0.8)  # 1 % of the x, y span of 80


def test_landmarks_declared_as_points_on_the_cli(hand, capsys):
    r = _evaluate(hand, capsys, "--layout", "landmarks=points:dims=3")
    m = r["metrics"]
    assert 0.0 <= m["point_agreement"] <= 1.0 and m["point_error_max"] >= m["point_error_mean"]
    assert m["point_agreement_items"] > 0
    assert any("output 'landmarks' read as points of 3 values, judged by the distance over "
               "x, y (the 3rd value not measured)" in n for n in r["notes"]), r["notes"]


@pytest.mark.parametrize(("layout", "needle"), [
    ("landmarks=points:dims=5", "12 values per sample are no whole number of points of 5"),
    ("landmarks=points:dims=0", "dims '0' is not a whole number of 1 or more"),
    ("landmarks=points:tol=-1", "tol -1 is outside (0, inf]"),
    ("landmarks=points:axis=1", "'axis' is no key of kind points (keys: dims, tol, flags, threshold, scale, order, photo, where)"),
])
def test_bad_points_layout_is_one_line(hand, capsys, layout, needle):
    assert_layout_refused(capsys, hand, "hand.onnx", "hand.npz", layout, needle)


def test_two_point_outputs_keep_each_tolerance_and_no_unprefixed_one():
    """Pixels and metres beside each other: each output's tol is its own; a 'worst'
    tolerance over both would be a number of no unit."""
    from quantscope.tasks.layout import OutputTasks
    from quantscope.tasks.points import PointsTask
    from quantscope.types import Outputs

    px = np.array([[10.0, 10.0, 50.0, 50.0], [20.0, 20.0, 90.0, 90.0]])
    m = px / 1000.0
    out = Outputs(names=("px", "m"), batches=((px.astype(np.float32), m.astype(np.float32)),))
    tasks = OutputTasks(name="o", tasks=(PointsTask(name="a", output="px"),
                                         PointsTask(name="b", output="m")),
                        headline="point_agreement")
    v = tasks.metrics(out, out).values
    assert v["point_tolerance:px"] == pytest.approx(0.8)
    assert v["point_tolerance:m"] == pytest.approx(0.0008)
    assert "point_tolerance" not in v and v["point_agreement"] == 1.0


def test_verdict_counts_a_landmark_share_in_points():
    from quantscope.report.summary import sample_size

    v = {"held_out": {"samples": 45}, "metric": "point_agreement",
         "quality": {"plan": {"point_agreement": 0.139, "point_agreement_items": 195.0,
                              "point_agreement_clusters": 45.0}}}
    assert sample_size(v) == "n=45 held-out samples, an effective 195 points"


def _static_two_outputs() -> onnx.ModelProto:
    """A tflite2onnx-style static export ``[1, 3, 224, 224]`` with two outputs."""
    r = _rng(30)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    static (float[1, 3, 224, 224] input_1) => (float[1, 8] Identity, float[1, 1] Identity_1) {
        c = Conv <strides = [4, 4]> (input_1, wc, bc)
        p = GlobalAveragePool (c)
        f = Flatten (p)
        Identity = Gemm (f, we, be)
        g = Gemm (f, wf, bf)
        Identity_1 = Sigmoid (g)
    }
    """
    return _with_weights(text, {
        "wc": r.normal(0, 0.3, (8, 3, 4, 4)).astype(np.float32),
        "bc": r.normal(0, 0.1, 8).astype(np.float32),
        "we": r.normal(0, 0.5, (8, 8)).astype(np.float32),
        "be": np.zeros(8, np.float32),
        "wf": r.normal(0, 0.5, (8, 1)).astype(np.float32),
        "bf": np.zeros(1, np.float32),
    })


def test_photos_on_a_static_batch_one_model_run_and_say_what_is_scored(tmp_path, capsys):
    """The photos were fed 12 at a time to a model that takes 1 ('internal error:
    InvalidArgument ... Got invalid dimensions'), and nothing said which output the
    retrieval read: the first, the others for fidelity only."""
    onnx.save(_static_two_outputs(), tmp_path / "m.onnx")
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", "photos-small",
                 "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["evaluate", str(tmp_path / "m.onnx"), "--data", "photos-small", "--stats",
                 str(tmp_path / "s.npz"), "--precision", "a8_w8", "--json",
                 str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert any("the view retrieval task reads the first output 'Identity' [1,8] as the "
               "embedding; output 'Identity_1' [1,1] scored for fidelity only" in n
               for n in notes), notes
