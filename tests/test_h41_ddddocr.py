"""ddddocr's captcha recognizer (h41): ``input1 [1, 1, 64, image_width]`` (a batch fixed at
1, a symbolic width) and an output the file declares ``[1, seqlen]`` while the graph
computes ``[T, 1, 8210]`` (time first, the sample on axis 1). The width had been taken for
the sample axis (data refused with "pad or crop the data to the model's size"); the
misdeclared output was read along its declared axes (an internal IndexError in the
analysis, or a task on the wrong axes)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.tasks.pixels import Pixels


def _recognizer(out_shape: list) -> onnx.ModelProto:
    """x [1, 1, 4, image_width] -> Conv 1x4 -> [1, 5, 1, W] -> Squeeze -> Transpose time
    first -> Reshape (to its own shape, as ddddocr's exporter wrote it) -> y [W, 1, 5]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (5, 1, 4, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Squeeze", ["c", "ax2"], ["s"], name="squeeze"),
             helper.make_node("Transpose", ["s"], ["t"], perm=[2, 0, 1], name="time_first"),
             helper.make_node("Shape", ["t"], ["shape"], name="shape"),
             helper.make_node("Reshape", ["t", "shape"], ["y"], name="reshape")]
    g = helper.make_graph(
        nodes, "captcha",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, "image_width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [w, numpy_helper.from_array(np.array([2], np.int64), "ax2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _data(path) -> None:
    np.save(path, np.random.default_rng(1).uniform(0, 1, (6, 1, 4, 10)).astype(np.float32))


def test_a_batch_fixed_at_1_beside_a_symbolic_width(tmp_path, capsys) -> None:
    """The samples are on the static axis of size 1 the data differs on, not the width."""
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(_recognizer(["seqlen", 1, 5]), m)
    _data(x)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0, \
        capsys.readouterr().err
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", "y=ctc", "--json", str(j)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "1 sample(s) per run" in out and "output 'y' is batched on axis 1" in out
    metrics = json.loads(j.read_text())["metrics"]
    assert metrics["string_agreement_items"] == 6  # one string per image, not per step


def test_an_output_declared_of_another_rank_is_refused(tmp_path, capsys) -> None:
    m, x, s = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz"))
    onnx.save(_recognizer([1, "seqlen"]), m)
    _data(x)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 2
    err = [e for e in capsys.readouterr().err.splitlines() if "error" in e]
    assert len(err) == 1 and "output 'y' is declared [1, seqlen] in the model file, but " \
        "ONNX Runtime returns [10, 1, 5]" in err[0] and "declare the shape" in err[0]
    assert not s.exists()
    w = tmp_path / "W"
    for layout in ([], ["--layout", "y=ctc"]):  # refused before any work, each in one line
        assert main(["run", str(m), "--data", str(x), "--target", "hailo8l", "--out", str(w),
                     *layout]) == 2
        err = [e for e in capsys.readouterr().err.splitlines() if "error" in e]
        assert len(err) == 1 and "declare" in err[0] and "the model file" in err[0]
        assert not w.exists()


def test_a_grey_input_is_described_as_grey() -> None:
    said = Pixels(scale=255).describe(64, 160, 1)
    assert said.startswith("grey") and "RGB," not in said
    assert Pixels(scale=255).describe(64, 160).startswith("RGB")


def _yolox_raw(a: int = 21) -> np.ndarray:
    """A YOLOX head's raw rows ``[1, A, 6]`` for a 32 px input, strides 8/16/32 (16 + 4 + 1
    anchors): x, y offsets in cells, log w, log h, objectness, one class score. Two
    characters: anchor 0 (cell 0, 0 of stride 8) and anchor 15 (cell 3, 3), both 16 px wide."""
    out = np.zeros((1, a, 6))
    out[0, :, 4:] = 0.01
    out[0, [0, 15], :] = [0.5, 0.5, np.log(2), np.log(2), 0.9, 0.9]
    return out


def test_a_yolox_grid_head_is_decoded() -> None:
    """ddddocr's common_det.onnx writes YOLOX's undecoded rows (offsets in grid cells, log
    sizes). Read as boxes they all sit near (0, 0), so NMS kept one of two characters;
    ``grid=8/16/32`` decodes them as ddddocr's host does."""
    from quantscope.tasks.detection import DetectionLayout, DetectionTask, split_rows
    from quantscope.types import Outputs

    raw = _yolox_raw()
    grid = DetectionLayout(axis=2, objectness=4, scores=(5, None), grid=(8, 16, 32))
    boxes, _ = split_rows(raw, grid)
    assert np.allclose(boxes[0, 0], [-4, -4, 12, 12])  # (0.5 + 0) * 8 -/+ 2 * 8 / 2
    assert np.allclose(boxes[0, 15], [20, 20, 36, 36])  # (0.5 + 3) * 8
    assert boxes[0, 16].tolist() == [-8.0, -8.0, 8.0, 8.0]  # stride 16, offsets 0: 16 px
    outs = Outputs(names=("output",), batches=((raw.astype(np.float32),),))
    task = DetectionTask(name="d", output="output", layout=grid)
    assert task.metrics(outs, outs).values["detections_fp32"] == 2
    raw_read = DetectionTask(name="d", output="output", layout=DetectionLayout(
        axis=2, objectness=4, scores=(5, None)))
    assert raw_read.metrics(outs, outs).values["detections_fp32"] == 1


def test_grid_refusals_name_the_fix() -> None:
    import pytest

    from quantscope.tasks.grid_head import grid_cells, grid_option
    from quantscope.types import QuantscopeError

    assert grid_option("8/16/32", None, 3549) == (8, 16, 32)  # a 416 px input
    assert grid_cells((8, 16, 32), 3549)[-1].tolist() == [12.0, 12.0, 32.0]
    for text, fmt, anchors, said in (("8/x", None, None, "whole numbers"),
                                     ("8/16/32", "xyxy", None, "drop format="),
                                     ("8/16/32", None, 3550, "no square input's grid")):
        with pytest.raises(QuantscopeError, match=said):
            grid_option(text, fmt, anchors)


def test_grid_in_a_layout(tmp_path, capsys) -> None:
    from quantscope.model.load import load_proto
    from quantscope.tasks.layout import layout_tasks, parse_layout

    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["output"], name="id")], "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 21, 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 21, 6])])
    model = load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "m")
    task, notes = layout_tasks(model, (parse_layout("output=detect:axis=2,obj=4,grid=8/16/32"),),
                               "d.npz")
    assert task.layout.grid == (8, 16, 32) and "grid of strides 8/16/32" in " ".join(notes)
    import pytest

    from quantscope.tasks.layout import LayoutError
    with pytest.raises(LayoutError, match="21 anchors are no square input's grid"):
        layout_tasks(model, (parse_layout("output=detect:axis=2,obj=4,grid=8/16"),), "d.npz")


