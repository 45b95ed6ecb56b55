"""MTCNN's regressions judged as a user acts on them (h60, after h56's ``scale=``):

- the error on the photo: 1 px of O-Net's 48-px crop is 4 px of a 192-px face; the model
  does not know the box, so ``photo=PX`` declares its side and the distances are given in
  pixels of the photo too (``point_error_mean_photo``, ``point_error_max_photo``);
- P-Net's box map ``[N, 4, h, w]`` was judged at every position, though a host draws a
  box only where its face map ``prob [N, 2, h, w]`` passes 0.6: ``where=prob:1>0.6``
  judges the positions FP32's face channel keeps, and counts them;
- with two points outputs the verdict gave one figure, the worst output's, without saying
  whose, and the other output's nowhere: a line now names it and gives each output's.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from evaluate_cli import assert_layout_refused, calibrated_folder, evaluated, saved_folder
from onnx import TensorProto, helper, numpy_helper
from test_h56_points_scale import _landmarks, _onet_like

from quantscope.cli import main
from quantscope.tasks.layout import OutputTasks
from quantscope.tasks.points import PointsTask
from quantscope.tasks.points_gate import PointsGate
from quantscope.tasks.worst_output import MARK
from quantscope.types import Outputs


def _outs(**arrays: np.ndarray) -> Outputs:
    return Outputs(names=tuple(arrays), batches=(tuple(a.astype(np.float32)
                                                      for a in arrays.values()),))


def test_photo_error_is_the_crop_error_times_the_box_over_the_crop():
    """A box of 192 px: a pixel of the 48-px crop is 4 px of the photo."""
    ref, test = _landmarks()  # 2.4 px and 0.48 px of the crop
    task = PointsTask(name="p", output="lm", scale=(48.0, 48.0), scale_read="scale=48",
                      order="planar", photo=192.0)
    m = task.metrics(_outs(lm=ref), _outs(lm=test))
    v = m.values
    assert v["point_error_max_photo"] == pytest.approx(9.6, rel=1e-5)
    assert v["point_error_mean_photo"] == pytest.approx(4 * (2.4 + 0.48) / 10, rel=1e-5)
    assert v["point_error_max"] == pytest.approx(2.4, rel=1e-5)  # the crop's, as before
    assert v["point_agreement"] == pytest.approx(0.9)  # judged in pixels of the crop
    assert any("on the photo, for a box of 192 px (photo=192, as declared" in n and
               "a pixel of the crop is 4 px of the photo" in n and "max 9.6 px of the photo" in n
               and "within 1 px of the crop" in n for n in m.notes), m.notes
    assert "on the photo too, for a box of 192 px (photo=192)" in task.describe()


def _box_map() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P-Net-like: boxes ``[1, 4, 1, 3]`` (3 positions, 2 corners each), the face channel
    0.1, 0.9, 0.7. Position 0 (no face) moves by 10 px of the 12-px window, position 2's
    second corner by 5 px."""
    ref = np.zeros((1, 4, 1, 3))
    test = ref.copy()
    test[0, 0, 0, 0] = 10 / 12  # x1 of position 0: 10 px
    test[0, 2, 0, 2], test[0, 3, 0, 2] = 0.25, 1 / 3  # corner 2 of position 2: 5 px
    prob = np.zeros((1, 2, 1, 3))
    prob[0, 1, 0] = [0.1, 0.9, 0.7]
    prob[0, 0] = 1 - prob[0, 1]
    return ref, test, prob


