"""Vision models beyond classifiers and YOLOv8 heads (issue: models beyond the zoo):
a segmentation's per-pixel Softmax, a YOLOv5-style head with an objectness row, and a
model whose image size is symbolic, fed fixed-size tensors."""

from __future__ import annotations

import dataclasses

import numpy as np
from beyond_models import segmenter, yolov5_head

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.tasks.layout import LayoutError, layout_tasks, parse_layout
from quantscope.types import Dataset, Outputs, Plan, Precision


def _data(model, n=16, batch=8, shape=(3, 16, 16), seed=0):
    x = np.random.default_rng(seed).normal(0, 1, (n, *shape)).astype(np.float32)
    b = tuple({"x": x[i:i + batch]} for i in range(0, n, batch))
    data = Dataset(name="seg", calibration=b, evaluation=b)
    return data, stages.calibrate_model(model, data)


def test_a_per_pixel_softmax_is_read_as_class_scores_per_position():
    model = load_proto(segmenter(), "seg")
    task, notes = layout_tasks(model, (), "x.npz")
    assert task is not None and task.headline == "top1_agreement"
    assert notes == ("output 'probs' read as class scores (top-1 over 4 classes on axis 1) "
                     "(a Softmax over the classes); --layout probs=tensor for plain fidelity",)
    data, stats = _data(model)
    res = stages.evaluate_plan(model, dataclasses.replace(data, task=task), stats,
                               Plan.uniform(Precision.A8_W8))
    # judged per position (16 samples x 16 x 16 pixels: 4,096), and said so
    assert 0.9 < res["metrics"]["top1_agreement"] < 1.0
    ties = round(res["metrics"]["top1_ties"] * 4096)
    assert ties and any(f"on {ties} of 4096 positions the quantized top score is shared" in n
                        for n in res["notes"])
    # the logits have no Softmax to find: plain fidelity unless declared
    assert layout_tasks(load_proto(segmenter(softmax=False), "seg"), (), "x.npz") == (None, ())


def _v5_rows(obj):
    """Two anchors [cx, cy, w, h, obj, c0, c1] of one sample, rows on axis 2: a box whose
    class score is high but whose objectness is ``obj``, and a confident one far away."""
    a = np.array([[[100, 100, 40, 40, obj, 0.9, 0.1],
                   [400, 400, 40, 40, 0.9, 0.1, 0.8]]], np.float32)
    return Outputs(names=("output",), batches=((a,),))


def test_a_yolov5_objectness_row_multiplies_the_class_scores():
    model = load_proto(yolov5_head(), "v5")
    v5, notes = layout_tasks(model, (parse_layout("output=detect:axis=2,obj=4"),), "x.npz")
    assert notes == ("output 'output' read as 4 box rows (cxcywh) + 3 class rows x objectness "
                     "row 4 on axis 2, threshold 0.25, NMS/match IoU 0.5 (--layout)",)
    assert v5.layout.objectness == 4 and v5.layout.scores == (5, None)
    # what YOLOv5 thresholds on is objectness x class: 0.2 x 0.9 = 0.18 < 0.25 is no
    # detection; without obj= the class score alone (0.9) would keep it
    m = v5.metrics(_v5_rows(0.2), _v5_rows(0.2))
    assert m.values["detections_fp32"] == 1.0 and m.values["detection_f1"] == 1.0
    # the quantized objectness alone moves a detection across the threshold
    moved = v5.metrics(_v5_rows(0.2), _v5_rows(0.3))
    assert moved.values["detections_quantized"] == 2.0
    assert moved.values["detection_precision"] == 0.5
    assert abs(moved.values["class_score_max_abs_error"] - 0.09) < 1e-6
    plain, _ = layout_tasks(model, (parse_layout("output=detect:axis=2,scores=5-"),), "x.npz")
    assert plain.metrics(_v5_rows(0.2), _v5_rows(0.2)).values["detections_fp32"] == 2.0
    # an objectness row that is a score row, or past the output's 8 rows, is one line
    for bad, said in (("obj=4,scores=4-", "the objectness row 4 is a box or score row"),
                      ("obj=8", "has 8 rows on axis 2, the layout needs 9")):
        try:
            layout_tasks(model, (parse_layout(f"output=detect:axis=2,{bad}"),), "x.npz")
        except LayoutError as e:
            assert said in str(e)
        else:
            raise AssertionError(bad)
    try:
        parse_layout("output=detect:obj=4-5")
    except LayoutError as e:
        assert "obj '4-5' must be one row" in str(e)
    else:
        raise AssertionError("two objectness rows")


