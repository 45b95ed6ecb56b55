"""Weighted ops' layouts in one place (quantscope.model.layouts), through bias correction,
the QDQ build and ORT, and ``quantscope run`` on a ConvTranspose decoder with its default
repairs (the ``bias`` repair read ConvTranspose's ``[in, out/g, k…]`` weight as a Conv's)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from outside_models import conv_transpose_head, feeds
from tiny_models import _with_weights

from quantscope.model.groups import find_groups
from quantscope.model.layouts import in_out_matrix, layout_of
from quantscope.model.load import load_proto
from quantscope.repair.bias_correction import correct_biases
from quantscope.repair.verify import calibrate_and_quantize
from quantscope.types import Plan, Precision


def _one_op(op: str, attrs: str, x_shape: str, y_shape: str, weights: dict) -> onnx.ModelProto:
    ins = ", ".join(["x", *weights])
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[{x_shape}] x) => (float[{y_shape}] y) {{
        y = {op} {attrs} ({ins})
    }}
    """
    return _with_weights(text, weights)


def _r(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# each: a model whose one weighted op has the layout named, and its data
CASES = {
    "conv_transpose": lambda: _one_op(
        "ConvTranspose", "<strides = [2, 2]>", "N, 4, 6, 6", "N, 6, 13, 13",
        {"w": _r(1).normal(0, 0.5, (4, 6, 3, 3)).astype(np.float32),
         "b": np.zeros(6, np.float32)}),
    "conv_transpose_grouped": lambda: _one_op(
        "ConvTranspose", "<strides = [2, 2], group = 2>", "N, 4, 6, 6", "N, 6, 12, 12",
        {"w": _r(2).normal(0, 0.5, (4, 3, 2, 2)).astype(np.float32),
         "b": np.zeros(6, np.float32)}),
    "conv_grouped": lambda: _one_op(
        "Conv", "<group = 2>", "N, 4, 6, 6", "N, 6, 4, 4",
        {"w": _r(3).normal(0, 0.5, (6, 2, 3, 3)).astype(np.float32),
         "b": np.zeros(6, np.float32)}),
    "conv_depthwise": lambda: _one_op(
        "Conv", "<group = 4>", "N, 4, 6, 6", "N, 4, 4, 4",
        {"w": _r(4).normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32),
         "b": np.zeros(4, np.float32)}),
    "gemm_transB": lambda: _one_op(
        "Gemm", "<transB = 1>", "N, 8", "N, 5",
        {"w": _r(5).normal(0, 0.5, (5, 8)).astype(np.float32),
         "b": np.zeros(5, np.float32)}),
    "gemm": lambda: _one_op(
        "Gemm", "", "N, 8", "N, 5",
        {"w": _r(6).normal(0, 0.5, (8, 5)).astype(np.float32)}),
    "matmul": lambda: _one_op(
        "MatMul", "", "N, 8", "N, 5", {"w": _r(7).normal(0, 0.5, (8, 5)).astype(np.float32)}),
}


def _feeds(proto: onnx.ModelProto, batches: int = 4, n: int = 16) -> list[dict]:
    dims = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim[1:]]
    # positive, non-zero-mean inputs (after a ReLU): weight rounding shifts every output
    return [{"x": _r(100 + i).uniform(0, 1, (n, *dims)).astype(np.float32)}
            for i in range(batches)]


def test_layout_table():
    def node(op, **attrs):
        return onnx.helper.make_node(op, ["x", "w", "b"], ["y"], **attrs)

    ct = layout_of(node("ConvTranspose", group=2))
    assert (ct.out_axis, ct.in_axis, ct.bias_index, ct.group, ct.data_axis) == (1, 0, 2, 2, 1)
    conv = layout_of(node("Conv"))
    assert (conv.out_axis, conv.in_axis, conv.bias_index) == (0, 1, 2)
    gt = layout_of(node("Gemm", transB=1))
    assert (gt.out_axis, gt.in_axis, gt.data_axis) == (0, 1, -1)
    assert layout_of(node("Gemm", transA=1)).data_axis == 0
    mm = layout_of(onnx.helper.make_node("MatMul", ["x", "w"], ["y"]))
    assert (mm.out_axis, mm.bias_index) == (-1, None)
    assert layout_of(onnx.helper.make_node("Relu", ["x"], ["y"])) is None