def test_a_box_map_gated_by_the_face_map_is_judged_where_a_box_is_drawn():
    ref, test, prob = _box_map()
    gate = PointsGate(output="prob", channel=1, threshold=0.6)
    task = PointsTask(name="b", output="boxes", scale=(12.0, 12.0), order="channels", gate=gate)
    m = task.metrics(_outs(boxes=ref, prob=prob), _outs(boxes=test, prob=prob))
    v = m.values
    assert v["point_judged"] == 4  # positions 1 and 2, two corners each
    assert v["point_agreement"] == pytest.approx(0.75)
    assert v["point_error_max"] == pytest.approx(5.0, rel=1e-5)  # not position 0's 10 px
    assert v["point_error_mean"] == pytest.approx(5.0 / 4, rel=1e-5)
    assert any("judged at 2 of 3 positions (4 of 6 points), where FP32's 'prob' channel 1 > "
               "0.6 (where=prob:1>0.6)" in n and "the other 2 are not judged" in n
               for n in m.notes), m.notes
    assert any("NOT LIKE FP32: output 'boxes': 1 of 4 points judged move more than 5" not in n
               for n in m.notes)
    assert any("1 of 4 points judged move more than 1 px" in n for n in m.notes), m.notes
    every = PointsTask(name="b", output="boxes", scale=(12.0, 12.0), order="channels").metrics(
        _outs(boxes=ref, prob=prob), _outs(boxes=test, prob=prob)).values
    assert every["point_error_max"] == pytest.approx(10.0, rel=1e-5)
    assert every["point_agreement"] == pytest.approx(4 / 6)


def test_a_gate_of_one_score_per_sample_judges_whole_samples():
    """O-Net-like: boxes ``[3, 4]`` judged on the samples whose face score passes 0.7."""
    ref = np.zeros((3, 4))
    test = ref.copy()
    test[0, 0] = 0.5  # sample 0 (no face): 24 px at 48
    test[2, 1] = 0.01  # sample 2: 0.48 px
    prob = np.array([[0.9, 0.1], [0.2, 0.8], [0.1, 0.9]])
    gate = PointsGate(output="prob", channel=1, threshold=0.7)
    m = PointsTask(name="b", output="boxes", scale=(48.0, 48.0), gate=gate).metrics(
        _outs(boxes=ref, prob=prob), _outs(boxes=test, prob=prob))
    v = m.values
    assert any("judged on 2 of 3 samples (4 of 6 points), where FP32's 'prob' channel 1 > 0.7 "
               "(where=prob:1>0.7): the points a host keeps; the other 2 are not judged" in n
               for n in m.notes), m.notes
    assert v["point_judged"] == 4 and v["point_agreement"] == 1.0
    assert v["point_error_max"] == pytest.approx(0.48, rel=1e-4)


def test_a_gate_that_keeps_nothing_judges_nothing_and_says_so():
    ref, test, prob = _box_map()
    gate = PointsGate(output="prob", channel=1, threshold=0.95)
    m = PointsTask(name="b", output="boxes", scale=(12.0, 12.0), order="channels",
                   gate=gate).metrics(_outs(boxes=ref, prob=prob), _outs(boxes=test, prob=prob))
    assert math.isnan(m.values["point_agreement"]) and m.values["point_judged"] == 0
    assert any("no point judged: where FP32's 'prob' channel 1 > 0.95" in n for n in m.notes)
    both = OutputTasks(name="o", tasks=(PointsTask(name="b", output="boxes", scale=(12.0, 12.0),
                                                   order="channels", gate=gate),
                                        PointsTask(name="c", output="corners")),
                       headline="point_agreement").metrics(
        _outs(boxes=ref, prob=prob, corners=ref), _outs(boxes=test, prob=prob, corners=ref))
    note = next(n for n in both.notes if n.startswith(MARK))
    assert "'boxes' no point judged (no FP32 score passes where=prob:1>0.95)" in note, note
    # the worst over the outputs with a figure, whichever is declared first (min over a NaN
    # had given NaN with the gated output first, the other's with it second)
    assert both.values["point_agreement"] == 1.0
    assert "is the worst output's, 'corners''s" in note, note


