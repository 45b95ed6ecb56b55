"""Weightless layers left at 8 bit between promoted neighbours (plan/between.py).

A tiny U-Net (Conv/MaxPool down, linear Resize up, Concat skips) on hailo8 with no goal:
the greedy path promoted every Conv and Concat to a16_w16 but left both Resizes at a8_w8
(promoted alone, a Resize gains nothing: the Concat after it re-quantizes on the same
grid), so the "best quality" plan kept two 8-bit steps between 16-bit layers: 38.0 dB
held out, where the Resizes at a16_w16 give 41.3 dB for +0.03x cost. The refinement now
measures that candidate too (origin ``between``) and keeps it when it measures better.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _unet() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits = [], []

    def conv(i, o, cin, cout, k=3, relu=True):
        w = rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        inits.extend([numpy_helper.from_array(w.astype(np.float32), o + "_w"),
                      numpy_helper.from_array((rng.standard_normal(cout) * .05)
                                              .astype(np.float32), o + "_b")])
        out = o + "_c" if relu else o
        nodes.append(helper.make_node("Conv", [i, o + "_w", o + "_b"], [out],
                                      pads=[k // 2] * 4, name=o))
        if relu:
            nodes.append(helper.make_node("Relu", [out], [o], name=o + "_relu"))
        return o

    def up(i, o):
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), o + "_scales"))
        nodes.append(helper.make_node("Resize", [i, "", o + "_scales"], [o], name=o, mode="linear"))

    conv("input", "enc1", 3, 8)
    nodes.append(helper.make_node("MaxPool", ["enc1"], ["p1"], kernel_shape=[2, 2],
                                  strides=[2, 2], name="pool1"))
    conv("p1", "enc2", 8, 16)
    nodes.append(helper.make_node("MaxPool", ["enc2"], ["p2"], kernel_shape=[2, 2],
                                  strides=[2, 2], name="pool2"))
    conv("p2", "bott", 16, 16)
    up("bott", "up2")
    nodes.append(helper.make_node("Concat", ["up2", "enc2"], ["cat2"], axis=1, name="cat2"))
    conv("cat2", "dec2", 32, 16)
    up("dec2", "up1")
    nodes.append(helper.make_node("Concat", ["up1", "enc1"], ["cat1"], axis=1, name="cat1"))
    conv("cat1", "dec1", 24, 8)
    conv("dec1", "head", 8, 1, k=1, relu=False)
    nodes.append(helper.make_node("Identity", ["head"], ["output"]))
    graph = helper.make_graph(
        nodes, "unet", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, 32, 32])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _space(model):
    from quantscope.model.groups import find_groups
    from quantscope.plan.pareto import Budget
    from quantscope.plan.start import start_search
    from quantscope.targets import load_target
    from quantscope.types import Precision, Sensitivity

    groups = find_groups(model)
    # promoted alone, a Resize or a pooling gains nothing (the analysis' disable-one)
    gains = {g.name: {Precision.A16_W16: 0.0 if g.op_type in ("Resize", "MaxPool") else 1.0}
             for g in groups.groups}
    sens = Sensitivity.from_gains("output_sqnr_db", 30.0, gains)
    return start_search(groups, sens, load_target("hailo8"), model, low=None, candidates=None,
                        budget=Budget(), shapes=None, start=None, repairs=(),
                        )


def test_between_point_promotes_the_resizes_and_nothing_else():
    from quantscope.model.load import load_proto
    from quantscope.plan.between import between_point
    from quantscope.plan.predict import predict
    from quantscope.types import Precision

    space = _space(load_proto(_unet(), "unet.onnx"))
    high = {n: Precision.A16_W16 for n in ("enc1", "enc2", "bott", "cat2", "dec2", "cat1",
                                           "dec1", "head")}
    best = predict(space, {**space.start, **high}, (), "greedy", 8)
    point = between_point(space, best)
    assert point is not None and point.origin == "between"
    added = dict(point.overrides).keys() - high.keys()
    # the Resizes sit between 16-bit layers; a MaxPool at 16 bit breaks hailo.maxpool_16bit
    assert added == {"up1", "up2"}, dict(point.overrides)
    assert point.cost > best.cost
    # one side at 8 bit: nothing between
    low_side = predict(space, {**space.start, **{k: v for k, v in high.items() if k != "bott"}},
                       (), "greedy", 7)
    assert "up2" not in dict(between_point(space, low_side).overrides)


def _unet_drawn(rng, up: str, outc: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """A U-Net (ConvTranspose or Resize up) and 24 inputs, drawn from ``rng`` in order."""
    nodes, inits = [], []

    def draw(name, shape, fan):
        a = rng.standard_normal(shape) * np.sqrt(2.0 / fan)
        inits.append(numpy_helper.from_array(a.astype(np.float32), name))

    def conv(i, o, cin, cout, k=3, relu=True):
        draw(o + "_w", [cout, cin, k, k], cin * k * k)
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * .05)
                                             .astype(np.float32), o + "_b"))
        out = o + "_c" if relu else o
        nodes.append(helper.make_node("Conv", [i, o + "_w", o + "_b"], [out],
                                      pads=[k // 2] * 4, name=o))
        if relu:
            nodes.append(helper.make_node("Relu", [out], [o], name=o + "_relu"))
        return o

    def upsample(i, o, cin, cout):
        if up == "convT":
            draw(o + "_w", [cin, cout, 2, 2], cout * 4)
            inits.append(numpy_helper.from_array((rng.standard_normal(cout) * .05)
                                                 .astype(np.float32), o + "_b"))
            nodes.append(helper.make_node("ConvTranspose", [i, o + "_w", o + "_b"], [o],
                                          strides=[2, 2], kernel_shape=[2, 2], name=o))
            return cout
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), o + "_scales"))
        kw = {"coordinate_transformation_mode": "half_pixel"} if up == "linear" else {}
        nodes.append(helper.make_node("Resize", [i, "", o + "_scales"], [o], name=o, mode=up, **kw))
        return cin

    conv("input", "enc1", 3, 8)
    nodes.append(helper.make_node("MaxPool", ["enc1"], ["p1"], kernel_shape=[2, 2],
                                  strides=[2, 2], name="pool1"))
    conv("p1", "enc2", 8, 16)
    nodes.append(helper.make_node("MaxPool", ["enc2"], ["p2"], kernel_shape=[2, 2],
                                  strides=[2, 2], name="pool2"))
    conv("p2", "bott", 16, 16)
    c = upsample("bott", "up2", 16, 16)
    nodes.append(helper.make_node("Concat", ["up2", "enc2"], ["cat2"], axis=1, name="cat2"))
    conv("cat2", "dec2", c + 16, 16)
    c = upsample("dec2", "up1", 16, 8)
    nodes.append(helper.make_node("Concat", ["up1", "enc1"], ["cat1"], axis=1, name="cat1"))
    conv("cat1", "dec1", c + 8, 8)
    conv("dec1", "head", 8, outc, k=1, relu=False)
    nodes.append(helper.make_node("Identity", ["head"], ["output"]))
    graph = helper.make_graph(
        nodes, "unet", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, outc, 32, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, rng.standard_normal((24, 3, 32, 32)).astype(np.float32)


def test_resizes_between_promoted_layers_are_promoted_with_them(tmp_path):
    from quantscope.cli import main

    m, x = tmp_path / "unet.onnx", tmp_path / "x.npz"
    rng = np.random.default_rng(0)
    _unet_drawn(rng, "convT", 5)
    _unet_drawn(rng, "nearest", 5)  # the third U-Net of this draw is the one of the report
    model, inputs = _unet_drawn(rng, "linear", 1)
    onnx.save(model, m)
    np.savez(x, input=inputs)
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8",
                 "--out", str(tmp_path / "W")]) == 0
    plan = json.loads((tmp_path / "W" / "plan.json").read_text())
    groups = plan["groups"]
    assert groups.get("cat2") == groups.get("dec2") == groups.get("bott") == "a16_w16", groups
    assert groups.get("up1") == groups.get("up2") == "a16_w16", groups
    # measured better than every point of the greedy path (which left the Resizes at 8 bit)
    walk = [p["measured"] for p in plan["pareto"]["points"] if p["measured"] is not None]
    assert plan["pareto"]["chosen"]["measured"] > max(walk) + 1.0


def test_no_goal_measures_the_widest_legal_plan(tmp_path):
    """plan/widest.py: the nearest-Resize U-Net of the same draw. Its disable-one gains,
    measured on one proxy row, read the last Conv ('head') as -0.09 dB, so the greedy path
    stopped with it at a8_w8 and the "best quality" plan measured 31.2 dB held out at 6.9x;
    the widest legal plan (every layer at a16_w16 but the MaxPools, which hailo8 keeps at
    8 bit) measures 35.7 dB at 7.3x and is now measured and chosen."""
    from quantscope.cli import main

    m, x = tmp_path / "unet.onnx", tmp_path / "x.npz"
    rng = np.random.default_rng(0)
    _unet_drawn(rng, "convT", 5)
    model, inputs = _unet_drawn(rng, "nearest", 5)
    onnx.save(model, m)
    np.savez(x, input=inputs)
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8",
                 "--out", str(tmp_path / "W")]) == 0
    plan = json.loads((tmp_path / "W" / "plan.json").read_text())
    assert plan["groups"].get("head") == "a16_w16", plan["groups"]
    walk = [p["measured"] for p in plan["pareto"]["points"] if p["measured"] is not None]
    assert plan["pareto"]["chosen"]["measured"] > max(walk) + 1.0
    # under a cost cap the widest fill is not measured (it took the drops' measurements
    # on minilm-l6 at --max-cost 1.5 under a time budget, at 76.3 % for 1.03x)
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8", "--max-cost", "7",
                 "--out", str(tmp_path / "G")]) == 0
    goal = json.loads((tmp_path / "G" / "plan.json").read_text())["pareto"]
    assert "widest" not in {t.get("origin") for t in goal.get("trials", [])}
    assert "widest" in {t.get("origin") for t in plan["pareto"].get("trials", [])}
