"""Outputs scored by what they are: detections, probability maps, per-sample scores.

Real ORT sessions on the tiny models of ``outside_models``; the CLI through ``main``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from evaluate_cli import assert_layout_refused
from outside_models import conv_transpose_head, feeds, mixed_scale_detector, scalar_probability

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.tasks.detection import (
    DetectionLayout,
    Detections,
    DetectionTask,
    detect_layout,
    match,
    nms,
)
from quantscope.tasks.layout import LayoutError, parse_layout
from quantscope.tasks.maps import MapTask, ScoreTask
from quantscope.types import Outputs, Plan, Precision

# ---------------------------------------------------------------- pure pieces


def test_nms_is_class_aware_and_match_is_one_to_one():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [50, 50, 60, 60]], float)
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    classes = np.array([0, 0, 1, 0])
    kept = nms(boxes, scores, classes, 0.5)
    assert kept.tolist() == [0, 2, 3]  # box 1 overlaps box 0 (same class); box 2 is class 1
    ref = Detections(boxes[kept], classes[kept], scores[kept])
    test = Detections(boxes[[0, 0]], np.array([0, 0]), np.array([0.9, 0.8]))
    pairs = match(ref, test, 0.5)
    assert [(i, j) for i, j, _ in pairs] == [(0, 0)]  # one test box, matched once


def _outputs(name: str, arr: np.ndarray) -> Outputs:
    return Outputs(names=(name,), batches=((arr.astype(np.float32),),))


def _det_array(scores: np.ndarray) -> np.ndarray:
    """[1, 4 + C, A]: anchor a at x = 20 a, 10 px boxes, the given scores [C, A]."""
    a = scores.shape[1]
    boxes = np.stack([20.0 * np.arange(a) + 5, np.full(a, 5.0), np.full(a, 10.0),
                      np.full(a, 10.0)])
    return np.concatenate([boxes, scores])[None]


def test_detection_metrics_count_kept_and_lost_detections():
    task = DetectionTask(name="d", output="det", layout=DetectionLayout())
    ref = _det_array(np.array([[0.9, 0.1, 0.6], [0.1, 0.8, 0.1]]))
    test = _det_array(np.array([[0.9, 0.1, 0.1], [0.1, 0.1, 0.7]]))  # 2nd lost, 3rd wrong
    m = task.metrics(_outputs("det", ref), _outputs("det", test))
    v = m.values
    assert (v["detections_fp32"], v["detections_quantized"]) == (3, 2)
    assert v["detection_recall"] == pytest.approx(1 / 3)
    assert v["detection_precision"] == pytest.approx(1 / 2)
    assert v["detection_f1"] == pytest.approx(0.4)
    assert v["box_iou_mean"] == pytest.approx(1.0)
    assert any("NOT LIKE FP32" in n for n in m.notes)


def test_no_detection_kept_leaves_precision_unmeasured_not_zero():
    """Every class score lost (YOLOv8 at 8 bit): 0 of 0 kept detections was printed as
    'detection_precision 0.0 % (n=0)'; it is not measured, and the F1 is 0."""
    from quantscope.units import counted

    task = DetectionTask(name="d", output="det", layout=DetectionLayout())
    ref = _det_array(np.array([[0.9, 0.1, 0.6], [0.1, 0.8, 0.1]]))
    test = _det_array(np.zeros((2, 3)))
    v = task.metrics(_outputs("det", ref), _outputs("det", test)).values
    assert v["detections_quantized"] == 0 and v["detection_recall"] == 0.0
    assert np.isnan(v["detection_precision"]) and v["detection_f1"] == 0.0
    assert counted("detection_precision", v).startswith("—")


def test_anchors_first_layout_gives_the_same_metrics():
    """``[N, A, 4 + C]`` with ``axis=2`` is read as the transposed ``[N, 4 + C, A]``."""
    ref = _det_array(np.array([[0.9, 0.1, 0.6], [0.1, 0.8, 0.1]]))
    test = _det_array(np.array([[0.9, 0.1, 0.1], [0.1, 0.1, 0.7]]))
    rows = DetectionTask(name="d", output="det", layout=DetectionLayout()).metrics(
        _outputs("det", ref), _outputs("det", test)).values
    anchors = DetectionTask(name="d", output="det", layout=DetectionLayout(axis=2)).metrics(
        _outputs("det", ref.transpose(0, 2, 1)), _outputs("det", test.transpose(0, 2, 1))).values
    assert anchors == pytest.approx(rows, nan_ok=True)


def test_detection_says_when_fp32_keeps_nothing():
    task = DetectionTask(name="d", output="det", layout=DetectionLayout())
    low = _det_array(np.full((2, 3), 0.1))
    m = task.metrics(_outputs("det", low), _outputs("det", low))
    assert np.isnan(m.values["detection_f1"])  # not 1.0: nothing was compared
    assert any("FP32 keeps no detection" in n for n in m.notes)
    # the verdict's warnings pick it up ("says little"): a run on data where the model
    # detects nothing read "NOT reached: —" with no fix (nudenet on 12 skimage photos)
    from quantscope.pipeline.verdict import _says_little

    assert any("FP32 keeps no detection" in n
               for n in _says_little({"plan": {"notes": list(m.notes)}}))


def test_map_and_score_tasks():
    ref = np.zeros((2, 1, 4, 4))
    ref[:, :, :2] = 0.9  # half of each map on
    test = ref.copy()
    test[1, 0, 0, :] = 0.1  # 4 of sample 1's 8 pixels flip off
    m = MapTask(name="m", output="mask").metrics(_outputs("mask", ref), _outputs("mask", test))
    assert m.values["mask_iou"] == pytest.approx((1.0 + 0.5) / 2)
    assert m.values["mask_iou_min"] == pytest.approx(0.5)
    assert m.values["pixel_flip_share"] == pytest.approx(4 / 32)
    # FP32's foreground is a share of the pixels too: in percent, as the flips are
    from quantscope.units import value

    assert m.values["mask_share_fp32"] == pytest.approx(0.5)
    assert value("mask_share_fp32", m.values["mask_share_fp32"]) == "50.0 %"
    s = ScoreTask(name="s", output="p").metrics(
        _outputs("p", np.array([0.1, 0.6, 0.7, 0.2])), _outputs("p", np.array([0.1, 0.4, 0.7, 0.2])))
    assert s.values["decision_agreement"] == pytest.approx(0.75)
    assert s.values["score_abs_error_max"] == pytest.approx(0.2)
    assert any("1 of 4 decisions" in n for n in s.notes)


# ---------------------------------------------------------------- --layout values


def test_parse_layout_reads_every_key():
    s = parse_layout("det=detect:boxes=0-3,scores=4-,axis=1,format=xyxy,threshold=0.3,iou=0.6")
    assert (s.output, s.kind) == ("det", "detect")
    assert dict(s.options) == {"boxes": "0-3", "scores": "4-", "axis": "1", "format": "xyxy",
                               "threshold": "0.3", "iou": "0.6"}


@pytest.mark.parametrize(("text", "needle"), [
    ("det", "OUTPUT=KIND"),
    ("det=boxes", "unknown kind 'boxes'"),
    ("det=detect:box=0-3", "'box' is no key of kind detect"),
    ("det=detect:boxes=0-2", "must be 4 rows"),
    ("det=detect:boxes=3-0", "empty or negative row range"),
    ("det=detect:scores=a-b", "is not a row range"),
    ("det=detect:iou=0", "outside (0, 1]"),
    ("det=detect:format=xywh", "format 'xywh' is unknown"),
    ("det=map:threshold=inf", "not a finite number"),
    ("det=map:threshold=0.5,threshold=0.6", "given twice"),
    ("det=tensor:threshold=0.5", "keys: none"),
])
def test_bad_layout_values_name_the_fix(text, needle):
    with pytest.raises(LayoutError, match=None) as info:
        parse_layout(text)
    assert needle in str(info.value) and str(info.value).startswith("--layout ")


# ---------------------------------------------------------------- the fixtures, end to end


@pytest.fixture(scope="module")
def det(tmp_path_factory):
    d = tmp_path_factory.mktemp("det")
    onnx.save(mixed_scale_detector(), d / "det.onnx")
    np.savez(d / "det.npz", **feeds("mixed_scale_detector", 32))
    assert main(["calibrate", str(d / "det.onnx"), "--data", str(d / "det.npz"),
                 "--out", str(d / "stats.npz")]) == 0
    return d


def test_detection_head_is_found_in_the_graph():
    model = load_proto(mixed_scale_detector(), "det")
    assert detect_layout(model, "detections") == DetectionLayout(axis=1)
    assert detect_layout(load_proto(conv_transpose_head(), "ct"), "mask") is None


def test_mixed_scale_detector_at_a8_w8_says_the_scores_are_lost(det, capsys):
    """SQNR/cosine look perfect; the detections do not survive, and the verdict says so."""
    code = main(["evaluate", str(det / "det.onnx"), "--data", str(det / "det.npz"),
                 "--stats", str(det / "stats.npz"), "--precision", "a8_w8",
                 "--json", str(det / "a8.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert "output 'detections' read as detections [4 box rows (cxcywh) + 3 class rows on " \
           "axis 1" in out
    result = json.loads((det / "a8.json").read_text())
    m = result["metrics"]
    assert m["cosine_mean"] > 0.999  # what the old verdict went by
    assert m["detections_fp32"] > 0 and m["detections_quantized"] == 0
    assert m["detection_recall"] == 0.0 and m["detection_f1"] == 0.0
    assert any("class scores lost: every score quantizes to 0" in n for n in result["notes"])
    assert any(n.startswith("NOT LIKE FP32") for n in result["notes"])


def test_mixed_scale_detector_at_16_bit_keeps_its_detections(det, capsys):
    main(["evaluate", str(det / "det.onnx"), "--data", str(det / "det.npz"),
          "--stats", str(det / "stats.npz"), "--precision", "a16_w8",
          "--json", str(det / "a16.json")])
    capsys.readouterr()
    m = json.loads((det / "a16.json").read_text())["metrics"]
    assert m["detection_f1"] > 0.9 and m["detection_recall"] > 0.9


def test_layout_tensor_turns_detection_off(det, capsys):
    main(["evaluate", str(det / "det.onnx"), "--data", str(det / "det.npz"),
          "--stats", str(det / "stats.npz"), "--precision", "a8_w8",
          "--layout", "detections=tensor", "--json", str(det / "t.json")])
    capsys.readouterr()
    m = json.loads((det / "t.json").read_text())["metrics"]
    assert "detection_f1" not in m and "sqnr_db" in m


def test_declared_threshold_reaches_the_task(det):
    model = stages.open_model(str(det / "det.onnx"))
    data = stages.open_data(str(det / "det.npz"), model,
                            layout=(parse_layout("detections=detect:threshold=0.9"),))
    assert isinstance(data.task, DetectionTask) and data.task.layout.threshold == 0.9
    stats = stages.read_stats(str(det / "stats.npz"))
    r = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.FLOAT))
    assert any("FP32 keeps no detection at score >= 0.9" in n for n in r["notes"])


def test_layout_scorer_ranks_by_the_task_metric(det):
    """The analysis scorer: rows reduced, outputs rebuilt, the task's headline primary."""
    model = stages.open_model(str(det / "det.onnx"))
    data = stages.open_data(str(det / "det.npz"), model)
    scorer = stages.scorer_for(data, model)  # the task's row scoring (tasks/headline.py)
    assert scorer.primary == "detection_f1" and scorer.row_local
    stats = stages.read_stats(str(det / "stats.npz"))
    from quantscope.emulate.evaluate import run_model

    batch = data.evaluation[0]
    ref = run_model(model.proto, [batch]).batches[0]
    q = stages.qdq_for_plan(model, stats, Plan.uniform(Precision.A8_W8))[0]
    test = run_model(q, [batch]).batches[0]
    r_rows, t_rows = scorer.reduce(ref, batch), scorer.reduce(test, batch)
    scores = scorer(r_rows, t_rows)
    assert scores["detection_f1"] == 0.0 and scores["cosine_mean"] > 0.999
    assert scorer(r_rows, r_rows)["detection_f1"] == 1.0