def test_data_of_several_sizes_is_one_line_before_any_work(tmp_path, capsys):
    """A folder of 16 x 16 and 24 x 24 images for a model with symbolic H, W: calibrate
    and evaluate take it batch by batch, but the analysis compares rows across batches and
    stopped with an internal error (numpy concatenate), leaving a half-made run folder."""
    import onnx

    from quantscope.cli import main

    onnx.save(segmenter(dynamic=True), tmp_path / "seg.onnx")
    r = np.random.default_rng(0)
    (tmp_path / "d").mkdir()
    for i, side in enumerate((16, 24, 16, 24)):
        np.savez(tmp_path / "d" / f"{i}.npz", x=r.normal(0, 1, (4, 3, side, side)).astype(np.float32))
    said = ("gives input 'x' in several sizes (1x3x16x16, 1x3x24x24), and {} compares the "
            "samples' outputs row by row: give data of one size (the size you compile for)")
    assert main(["run", str(tmp_path / "seg.onnx"), "--data", str(tmp_path / "d"),
                 "--target", "hailo8", "--out", str(tmp_path / "W")]) == 2
    assert said.format("run") in capsys.readouterr().err
    assert not (tmp_path / "W").exists()
    assert main(["calibrate", str(tmp_path / "seg.onnx"), "--data", str(tmp_path / "d"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["analyze", str(tmp_path / "seg.onnx"), "--data", str(tmp_path / "d"),
                 "--stats", str(tmp_path / "s.npz"), "--out", str(tmp_path / "a.json")]) == 2
    err = capsys.readouterr().err
    assert said.format("analyze") in err and "internal error" not in err
    assert not (tmp_path / "a.json").exists()


def test_a_batch_only_model_whose_shapes_need_a_batch_gets_the_data_size():
    """A torch ``flatten`` exports as Shape -> Slice -> Concat -> Reshape: with a symbolic
    batch ONNX cannot fold it, every tensor after it has unknown sizes, and the size rules
    blocked the planner ('size unknown') on a model whose only open dim is the batch (a
    YOLOv5 head missed its goal at uniform a8_w8). The data's size (batch 1) folds it."""
    from tiny_models import _with_weights

    from quantscope.tasks.sizes import at_data_shapes

    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    flat (float[N, 3, 8, 8] x) => (float[N, 64, 4] y) {
        c = Conv (x, w, b)
        s = Shape (c)
        nc = Slice (s, zero, two)
        shape = Concat <axis = 0> (nc, minus1)
        f = Reshape (c, shape)
        y = Transpose <perm = [0, 2, 1]> (f)
    }
    """
    proto = _with_weights(text, {
        "w": np.full((4, 3, 1, 1), 0.1, np.float32), "b": np.zeros(4, np.float32),
        "zero": np.array([0], np.int64), "two": np.array([2], np.int64),
        "minus1": np.array([-1], np.int64)})
    model = load_proto(proto, "flat")
    data, _ = _data(model, shape=(3, 8, 8))
    shapes, line = at_data_shapes(model, data)
    assert shapes == (("x", (1, 3, 8, 8)),)
    assert line.startswith("input-shape: x=1x3x8x8, the size of every sample in the data")
    # a graph whose shapes are known takes nothing: its batch is the host's to fix
    static = load_proto(segmenter(), "seg")
    assert at_data_shapes(static, _data(static)[0]) == ((), None)
