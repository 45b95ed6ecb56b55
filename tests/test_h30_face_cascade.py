"""A cascade face detector (MTCNN's P-Net) and a packaged YOLOv8 brought by a new user.

P-Net is fully convolutional on any image size: a 2-class Softmax face map ``prob [N, 2,
h, w]`` beside a box-regression map ``boxes [N, 4, h, w]``. On a whole photo the faces are
about 0.5 % of the map's positions, so the per-position top-1 agreement stays above 99 %
even when the quantized model loses every face; and the box map, scored for fidelity only,
was not said anywhere in the verdict.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from tiny_models import _with_weights

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.serde import read_json
from quantscope.tasks.layout import LayoutError, layout_tasks, parse_layout
from quantscope.types import Dataset, Plan, Precision


def face_map() -> onnx.ModelProto:
    """``x [N, 1, H, W]`` -> 1x1 Conv -> ``prob = Softmax(axis 1) [N, 2, H, W]`` (class 1
    where x > 0.5) and ``boxes [N, 4, H, W]`` (a 1x1 Conv of x and a PRelu): P-Net's
    heads in three nodes."""
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    pnet (float[N, 1, H, W] x) => (float[N, 4, H, W] boxes, float[N, 2, H, W] prob) {
        a = PRelu(x, slope)
        logits = Conv(x, w_cls, b_cls)
        prob = Softmax<axis = 1>(logits)
        boxes = Conv(a, w_box, b_box)
    }
    """
    return _with_weights(text, {
        "slope": np.full((1, 1, 1), 0.25, np.float32),
        "w_cls": np.array([0.0, 1.0], np.float32).reshape(2, 1, 1, 1),
        "b_cls": np.array([0.0, -0.5], np.float32),
        "w_box": np.array([0.01, -0.02, 0.015, 0.005], np.float32).reshape(4, 1, 1, 1),
        "b_box": np.zeros(4, np.float32),
    })