@pytest.mark.parametrize("name", sorted(CASES))
def test_in_out_matrix_is_the_ops_linear_map(name):
    """Mean input x in_out_matrix == the op's mean output (the bias left out), run by ORT."""
    import onnxruntime as ort

    proto = CASES[name]()
    node = proto.graph.node[0]
    lay = layout_of(node)
    w = onnx.numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == "w"))
    x = _feeds(proto, 1, 64)[0]["x"]
    y = ort.InferenceSession(proto.SerializeToString(),
                             providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mean_x = np.moveaxis(x, lay.data_axis, -1).reshape(-1, x.shape[lay.data_axis]).mean(0)
    mean_y = np.moveaxis(y, lay.output_axis, -1).reshape(-1, y.shape[lay.output_axis]).mean(0)
    got = mean_x @ in_out_matrix(w.astype(np.float64), lay)
    if node.op_type == "ConvTranspose":  # each input position spreads over the kernel
        got *= np.prod(x.shape[2:]) / np.prod(y.shape[2:])
    tol = 0.05 if node.op_type == "Conv" else 1e-4  # Conv: windows see the border less
    np.testing.assert_allclose(got, mean_y, rtol=tol, atol=tol * np.abs(mean_y).max())


@pytest.mark.parametrize("name", sorted(CASES))
def test_bias_correction_of_each_layout(name):
    """Weight mode (from the layout) predicts the shift that output mode measures on the
    emulated model; the correction removes most of the mean error; the QDQ model runs."""
    m = load_proto(CASES[name]())
    fs = _feeds(m.proto)
    plan = Plan.uniform(Precision.A8_W4)
    weight = correct_biases(m, fs, plan, mode="weight")
    output = correct_biases(m, fs, plan, mode="output")
    assert len(weight.changes) == 1 and len(output.changes) == 1
    pred = np.array(weight.changes[0].factors)
    meas = np.array(output.changes[0].factors)
    assert np.abs(meas).max() > 1e-3, "the test needs a visible shift"
    np.testing.assert_allclose(pred, meas, atol=0.15 * np.abs(meas).max())

    def mean_err(proto):
        import onnxruntime as ort

        q = calibrate_and_quantize(proto, fs, plan)
        s_q = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
        s_f = ort.InferenceSession(m.proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
        lay = layout_of(m.graph.node[0])
        d = np.concatenate([
            np.moveaxis(s_q.run(None, f)[0] - s_f.run(None, f)[0], lay.output_axis, -1)
            .reshape(-1, len(pred)) for f in fs])
        return np.abs(d.mean(0)).max()

    assert mean_err(weight.proto) < 0.5 * mean_err(m.proto)


def test_conv_transpose_per_channel_weight_axis_is_1():
    """The QDQ model quantizes a ConvTranspose's weight per output channel: axis 1."""
    m = load_proto(conv_transpose_head())
    g = next(g for g in find_groups(m).groups if g.op_type == "ConvTranspose")
    assert g.weight_axis == 1 and g.bias == "bt"
    fs = [feeds("conv_transpose_head", 8)]
    q = calibrate_and_quantize(m.proto, fs, Plan.uniform(Precision.A8_W8))
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and "wt" in n.input[0])
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    scale = next(t for t in q.graph.initializer if t.name == dq.input[1])
    assert axis == 1 and onnx.numpy_helper.to_array(scale).shape in ((), (2,))


def test_run_conv_transpose_head_with_default_repairs(tmp_path):
    """``quantscope run`` with the default repairs (bias among them) succeeds."""
    model, data, out = tmp_path / "unet.onnx", tmp_path / "d.npz", tmp_path / "run"
    onnx.save(conv_transpose_head(), model)
    np.savez(data, **feeds("conv_transpose_head", 16))
    r = subprocess.run(
        [sys.executable, "-m", "quantscope", "run", str(model), "--data", str(data),
         "--target", "hailo8", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "internal error" not in r.stderr
    assert "measuring repair bias" in r.stdout + r.stderr  # the default repairs include it
    assert json.loads((out / "run.json").read_text())


def test_equalize_pairs_a_conv_with_a_conv_transpose():
    """Conv -> Relu -> ConvTranspose: the ConvTranspose's input channels are its weight's
    axis 0; equalisation keeps FP32 (checked inside) and balances the channel ranges."""
    from quantscope.repair.equalize import equalize_pairs, find_pairs

    m = load_proto(conv_transpose_head())
    pairs, _ = find_pairs(m)
    assert [(p.w1, p.out_axis, p.w2, p.in_axis) for p in pairs] == [("w1", 0, "wt", 0)]
    rep = equalize_pairs(m, [feeds("conv_transpose_head", 8)])
    assert rep.effect[0][1] < 1e-5
    out = {t.name: onnx.numpy_helper.to_array(t) for t in rep.model().graph.initializer}
    r1 = np.abs(out["w1"]).reshape(8, -1).max(1)
    r2 = np.abs(out["wt"]).reshape(8, -1).max(1)
    np.testing.assert_allclose(r1, r2, rtol=1e-3)


def _outlier_head() -> onnx.ModelProto:
    """conv_transpose_head with output channel 0 of the Conv 30x wider: an outlier channel
    between a Conv (entry) and a ConvTranspose (exit)."""
    proto = conv_transpose_head()
    for t in proto.graph.initializer:
        if t.name in ("w1", "b1"):
            a = onnx.numpy_helper.to_array(t).copy()
            a[0] *= 30.0
            t.CopyFrom(onnx.numpy_helper.from_array(a, t.name))
    return proto


def test_split_channels_through_a_conv_transpose():
    """OCS splits the Conv's outlier output channel and duplicates the ConvTranspose's
    input channel (its weight's axis 0, not axis 1); FP32 is checked inside."""
    import onnxruntime as ort

    from quantscope.repair.split import split_channels

    m = load_proto(_outlier_head())
    fs = [feeds("conv_transpose_head", 8)]
    rep = split_channels(m, fs)
    axes = {c.tensor: c.axis for c in rep.changes}
    assert {k: axes.get(k) for k in ("w1", "b1", "wt")} == {"w1": 0, "b1": 0, "wt": 0}, \
        (axes, rep.skipped)
    out = rep.model()
    w = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    assert w["wt"].shape[0] == w["w1"].shape[0] > 8 and w["wt"].shape[1] == 2
    run = ort.InferenceSession(out.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(m.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(run.run(None, fs[0])[0], ref.run(None, fs[0])[0], atol=1e-5)