def test_two_points_outputs_name_the_worst_and_give_each():
    ref, test = _landmarks()
    boxes = np.zeros((2, 4))
    lm = PointsTask(name="l", output="lm", scale=(48.0, 48.0), order="planar")
    bx = PointsTask(name="b", output="boxes", scale=(48.0, 48.0))
    m = OutputTasks(name="o", tasks=(bx, lm), headline="point_agreement").metrics(
        _outs(boxes=boxes, lm=ref), _outs(boxes=boxes, lm=test))
    assert m.values["point_agreement"] == pytest.approx(0.9)  # the landmarks', the worst
    note = next(n for n in m.notes if n.startswith(MARK))
    assert "is the worst output's, 'lm''s" in note, note
    assert "'boxes' 100.0 % within 1 px (mean 0 px, max 0 px)" in note, note
    assert "'lm' 90.0 % within 1 px (mean 0.288 px, max 2.4 px)" in note, note
    same = OutputTasks(name="o", tasks=(bx, lm), headline="point_agreement").metrics(
        _outs(boxes=boxes, lm=ref), _outs(boxes=boxes, lm=ref))
    assert any("is the worst output's, 'boxes''s (tied with 'lm')" in n for n in same.notes)


# ---- through the CLI: a P-Net-like model (a box map beside a face map) --------------------