def test_probability_map_scored_by_mask_iou(tmp_path, capsys):
    onnx.save(conv_transpose_head(), tmp_path / "ct.onnx")
    np.savez(tmp_path / "ct.npz", **feeds("conv_transpose_head", 16))
    assert main(["calibrate", str(tmp_path / "ct.onnx"), "--data", str(tmp_path / "ct.npz"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["evaluate", str(tmp_path / "ct.onnx"), "--data", str(tmp_path / "ct.npz"),
                 "--stats", str(tmp_path / "s.npz"), "--precision", "a8_w8",
                 "--layout", "mask=map:threshold=0.5", "--json", str(tmp_path / "r.json")]) == 0
    assert "output 'mask' read as a probability map binarised at 0.5" in capsys.readouterr().out
    m = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert 0.9 < m["mask_iou"] <= 1.0 and m["mask_iou_min"] <= m["mask_iou"]
    assert 0.0 <= m["pixel_flip_share"] < 0.1


def test_scalar_output_declared_as_a_score(tmp_path, capsys):
    onnx.save(scalar_probability(), tmp_path / "sp.onnx")
    np.savez(tmp_path / "sp.npz", **feeds("scalar_probability", 32))
    main(["calibrate", str(tmp_path / "sp.onnx"), "--data", str(tmp_path / "sp.npz"),
          "--out", str(tmp_path / "s.npz")])
    assert main(["evaluate", str(tmp_path / "sp.onnx"), "--data", str(tmp_path / "sp.npz"),
                 "--stats", str(tmp_path / "s.npz"), "--precision", "a8_w8",
                 "--layout", "speech=score:threshold=0.5", "--json",
                 str(tmp_path / "r.json")]) == 0
    capsys.readouterr()
    m = json.loads((tmp_path / "r.json").read_text())["metrics"]
    assert 0.0 <= m["decision_agreement"] <= 1.0 and m["score_abs_error_max"] >= 0.0


# ---------------------------------------------------------------- bad --layout on the CLI


@pytest.mark.parametrize(("layout", "needle"), [
    ("boxes=detect", "'boxes' is no output of the model (outputs: detections)"),
    ("detections=segment", "unknown kind 'segment'"),
    ("detections=detect:scores=4-9", "has 7 rows on axis 1, the layout needs 10"),
    ("detections=detect:axis=3", "axis 3 is not a row axis"),
    ("detections=score", "not one value per sample"),
])
def test_bad_layout_on_the_command_line(det, capsys, layout, needle):
    assert_layout_refused(capsys, det, "det.onnx", "det.npz", layout, needle)



def test_run_refuses_a_bad_layout_before_making_its_folder(det, capsys):
    code = main(["run", str(det / "det.onnx"), "--data", str(det / "det.npz"), "--target",
                 "hailo8", "--out", str(det / "runbad"), "--layout", "scores=map"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "quantscope: error: --layout 'scores=map': 'scores' is no output of the model "
        "(outputs: detections)"]
    assert not (det / "runbad").exists()


def test_run_scores_the_detector_as_detections_on_held_out_rows(det, capsys):
    code = main(["run", str(det / "det.onnx"), "--data", str(det / "det.npz"), "--target",
                 "hailo8", "--repairs", "none", "--out", str(det / "run")])
    captured = capsys.readouterr()
    assert code == 0
    assert "note: output 'detections' read as detections [4 box rows" in captured.err
    ev = json.loads((det / "run" / "evaluate.json").read_text())
    text = json.dumps(ev)
    assert "split: the first 16 samples" in text  # the task reads rows alone: still held out
    assert '"detection_f1": 0.0' in text  # uniform a8_w8, as measured on the held-out rows


def test_several_output_tasks_report_each_and_the_worst():
    from quantscope.tasks.layout import OutputTasks

    ref_map = np.zeros((2, 1, 4, 4))
    ref_map[:, :, :2] = 0.9
    test_map = ref_map.copy()
    test_map[1, 0, 0, :] = 0.1
    maps = (MapTask(name="a", output="a"), MapTask(name="b", output="b"))
    both = OutputTasks(name="o", tasks=maps, headline="mask_iou")
    ref = Outputs(names=("a", "b"), batches=((ref_map, ref_map),))
    test = Outputs(names=("a", "b"), batches=((ref_map, test_map),))
    v = both.metrics(ref, test).values
    assert v["mask_iou:a"] == 1.0 and v["mask_iou:b"] == pytest.approx(0.75)
    assert v["mask_iou"] == pytest.approx(0.75)  # the worst output's
    assert v["pixel_flip_share"] == pytest.approx(v["pixel_flip_share:b"])  # the largest


def test_a_layout_larger_than_the_output_is_a_user_error_at_scoring():
    """Shapes unknown to the graph: the rows are checked on the arrays themselves."""
    from quantscope.types import QuantscopeError

    task = DetectionTask(name="d", output="det", layout=DetectionLayout(scores=(4, 12)))
    arr = _det_array(np.full((3, 2), 0.5))  # 7 rows
    with pytest.raises(QuantscopeError, match="has 7 rows on axis 1, the layout needs 12"):
        task.metrics(_outputs("det", arr), _outputs("det", arr))