def face_map_data(n: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Background far below the threshold (-60 .. 0) and 1 % of the positions faces just
    above it (0.52 .. 0.58): one 8-bit grid over the whole range has a step of ~0.24, so
    every face rounds to the background's side."""
    r = np.random.default_rng(seed)
    x = r.uniform(-60.0, 0.0, (n, 1, 10, 10)).astype(np.float32)
    face = r.random(x.shape) < 0.01
    face[:, 0, 5, 5] = True
    x[face] = r.uniform(0.52, 0.58, int(face.sum()))
    return {"x": x}


def _evaluate(precision: Precision):
    model = load_proto(face_map(), "pnet")
    f = face_map_data()
    b = tuple({"x": f["x"][i:i + 8]} for i in range(0, 16, 8))
    task, notes = layout_tasks(model, (), "x.npz")
    data = Dataset(name="x.npz", calibration=b, evaluation=b, task=task, notes=notes)
    stats = stages.calibrate_model(model, data)
    return stages.evaluate_plan(model, data, stats, Plan.uniform(precision)), notes


def test_a_face_map_that_loses_every_face_is_not_like_fp32():
    res, _ = _evaluate(Precision.A8_W8)
    m, notes = res["metrics"], res["notes"]
    assert m["top1_agreement"] > 0.95  # the positions are nearly all background
    assert m["class_iou_min"] == 0.0
    lost = [n for n in notes if n.startswith("NOT LIKE FP32: output 'prob': class 1")]
    assert lost and "the quantized model on 0, both on 0 (IoU 0.000 < 0.9)" in lost[0], notes
    # at 16-bit activations the faces stay faces
    res16, _ = _evaluate(Precision.A16_W8)
    assert res16["metrics"]["class_iou_min"] == 1.0
    assert not any(n.startswith("NOT LIKE FP32") for n in res16["notes"])


def test_the_box_map_no_task_reads_is_said_with_its_figures(tmp_path, capsys):
    """``boxes`` beside the Softmax face map: scored for fidelity only, which the notes
    say and ``run``'s verdict repeats with its held-out SQNR; 36 samples (batches of 32)
    are split in halves, not 32 and 4."""
    model = load_proto(face_map(), "pnet")
    _, notes = layout_tasks(model, (), "x.npz")
    assert notes[1] == (
        "output 'boxes' [B,4,H,W] scored for fidelity only (cosine, SQNR, per channel, in "
        "'outputs'): the task's figures and the headline are 'prob''s; declare --layout "
        "boxes=KIND (detect, map, score, class, points, ctc, image, depth, verify, pitch, "
        "embedding) where a kind fits what it is for")
    onnx.save(face_map(), tmp_path / "pnet.onnx")
    np.savez(tmp_path / "x.npz", **face_map_data(36, seed=1))
    assert main(["run", str(tmp_path / "pnet.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--goal", "0.95", "--repairs", "none", "--rewrites",
                 "none", "--finetune", "off", "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    v = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert "the first 18 samples" in v["evaluation"] and "the other 18" in v["evaluation"]
    assert v["unscored"] == [notes[1]]
    (line,) = v["unscored_figures"]
    assert line.startswith("output 'boxes' (fidelity only) held out: SQNR ") and (
        "at uniform a8_w8" in line)
    assert f"  warning: {line}" in out.splitlines()
    # the goal is met on the positions, nearly all background; the faces lost are said
    assert v["reached"] is True
    assert "class 1: FP32 gives it on" in v["not_like_fp32"]["plan"]


def static_yolo_head() -> onnx.ModelProto:
    """``images [N, 3, 224, 224]`` -> boxes ``[N, 4, A]`` and Sigmoid scores ``[N, 2, A]``
    concatenated on axis 1: a YOLOv8 head at a static 224 input."""
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    yolo (float[N, 3, 224, 224] images) => (float[N, 6, 50176] output0) {
        b = Conv(images, w_box)
        c = Conv(images, w_cls)
        s = Sigmoid(c)
        bf = Reshape(b, shape4)
        sf = Reshape(s, shape2)
        output0 = Concat<axis = 1>(bf, sf)
    }
    """
    r = np.random.default_rng(3)
    return _with_weights(text, {
        "w_box": r.normal(0, 1, (4, 3, 1, 1)).astype(np.float32),
        "w_cls": r.normal(0, 1, (2, 3, 1, 1)).astype(np.float32),
        "shape4": np.array([0, 4, -1], np.int64),
        "shape2": np.array([0, 2, -1], np.int64),
    })


def test_photos_on_a_detector_is_refused_naming_tensor_data(tmp_path, capsys):
    """``--data photos`` scores retrieval on the first output: a static-224 YOLO head's
    first row (its box centres) was read as the embedding; a dynamic P-Net was told to use
    dinov2-s14."""
    onnx.save(static_yolo_head(), tmp_path / "yolo.onnx")
    onnx.save(face_map(), tmp_path / "pnet.onnx")
    for name, says in (("yolo", "but 'output0' is a detection head (4 box rows, then class "
                                "rows): make tensor data of your images with 'quantscope images "),
                       ("pnet", "it scores an image embedder's retrieval (one [B, 3, 224, 224] "
                                "input, e.g. dinov2-s14); for another image model (a detector, "
                                "landmarks, a face or segmentation map) make tensor data of "
                                "your images with 'quantscope images ")):
        assert main(["run", str(tmp_path / f"{name}.onnx"), "--data", "photos", "--target",
                     "hailo8", "--out", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / name).exists()


def _evaluate_layout(layout: str):
    model = load_proto(face_map(), "pnet")
    f = face_map_data()
    b = tuple({"x": f["x"][i:i + 8]} for i in range(0, 16, 8))
    task, notes = layout_tasks(model, (parse_layout(layout),), "x.npz")
    data = Dataset(name="x.npz", calibration=b, evaluation=b, task=task, notes=notes)
    stats = stages.calibrate_model(model, data)
    return stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8)), notes


def test_a_softmax_face_map_declared_as_a_map_is_read_on_its_face_channel():
    """``--layout prob=map`` binarised both channels of the 2-class Softmax: the
    background channel's mask agreed everywhere and the IoU read 0.99 with every face lost;
    it now says so, and ``channel=1`` binarises the face channel alone."""
    res, notes = _evaluate_layout("prob=map:threshold=0.5")
    assert res["metrics"]["mask_iou"] > 0.9
    assert ("output 'prob' is a Softmax over its axis 1: its mask counts every channel, the "
            "background's too, so the mask IoU mostly says the background agrees; --layout "
            "prob=map:channel=K binarises channel K alone") in notes
    res, notes = _evaluate_layout("prob=map:threshold=0.5,channel=1")
    assert notes[0] == ("output 'prob' read as a probability map binarised at 0.5 (channel 1 "
                        "of axis 1) (--layout)")
    assert res["metrics"]["mask_iou"] == 0.0  # every sample has a face, every face lost
    assert "NOT LIKE FP32: output 'prob' mask IoU 0.000 < 0.9 at threshold 0.5" in res["notes"]
    model = load_proto(face_map(), "pnet")
    for bad, says in (("prob=map:channel=2", "channel 2 is no channel of its axis 1"),
                      ("prob=map:channel=x", "channel 'x' is not a whole number >= 0")):
        with pytest.raises(LayoutError, match=says):
            layout_tasks(model, (parse_layout(bad),), "x.npz")


def small_detector() -> onnx.ModelProto:
    """``images [N, 3, 8, 8]`` -> boxes (0-100 px) ``[N, 4, 64]`` and two Sigmoid class rows
    ``[N, 2, 64]``, concatenated: class 0 follows the image, class 1 stays near 5e-5 (a
    class the data never shows, as nudenet's on the sample photos)."""
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    det (float[N, 3, 8, 8] images) => (float[N, 6, 64] output0) {
        b = Conv(images, w_box, b_box)
        c = Conv(images, w_cls, b_cls)
        s = Sigmoid(c)
        bf = Reshape(b, shape4)
        sf = Reshape(s, shape2)
        output0 = Concat<axis = 1>(bf, sf)
    }
    """
    return _with_weights(text, {
        "w_box": np.full((4, 3, 1, 1), 10.0, np.float32),
        "b_box": np.array([20.0, 20.0, 30.0, 30.0], np.float32),
        "w_cls": np.array([[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]], np.float32).reshape(2, 3, 1, 1),
        "b_cls": np.array([-2.0, -10.0], np.float32),
        "shape4": np.array([0, 4, -1], np.int64),
        "shape2": np.array([0, 2, -1], np.int64),
    })


def test_a_class_the_data_never_shows_is_said_beside_the_collapse():
    """nudenet's 14 classes absent from the photos stay below 2e-4 and round to 0 even on a
    16-bit grid spanning the boxes: the per-channel check says NOT LIKE FP32 with every
    detection kept; the detection task now says those classes were never scored at the
    threshold, so their rows' figures say little (and run's verdict repeats it)."""
    model = load_proto(small_detector(), "det")
    x = np.random.default_rng(4).random((16, 3, 8, 8), np.float32)
    b = tuple({"images": x[i:i + 8]} for i in range(0, 16, 8))
    task, notes = layout_tasks(model, (), "x.npz")
    data = Dataset(name="x.npz", calibration=b, evaluation=b, task=task, notes=notes)
    stats = stages.calibrate_model(model, data)
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A16_W8))
    assert res["metrics"]["detections_fp32"] > 0
    said = [n for n in res["notes"] if "FP32 never scores" in n]
    assert said == ["output 'output0': FP32 never scores 1 of its 2 classes at 0.25 on this "
                    "data (classes 1; the highest of their scores 4.5e-05): their detections "
                    "are not measured, and the per-channel check of their rows says little; "
                    "give data where they occur"], res["notes"]


def test_a_compiled_size_other_than_the_data_s_is_said(tmp_path, capsys):
    """P-Net checked and compiled at 720 x 1280 (--input-shape) but calibrated and measured
    on 224 px photos: the host step said only the compiled shape."""
    onnx.save(face_map(), tmp_path / "pnet.onnx")
    np.savez(tmp_path / "x.npz", **face_map_data(16))
    common = ["--target", "hailo8", "--repairs", "none", "--rewrites", "none", "--finetune",
              "off"]
    for shape, says in (("x=1x1x32x48", True), ("x=1x1x10x10", False)):
        out = tmp_path / shape.replace("=", "_")
        assert main(["run", str(tmp_path / "pnet.onnx"), "--data", str(tmp_path / "x.npz"),
                     "--input-shape", shape, *common, "--out", str(out)]) == 0
        host = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  host:")]
        assert host[0].startswith(f"  host: fix the symbolic dims (H, N, W) for the compiler: "
                                  f"{shape} (x as --input-shape, the shape checked)")
        assert host[0].endswith("; calibrated and measured on the data's x=1x1x10x10 (not the "
                                "compiled size): give data of the size you compile for") is says