def _yolox_model(*, objectness: bool = True) -> onnx.ModelProto:
    """images [N, 3, 32, 32] -> two levels (strides 8, 16) of Concat(reg 4, Sigmoid obj,
    Sigmoid cls) on axis 1, each flattened, concatenated, moved anchors-first: [N, 20, 6]."""
    rng = np.random.default_rng(0)
    inits, nodes, flat = [], [], []
    for lv, s in enumerate((8, 16)):
        parts = (("reg", 4), ("obj", 1), ("cls", 1)) if objectness else (("reg", 4), ("cls", 2))
        for part, ch in parts:
            w = numpy_helper.from_array(rng.normal(0, 0.3, (ch, 3, s, s)).astype(np.float32),
                                        f"w_{part}{lv}")
            inits.append(w)
            nodes.append(helper.make_node("Conv", ["images", w.name], [f"{part}{lv}"],
                                          strides=[s, s], name=f"conv_{part}{lv}"))
            if part != "reg":
                nodes.append(helper.make_node("Sigmoid", [f"{part}{lv}"], [f"sig_{part}{lv}"],
                                              name=f"sig_{part}{lv}"))
        nodes.append(helper.make_node("Concat", [f"reg{lv}", *(f"sig_{p}{lv}" for p, _ in
                                                               parts[1:])],
                                      [f"level{lv}"], axis=1, name=f"level{lv}"))
        inits.append(numpy_helper.from_array(np.array([0, 6, -1], np.int64), f"shape{lv}"))
        nodes.append(helper.make_node("Reshape", [f"level{lv}", f"shape{lv}"], [f"flat{lv}"],
                                      name=f"flat{lv}"))
        flat.append(f"flat{lv}")
    nodes += [helper.make_node("Concat", flat, ["rows"], axis=2, name="levels"),
              helper.make_node("Transpose", ["rows"], ["output"], perm=[0, 2, 1], name="tr")]
    g = helper.make_graph(
        nodes, "yolox", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                       ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 20, 6])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_yolox_head_left_undeclared_is_named(tmp_path) -> None:
    """Read as plain fidelity, ddddocr's detector said nothing of being one; the note names
    the layout, strides from the input's height over each level's."""
    from quantscope.model.load import load_proto
    from quantscope.tasks.layout import layout_tasks, parse_layout

    model = load_proto(_yolox_model(), "yolox")
    task, notes = layout_tasks(model, (), "d.npz")
    assert task is None
    said = [n for n in notes if "made like a YOLOX head" in n]
    assert len(said) == 1 and said[0].endswith(
        "--layout output=detect:axis=2,obj=4,grid=8/16"), said
    declared, notes = layout_tasks(
        model, (parse_layout("output=detect:axis=2,obj=4,grid=8/16"),), "d.npz")
    assert declared is not None and not [n for n in notes if "YOLOX head" in n]


