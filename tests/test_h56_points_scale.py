"""MTCNN's O-Net writes its landmarks ``[N, 10]`` as shares of its 48-px crop, planar
(x1..x5 then y1..y5), and its box ``[N, 4]`` as corner offsets x1, y1, x2, y2 in units of
the crop side. Judged as points they were read interleaved (x1 paired with x2) and in the
output's units: a 0.02 move (about 1 px of the crop) was "0.02", within a tolerance of 1 %
of a span of 0.6. ``scale=S`` / ``scale=input`` and ``order=planar`` put them in pixels."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from evaluate_cli import assert_layout_refused, calibrated_folder, evaluated
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.tasks.points import PointsTask
from quantscope.types import Outputs


def _out(name: str, a: np.ndarray) -> Outputs:
    return Outputs(names=(name,), batches=((a.astype(np.float32),),))


def _landmarks() -> tuple[np.ndarray, np.ndarray]:
    """Two samples of 5 planar landmarks in units of the crop, and a copy where sample 0's
    3rd point moves by (0.03, 0.04) of the crop (5 % of it: 2.4 px at 48) and sample 1's
    5th by (0.0, 0.01) (0.48 px)."""
    ref = np.array([[0.3, 0.7, 0.5, 0.35, 0.65, 0.4, 0.4, 0.6, 0.8, 0.8],
                    [0.2, 0.6, 0.4, 0.25, 0.55, 0.3, 0.35, 0.5, 0.7, 0.75]])
    test = ref.copy()
    test[0, 2] += 0.03  # x3
    test[0, 7] += 0.04  # y3
    test[1, 9] += 0.01  # y5
    return ref, test


def test_planar_landmarks_in_pixels_of_the_crop():
    ref, test = _landmarks()
    task = PointsTask(name="p", output="lm", scale=(48.0, 48.0), scale_read="scale=48",
                      order="planar")
    m = task.metrics(_out("lm", ref), _out("lm", test))
    v = m.values
    assert v["point_error_max"] == pytest.approx(0.05 * 48, rel=1e-5)  # 2.4 px
    assert v["point_error_mean"] == pytest.approx((2.4 + 0.48) / 10, rel=1e-5)
    assert v["point_tolerance"] == 1.0  # one pixel of the crop, by default
    assert v["point_agreement"] == pytest.approx(0.9)  # 9 of 10 points within 1 px
    assert any("mean 0.288 px, max 2.4 px (pixels: the values x 48, scale=48); within "
               "1 px (one pixel, by default" in n for n in m.notes), m.notes
    assert any("NOT LIKE FP32: output 'lm': 1 of 10 points move more than 1 px" in n
               for n in m.notes), m.notes
    assert task.describe() == (
        "points of 2 values, planar (every point's x, then every point's y), judged by "
        "the distance over x, y in pixels (the values x 48, scale=48), within 1 px")


def test_planar_and_interleaved_read_different_points():
    """Read interleaved, the same values pair x3 with y2 and y3 with y4: 2 points move,
    each by one coordinate."""
    ref, test = _landmarks()
    v = PointsTask(name="p", output="lm", scale=(48.0, 48.0)).metrics(
        _out("lm", ref), _out("lm", test)).values
    assert v["point_error_max"] == pytest.approx(0.04 * 48, rel=1e-5)
    assert v["point_error_mean"] == pytest.approx((1.44 + 1.92 + 0.48) / 10, rel=1e-5)


def test_a_box_of_two_corners_in_pixels():
    ref = np.array([[-0.05, 0.02, 0.04, -0.01], [0.1, -0.08, -0.02, 0.03]])
    test = ref + np.array([[0.0, 0.0, 0.01, 0.0], [0.0, 0.0, 0.0, 0.0]])  # x2 by 0.48 px
    test[1, :2] += [0.03, 0.04]  # corner 1 of sample 1: 2.4 px
    m = PointsTask(name="b", output="boxes", scale=(48.0, 48.0), scale_read="scale=48").metrics(
        _out("boxes", ref), _out("boxes", test))
    assert m.values["point_error_max"] == pytest.approx(2.4, rel=1e-5)
    assert m.values["point_error_mean"] == pytest.approx((0.48 + 2.4) / 4, rel=1e-5)
    assert m.values["point_agreement"] == pytest.approx(0.75)


def test_a_non_square_scale_scales_x_and_y_apart():
    ref = np.zeros((1, 2))
    test = np.array([[0.01, 0.01]])
    v = PointsTask(name="p", output="lm", scale=(300.0, 400.0)).metrics(
        _out("lm", ref), _out("lm", test)).values
    assert v["point_error_max"] == pytest.approx(5.0, rel=1e-5)  # 3 px by 4 px


def test_unscaled_small_points_name_the_scale():
    ref, test = _landmarks()
    m = PointsTask(name="p", output="lm").metrics(_out("lm", ref), _out("lm", test))
    assert any("FP32's points span" in n and "--layout lm=points:scale=S" in n
               for n in m.notes), m.notes


def _onet_like(side: int = 48, flat_input: bool = False) -> onnx.ModelProto:
    """Conv, GlobalAveragePool, Flatten, then two Gemms: ``landmarks [N, 10]`` around 0.5
    and ``boxes [N, 4]`` around 0, both in units of the crop."""
    r = np.random.default_rng(56)
    w = {"wc": r.normal(0, 0.3, (8, 3, 4, 4)), "bc": r.normal(0, 0.1, 8),
         "wl": r.normal(0, 0.2, (8, 10)), "bl": np.full(10, 0.5),
         "wb": r.normal(0, 0.1, (8, 4)), "bb": np.zeros(4)}
    nodes = [helper.make_node("Conv", ["input", "wc", "bc"], ["c"], strides=[4, 4]),
             helper.make_node("Relu", ["c"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wl", "bl"], ["landmarks"]),
             helper.make_node("Gemm", ["f", "wb", "bb"], ["boxes"])]
    shape = ["N", 3 * side * side] if flat_input else ["N", 3, side, side]
    if flat_input:
        nodes.insert(0, helper.make_node("Reshape", ["flat", "to"], ["input"]))
        w["to"] = np.array([-1, 3, side, side])
    graph = helper.make_graph(
        nodes, "onet_like",
        [helper.make_tensor_value_info("flat" if flat_input else "input", TensorProto.FLOAT,
                                       shape)],
        [helper.make_tensor_value_info("landmarks", TensorProto.FLOAT, ["N", 10]),
         helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(v.astype(np.int64 if k == "to" else np.float32), k)
         for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def onet(tmp_path_factory):
    x = np.random.default_rng(0).uniform(-1, 1, (16, 3, 48, 48)).astype(np.float32)
    return calibrated_folder(tmp_path_factory.mktemp("onet"), "onet", _onet_like(), x)


def _evaluate(d, capsys, *layouts: str) -> dict:
    args = [a for lay in layouts for a in ("--layout", lay)]
    return evaluated(capsys, d, "onet.onnx", "onet.npz", *args)


def test_evaluate_gives_the_crop_pixels_of_the_same_quantized_error(onet, capsys):
    """The same a8_w8 outputs: the pixel figures are the unit figures x 48 (the input's
    side, read from the model), and the tolerance is one pixel of it."""
    units = _evaluate(onet, capsys, "landmarks=points:order=planar", "boxes=points")
    px = _evaluate(onet, capsys, "landmarks=points:order=planar,scale=input",
                   "boxes=points:scale=48")
    for out in ("landmarks", "boxes"):
        for key in ("point_error_mean", "point_error_max"):
            a, b = units["metrics"][f"{key}:{out}"], px["metrics"][f"{key}:{out}"]
            assert a > 0 and b == pytest.approx(48 * a, rel=1e-4), (out, key, a, b)
        assert px["metrics"][f"point_tolerance:{out}"] == 1.0
    notes = px["notes"]
    assert any("output 'landmarks' read as points of 2 values, planar" in n and
               "in pixels (the values x 48, scale=input, the width and height of input "
               "'input', 48 x 48), within 1 px" in n for n in notes), notes
    assert any("output 'boxes': 2 points per sample; distance to FP32's mean" in n and
               " px (pixels: the values x 48, scale=48); within 1 px" in n
               for n in notes), notes


@pytest.mark.parametrize(("layout", "needle"), [
    ("landmarks=points:scale=0", "scale 0 is outside (0, inf]"),
    ("landmarks=points:scale=-48", "scale -48 is outside (0, inf]"),
    ("landmarks=points:scale=crop", "scale 'crop' is neither a number nor 'input'"),
    ("landmarks=points:scale=inf", "scale 'inf' is not a finite number"),
    ("landmarks=points:order=rows", "order 'rows' is unknown: use interleaved, planar or channels"),
    ("landmarks=points:dims=3,order=planar", "10 values per sample are no whole number of "
                                             "points of 3"),
])
def test_bad_scale_or_order_is_one_line(onet, capsys, layout, needle):
    assert_layout_refused(capsys, onet, "onet.onnx", "onet.npz", layout, needle)


def test_scale_input_without_an_image_input_is_one_line(tmp_path, capsys):
    onnx.save(_onet_like(flat_input=True), tmp_path / "flat.onnx")
    np.savez(tmp_path / "flat.npz", flat=np.random.default_rng(1).uniform(
        -1, 1, (4, 3 * 48 * 48)).astype(np.float32))
    data, stats = str(tmp_path / "flat.npz"), str(tmp_path / "s.npz")
    assert main(["calibrate", str(tmp_path / "flat.onnx"), "--data", data, "--out", stats]) == 0
    capsys.readouterr()
    code = main(["evaluate", str(tmp_path / "flat.onnx"), "--data", data, "--stats", stats,
                 "--precision", "a8_w8", "--layout", "landmarks=points:scale=input"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    assert "scale=input takes the image input's side, and no model input takes images" in \
        lines[0] and "give the side in pixels instead (scale=48" in lines[0], lines[0]
    assert ".npz" not in lines[0]  # image_input's advice is for data, not for a layout


def test_a_box_map_read_by_position():
    """P-Net's ``boxes [N, 4, h, w]``: each position's 4 offsets are its two corners. Read
    as one run of values, x1 at position 0 was paired with x1 at position 1."""
    ref = np.zeros((1, 4, 1, 2))
    test = ref.copy()
    test[0, 2, 0, 1] = 0.25  # x2 of position 1: 3 px at 12
    test[0, 3, 0, 1] = 1 / 3  # y2 of position 1: 4 px
    m = PointsTask(name="b", output="boxes", scale=(12.0, 12.0), order="channels").metrics(
        _out("boxes", ref), _out("boxes", test))
    assert m.values["point_error_max"] == pytest.approx(5.0, rel=1e-5)
    assert m.values["point_agreement"] == pytest.approx(0.75)  # 3 of 4 corners hold
    flat = PointsTask(name="b", output="boxes", scale=(12.0, 12.0)).metrics(
        _out("boxes", ref), _out("boxes", test)).values
    assert flat["point_error_max"] == pytest.approx(4.0, rel=1e-5)  # x2 and y2 apart


def _pnet_like() -> onnx.ModelProto:
    r = np.random.default_rng(12)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w", "b"], ["boxes"], strides=[4, 4])],
        "pnet_like", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                   ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4, 4, 4])],
        [numpy_helper.from_array(r.normal(0, 0.05, (4, 3, 4, 4)).astype(np.float32), "w"),
         numpy_helper.from_array(np.zeros(4, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def test_a_box_map_on_the_cli_is_read_by_position_or_said(tmp_path, capsys):
    onnx.save(_pnet_like(), tmp_path / "p.onnx")
    np.savez(tmp_path / "p.npz", input=np.random.default_rng(2).uniform(
        -1, 1, (8, 3, 16, 16)).astype(np.float32))
    data, stats = str(tmp_path / "p.npz"), str(tmp_path / "s.npz")
    assert main(["calibrate", str(tmp_path / "p.onnx"), "--data", data, "--out", stats]) == 0

    def notes(layout: str) -> list[str]:
        assert main(["evaluate", str(tmp_path / "p.onnx"), "--data", data, "--stats", stats,
                     "--precision", "a8_w8", "--layout", layout,
                     "--json", str(tmp_path / "r.json")]) == 0
        capsys.readouterr()
        return json.loads((tmp_path / "r.json").read_text())["notes"]

    flat = notes("boxes=points:scale=12")
    assert any("output 'boxes' of shape ('?', 4, 4, 4) is a map of 4 channels (the graph's "
               "axis 1) read as one run of values per sample" in n and "boxes=points:order=channels" in n
               for n in flat), flat
    by_position = notes("boxes=points:scale=12,order=channels")
    assert any("output 'boxes': 32 points per sample" in n for n in by_position), by_position
    assert not any("is a map of 4 channels" in n for n in by_position), by_position
    capsys.readouterr()
    code = main(["evaluate", str(tmp_path / "p.onnx"), "--data", data, "--stats", stats,
                 "--precision", "a8_w8", "--layout", "boxes=points:dims=3,order=channels"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "axis 1 holds 4 values per position" in err[0], err
