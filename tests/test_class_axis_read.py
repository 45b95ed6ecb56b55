"""The per-channel fidelity of an output reads the axis its task decides on. EasyOCR's
recognizer gives CTC logits ``[N, T, 97]`` from a MatMul + bias ``Add(bias, mm)``: the
graph's axis was lost at the bias, and the per-channel figures read axis 1, the time
steps, as channels (a "worst channel" that was a step, "collapsed classes" that were
steps) though the output was declared ``ctc``, whose classes lie on the last axis (a
detection layout's rows alike). The task tells the axis now (``class_axes``), the
per-channel figures are over its classes, the entry says which axis was read and why
(``channel_axis_read``), and the bias keeps the MatMul's axis. Real ORT sessions, the
CLI through ``main``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.cli import main
from quantscope.emulate.channels import ChannelFidelity
from quantscope.emulate.class_axes import ClassAxis, channel_axis_read
from quantscope.model.axes import channel_axes
from quantscope.model.load import load_proto
from quantscope.tasks.classes import ClassTask
from quantscope.tasks.ctc import CtcTask
from quantscope.tasks.pitch import PitchTask

T, C, N = 12, 20, 40  # steps, classes, samples
BLANK, K, F = 0, 3, 9  # K: a small class that ties F at 0 on the grid and wins there


def _model(head: str = "linear") -> onnx.ModelProto:
    """``linear``: MatMul then ``Add(bias, mm)``, the bias first as torch exports a Linear
    on ``[N, T, H]`` (EasyOCR's ``Prediction``); ``scaled``: ``Mul(x, 1)``, whose graph
    tells no channel axis (a graph input has none)."""
    dims = ["N", T, C]
    if head == "linear":
        nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
                 helper.make_node("Add", ["b", "mm"], ["logits"])]
        inits = [numpy_helper.from_array(np.eye(C, dtype=np.float32), "w"),
                 numpy_helper.from_array(np.zeros(C, np.float32), "b")]
    else:
        nodes = [helper.make_node("Mul", ["x", "s"], ["logits"])]
        inits = [numpy_helper.from_array(np.ones(1, np.float32), "s")]
    graph = helper.make_graph(
        nodes, "ctc_logits", [helper.make_tensor_value_info("x", 1, dims)],
        [helper.make_tensor_value_info("logits", 1, dims)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _logits() -> np.ndarray:
    """Blank or a label wins each step by far (logits of -40..40: an 8-bit step of ~0.3);
    class ``K`` stays within 0.05 of 0 (every value of it quantizes to 0), and on the
    last step of the last 4 samples every class is far down but ``F`` (0.1) and ``K``
    (0.05): FP32 reads ``F``, on the grid both are 0 and the argmax takes ``K``."""
    r = np.random.default_rng(3)
    x = r.uniform(-40.0, 10.0, (N, T, C)).astype(np.float32)
    tops = r.integers(1, C, (N, T))
    tops[:, ::2] = BLANK
    tops[tops == K] = BLANK
    np.put_along_axis(x, tops[..., None], 40.0, axis=-1)
    x[..., K] = r.uniform(-0.05, 0.05, (N, T))
    x[-4:, -1, :] = -30.0
    x[-4:, -1, F], x[-4:, -1, K] = 0.1, 0.05
    return x


def _evaluate(tmp_path, capsys, *layout: str, head: str = "linear") -> tuple[dict, str]:
    onnx.save(_model(head), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=_logits())
    args = [str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz")]
    assert main(["calibrate", *args, "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "stats.npz"),
                 "--precision", "a8_w8", "--json", str(tmp_path / "ev.json"), *layout]) == 0
    return json.loads((tmp_path / "ev.json").read_text()), capsys.readouterr().out


def test_declared_ctc_logits_read_their_classes_not_their_steps(tmp_path, capsys):
    """EasyOCR's head. Before: ``channel_axis`` 1, 12 "channels" (the steps), none
    collapsed, the string that changes on 4 samples the only sign. Now: axis 2, its 20
    classes, and class K, erased to 0 and winning the steps FP32 gives to F, collapsed."""
    doc, out = _evaluate(tmp_path, capsys, "--layout", "logits=ctc")
    entry = doc["outputs"]["logits"]
    assert entry["channel_axis"] == 2
    assert entry["channel_axis_read"] == (f"axis 2, {C} channels: the classes of the "
                                          "declared ctc layout")
    assert doc["metrics"]["string_agreement"] == (N - 4) / N
    assert entry["collapsed_channels"] == 1 and entry["channel_worst"] == K
    (line,) = [n for n in doc["notes"] if "channels collapse" in n]
    assert line.startswith(f"output 'logits' channel {K} of axis 2: every value quantizes to 0")
    assert line.endswith(f"1 of {C} channels collapse")
    assert "NOT LIKE FP32" in out


def test_a_bias_added_first_keeps_the_matmul_features_as_channels(tmp_path, capsys):
    """Undeclared, EasyOCR's head reads the MatMul's features, as the graph tells once
    ``Add(bias, mm)`` takes its axis from either input (before: from the bias alone,
    which has none: axis 1 by default, the steps)."""
    doc, _ = _evaluate(tmp_path, capsys)
    entry = doc["outputs"]["logits"]
    assert entry["channel_axis"] == 2
    assert entry["channel_axis_read"] == (f"axis 2, {C} channels: the graph's channel axis "
                                          "of this output")
    assert channel_axes(load_proto(_model(), "m"))["logits"] == 2


def test_the_task_axis_is_read_where_the_graph_tells_none(tmp_path, capsys):
    """``Mul(x, 1)``: the graph tells no axis; undeclared, axis 1 is read by default (as
    before, and said); declared ``ctc``, the classes."""
    doc, _ = _evaluate(tmp_path, capsys, head="scaled")
    entry = doc["outputs"]["logits"]
    assert entry["channel_axis"] == 1
    assert entry["channel_axis_read"] == (f"axis 1, {T} channels: by default (the graph "
                                          "tells no channel axis of this output)")
    doc, _ = _evaluate(tmp_path, capsys, "--layout", "logits=ctc", head="scaled")
    entry = doc["outputs"]["logits"]
    assert entry["channel_axis"] == 2 and entry["collapsed_channels"] == 1
    assert entry["channel_axis_read"].startswith(f"axis 2, {C} channels: the classes")


def test_the_claimed_axis_is_moved_to_the_sample_first_arrays():
    """A ctc output batched on axis 1 (``[T, N, C]`` as declared, ``--batch-axis 1``): its
    class axis -1 is the last of the sample-first arrays too; a claim that lands on the
    samples or off the array is not taken (the graph's or default axis is read)."""
    shape = (N, T, C)
    ctc = CtcTask(name="ctc", output="o", sample_axis=1).class_axes()["o"]
    assert channel_axis_read(shape, None, ctc)[0] == 2
    assert channel_axis_read(shape, None, ClassAxis(1, 1, "x"))[0] == 1  # axis 1 is N's
    assert channel_axis_read(shape, 2, ClassAxis(5, 0, "x")) == (
        2, f"axis 2, {C} channels: the graph's channel axis of this output")
    f = ChannelFidelity(2)
    f.add(_logits(), np.where(np.abs(_logits()) < 0.16, 0.0, _logits()))
    assert f.n == C


def test_a_detection_layout_reads_its_rows_not_its_anchors(tmp_path, capsys):
    """``[N, 50, 6]`` (anchors, then 4 box rows in pixels and 2 class scores) that the graph
    tells no axis of, declared ``detect:axis=2``: before, axis 1 was read, 50 "channels"
    that are anchors, each holding boxes of 0..640 px beside its scores, none collapsed;
    now the 6 rows, and the class rows, under one grid step of the box's range, collapse."""
    dims = ["N", 50, 6]
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["out"])], "boxes",
        [helper.make_tensor_value_info("x", 1, dims)],
        [helper.make_tensor_value_info("out", 1, dims)],
        [numpy_helper.from_array(np.ones(1, np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, tmp_path / "m.onnx")
    r = np.random.default_rng(4)
    x = np.empty((16, 50, 6), np.float32)
    x[..., :2] = r.uniform(20, 620, (16, 50, 2))
    x[..., 2:4] = r.uniform(10, 60, (16, 50, 2))
    x[..., 4:] = r.uniform(0.0, 0.9, (16, 50, 2))
    np.savez(tmp_path / "d.npz", x=x)
    args = [str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz")]
    assert main(["calibrate", *args, "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "stats.npz"), "--precision",
                 "a8_w8", "--json", str(tmp_path / "ev.json"),
                 "--layout", "out=detect:axis=2"]) == 0
    entry = json.loads((tmp_path / "ev.json").read_text())["outputs"]["out"]
    assert entry["channel_axis"] == 2
    assert entry["channel_axis_read"] == ("axis 2, 6 channels: the rows (box values, scores) "
                                          "of its detection layout")
    assert entry["collapsed_channels"] >= 1 and entry["channel_worst"] in (4, 5)
    assert "NOT LIKE FP32" in capsys.readouterr().out


def test_class_and_pitch_tasks_tell_their_axis():
    """A class map ``[N, H, W, C]`` declared ``class:axis=-1`` reads its C classes, not
    its H rows; a pitch output ``[N, F, 360]`` its bins, not its frames."""
    seg = ClassTask(name="c", output="o", axis=3, axis_read="as given").class_axes()["o"]
    assert channel_axis_read((2, 8, 8, 5), None, seg) == (
        3, "axis 3, 5 channels: the classes of its class task (as given)")
    pitch = PitchTask(name="p", output="o").class_axes()["o"]
    assert channel_axis_read((2, 7, 360), 1, pitch) == (
        2, "axis 2, 360 channels: the bins of the declared pitch layout")