def test_per_step_class_scores_left_undeclared_are_named(tmp_path, capsys) -> None:
    """ddddocr's recognizer without --layout was judged by cosine and SQNR alone, and
    nothing said that the strings were not (ctc is never found by itself)."""
    m, x, s = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz"))
    model = _recognizer(["seqlen", 1, 12])
    w = numpy_helper.from_array(np.random.default_rng(2).normal(0, 1, (5, 12)).astype(
        np.float32), "w_cls")
    model.graph.initializer.append(w)
    model.graph.node[-1].output[0] = "steps"
    model.graph.node.append(helper.make_node("MatMul", ["steps", "w_cls"], ["y"], name="cls"))
    onnx.save(model, m)
    _data(x)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0, \
        capsys.readouterr().err
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8"]) == 0
    out = capsys.readouterr().out
    assert "output 'y' [?, 1, 12] is written by a linear layer" in out
    assert "declare --layout y=ctc" in out and "scored for fidelity only" in out
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", "y=ctc"]) == 0
    assert "written by a linear layer" not in capsys.readouterr().out


def test_run_repeats_the_hints_as_warnings(tmp_path, capsys) -> None:
    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(_yolox_model(), m)
    np.save(x, np.random.default_rng(0).uniform(0, 1, (8, 3, 32, 32)).astype(np.float32))
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8l", "--out",
                 str(tmp_path / "W"), "--budget", "30s"]) == 0, capsys.readouterr().err
    verdict = json.loads((tmp_path / "W" / "verdict.json").read_text())
    assert any("made like a YOLOX head" in n for n in verdict["unscored"])


def test_a_grid_head_without_objectness_names_no_obj_row() -> None:
    """Two Sigmoid class channels after the boxes and no objectness of its own: no obj=."""
    from quantscope.model.load import load_proto
    from quantscope.tasks.layout import layout_tasks

    proto = _yolox_model(objectness=False)
    _, notes = layout_tasks(load_proto(proto, "noobj"), (), "d.npz")
    said = [n for n in notes if "YOLOX head" in n]
    assert len(said) == 1 and said[0].endswith("--layout output=detect:axis=2,grid=8/16"), said