def _pnet_like() -> onnx.ModelProto:
    r = np.random.default_rng(60)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "wb", "bb"], ["boxes"], strides=[4, 4]),
         helper.make_node("Conv", ["input", "wp", "bp"], ["logits"], strides=[4, 4]),
         helper.make_node("Softmax", ["logits"], ["prob"], axis=1)],
        "pnet_like", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                   ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 2, 4, 4]),
         helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4, 4, 4])],
        [numpy_helper.from_array(r.normal(0, 0.05, (4, 3, 4, 4)).astype(np.float32), "wb"),
         numpy_helper.from_array(np.zeros(4, np.float32), "bb"),
         numpy_helper.from_array(r.normal(0, 0.3, (2, 3, 4, 4)).astype(np.float32), "wp"),
         numpy_helper.from_array(np.array([0.0, -0.3], np.float32), "bp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def pnet(tmp_path_factory):
    x = np.random.default_rng(3).uniform(-1, 1, (12, 3, 16, 16)).astype(np.float32)
    return calibrated_folder(tmp_path_factory.mktemp("pnet"), "pnet", _pnet_like(), x)


def test_evaluate_judges_the_box_map_where_the_face_map_passes(pnet, capsys):
    every = evaluated(capsys, pnet, "pnet.onnx", "pnet.npz",
                      "--layout", "boxes=points:scale=12,order=channels")
    gated = evaluated(capsys, pnet, "pnet.onnx", "pnet.npz",
                      "--layout", "boxes=points:scale=12,order=channels,where=prob:1>0.6")
    m = gated["metrics"]
    # which positions pass, from FP32's face map itself
    sess_in = np.load(pnet / "pnet.npz")["input"]
    import onnxruntime as ort
    prob = ort.InferenceSession(str(pnet / "pnet.onnx")).run(["prob"], {"input": sess_in})[0]
    passed = int((prob[:, 1] > 0.6).sum())
    assert 0 < passed < prob[:, 1].size, passed  # the test data keeps some, not all
    assert m["point_judged:boxes"] == 2 * passed  # prob is read as class scores beside it
    assert "point_judged:boxes" not in every["metrics"]
    assert any(f"judged at {passed} of {prob[:, 1].size} positions ({2 * passed} of "
               f"{2 * prob[:, 1].size} points), where FP32's 'prob' channel 1 > 0.6" in n
               for n in gated["notes"]), gated["notes"]
    assert any("only where FP32's 'prob' channel 1 > 0.6 (where=prob:1>0.6)" in n
               for n in gated["notes"]), gated["notes"]


@pytest.mark.parametrize(("layout", "needle"), [
    ("boxes=points:order=channels,photo=192", "photo=192 is the box side in photo pixels"),
    ("boxes=points:order=channels,scale=12,photo=0", "photo 0 is outside (0, inf]"),
    ("boxes=points:order=channels,scale=12,photo=-4", "photo -4 is outside (0, inf]"),
    ("boxes=points:order=channels,scale=12,photo=face", "photo 'face' is not a number"),
    ("boxes=points:order=channels,scale=12,photo=inf", "photo 'inf' is not a finite number"),
    ("boxes=points:order=channels,where=prob", "where 'prob' is not OUT:K>T"),
    ("boxes=points:order=channels,where=prob:1>high", "where 'prob:1>high' is not OUT:K>T"),
    ("boxes=points:order=channels,where=face:1>0.6", "'face' is no other output of the model: "
                                                     "give one of 'prob'"),
    ("boxes=points:order=channels,where=boxes:1>0.6", "'boxes' is no other output"),
    ("boxes=points:order=channels,where=prob:2>0.6", "channel 2 is no channel of its axis 1"),
    ("boxes=points:where=prob:1>0.6", "is not read at the same positions: read it by "
                                      "position (order=channels"),
    ("boxes=points:dims=4,flags=2-3,where=prob:1>0.6", "where= and flags= both choose"),
])
def test_bad_photo_or_where_is_one_line(pnet, capsys, layout, needle):
    assert_layout_refused(capsys, pnet, "pnet.onnx", "pnet.npz", layout, needle)


# ---- two points outputs: evaluate's note and run's verdict -------------------------------

@pytest.fixture(scope="module")
def onet(tmp_path_factory):
    x = np.random.default_rng(0).uniform(-1, 1, (32, 3, 48, 48)).astype(np.float32)
    return saved_folder(tmp_path_factory.mktemp("onet60"), "onet", _onet_like(), x)


def test_run_verdict_names_the_worst_of_two_points_outputs_and_gives_each(onet, capsys):
    """The landmarks (second) judged within 0.1 px are the worse: the verdict's figure is
    theirs, and the line names them and gives the boxes' too, with the photo's pixels."""
    out = onet / "run"
    assert main(["run", str(onet / "onet.onnx"), "--data", str(onet / "onet.npz"),
                 "--target", "hailo8", "--out", str(out),
                 "--layout", "boxes=points:scale=48,photo=192",
                 "--layout", "landmarks=points:scale=input,order=planar,tol=0.1"]) == 0
    text = capsys.readouterr().out
    v = json.loads((out / "verdict.json").read_text())
    said = v["outputs_headline"]
    assert said.startswith("point_agreement (the figure without an output name) is the worst "
                           "output's, 'landmarks''s: 'boxes' "), said
    assert "on the photo (a box of 192 px) mean" in said and "'landmarks' " in said, said
    ev = json.loads((out / "evaluate.json").read_text())["results"]["plan"]["metrics"]
    assert v["headline"]["value"] == pytest.approx(ev["point_agreement:landmarks"])
    assert ev["point_agreement:landmarks"] < ev["point_agreement:boxes"]
    assert f"  outputs (plan, held out): {said}" in text.splitlines(), text


def test_run_verdict_counts_the_points_judged_where_the_face_map_passes(pnet, capsys):
    out = pnet / "run"
    assert main(["run", str(pnet / "pnet.onnx"), "--data", str(pnet / "pnet.npz"),
                 "--target", "hailo8", "--out", str(out),
                 "--layout", "boxes=points:scale=12,order=channels,where=prob:1>0.6,photo=48"]
                ) == 0
    text = capsys.readouterr().out
    v = json.loads((out / "verdict.json").read_text())
    ev = json.loads((out / "evaluate.json").read_text())["results"]["plan"]["metrics"]
    judged = int(ev["point_judged:boxes"])
    assert len(v["gated"]) == 1 and f"({judged} of " in v["gated"][0], v["gated"]
    assert "where FP32's 'prob' channel 1 > 0.6" in v["gated"][0], v["gated"]
    assert f"  judged (plan, held out): {v['gated'][0]}" in text.splitlines(), text
    # one points output: the photo's pixels on the verdict too (a window of 48 px, 4 x 12)
    assert len(v["on_photo"]) == 1 and "output 'boxes': on the photo, for a box of 48 px" in \
        v["on_photo"][0] and "a pixel of the crop is 4 px of the photo" in v["on_photo"][0]
    assert f"{ev['point_error_max_photo:boxes']:.4g} px of the photo" in v["on_photo"][0]
    assert ev["point_error_max_photo:boxes"] == pytest.approx(4 * ev["point_error_max:boxes"])
    assert f"  photo (plan, held out): {v['on_photo'][0]}" in text.splitlines(), text


# a gate that keeps no point on the fit data is refused before the run (h62), and one that
# keeps none held out only is said on the verdict: tests/test_h62_no_figure.py
