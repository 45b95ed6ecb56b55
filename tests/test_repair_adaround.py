import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
import onnx
import pytest
import tiny_models as tm
from onnx import helper, numpy_helper

from quantscope.emulate.session import make_session, runner
from quantscope.model.load import load_proto
from quantscope.numerics import weight_encoding
from quantscope.repair.adaround import ConvGeometry, adaround, im2col, optimise_rounding
from quantscope.repair.verify import calibrate_and_quantize, quantized_error, run_all
from quantscope.types import Plan, Precision


def _correlated(model, seed, n=64):
    """Strongly correlated inputs: where nearest rounding is far from output-optimal."""
    r = np.random.default_rng(seed)
    mix = np.random.default_rng(7).normal(0, 1, (4, 32))
    return {"x": (r.normal(0, 1, (n, 4)) @ mix + 0.1 * r.normal(0, 1, (n, 32))).astype(np.float32)}


def test_rounding_beats_nearest_on_the_layer_objective():
    r = np.random.default_rng(0)
    x = r.normal(0, 1, (512, 4)) @ r.normal(0, 1, (4, 24))
    w = r.normal(0, 0.2, (24, 16))
    s = np.abs(w).max(axis=0, keepdims=True) / 7  # 4-bit grid
    h = x.T @ x / len(x)
    q = optimise_rounding(w, s, -8, 7, h, iterations=300)
    near = np.clip(np.round(w / s), -8, 7)

    def err(c):
        e = s * c - w
        return float(np.sum(e * (h @ e)))

    assert err(q) < 0.8 * err(near)


def test_adaround_weights_lie_on_the_grid_and_cut_the_error():
    m = load_proto(tm.residual_add())
    feeds = [_correlated(m, i) for i in range(4)]
    held_out = [_correlated(m, 100 + i) for i in range(2)]
    plan = Plan.uniform(Precision.A8_W4)
    rep = adaround(m, feeds, plan, iterations=300)
    assert rep.effect_dict()["on_grid"] == 1.0
    w = rep.model().initializer_array("w1")
    enc = weight_encoding(w, 4, axis=1, signed=True, symmetric=True)
    assert np.allclose(w / enc.scale, np.round(w / enc.scale), atol=1e-3)
    before = quantized_error(m.proto, calibrate_and_quantize(m.proto, feeds, plan), held_out)
    after = quantized_error(m.proto, calibrate_and_quantize(rep.proto, feeds, plan), held_out)
    assert after["rel_mse"] < before["rel_mse"], (before, after)


# --- Conv ----------------------------------------------------------------------------

def _one_conv(w, attrs, bias=None):
    """A model of one Conv (weight ``w`` as an initializer) on input ``x``."""
    inputs = ["x", "w"] + (["b"] if bias is not None else [])
    node = helper.make_node("Conv", inputs, ["y"], name="conv", **attrs)
    inits = [numpy_helper.from_array(w.astype(np.float32), "w")]
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.astype(np.float32), "b"))
    g = helper.make_graph(
        [node], "one_conv",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _conv(x, w, attrs):
    return runner(make_session(_one_conv(w, attrs)))({"x": x.astype(np.float32)})[0]


CASES = [
    {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [2, 1]},
    {"kernel_shape": [3, 2], "group": 2, "strides": [1, 2], "pads": [0, 1, 1, 0]},
    {"kernel_shape": [3, 3], "group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]},  # depthwise
    {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "VALID", "strides": [2, 3], "dilations": [1, 2]},
    {"kernel_shape": [1, 1]},
]


@pytest.mark.parametrize("attrs", CASES)
def test_im2col_patches_times_weight_is_the_conv_output(attrs):
    r = np.random.default_rng(3)
    x = r.normal(0, 1, (2, 4, 9, 8))
    group = attrs.get("group", 1)
    w = r.normal(0, 1, (6 if group < 4 else 4, 4 // group, *attrs["kernel_shape"]))
    ref = _conv(x, w, attrs)  # ONNX Runtime's Conv
    node = _one_conv(w, attrs).graph.node[0]
    geom = ConvGeometry.of(node, w.shape)
    (_, _, _, _), (oh, ow) = geom.padding((9, 8))
    assert ref.shape[2:] == (oh, ow)
    p = im2col(x, geom)
    assert p.shape == (2 * oh * ow, 4 // group * w[0, 0].size * group)
    og, d = w.shape[0] // group, p.shape[1] // group
    cols = [p[:, g * d : (g + 1) * d] @ w[g * og : (g + 1) * og].reshape(og, -1).T for g in range(group)]
    out = np.concatenate(cols, axis=1).reshape(2, oh, ow, -1).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(out, ref, atol=1e-4)
    pick = np.array([0, 5, len(p) - 1])
    np.testing.assert_array_equal(im2col(x, geom, pick), p[pick])


def _stride_pad_net(seed=5):
    """Conv(3->8, dilation 2, pad 2) Relu, depthwise Conv(stride 2, asymmetric pads) Relu,
    grouped Conv(group 2, SAME_UPPER) Relu, GlobalAveragePool, Flatten.

    (ONNX Runtime refuses dilations together with SAME auto_pad.)"""
    r = np.random.default_rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    net (float[N, 3, 16, 16] image) => (float[N, 16] out) {
        c1 = Conv <pads = [2, 2, 2, 2], dilations = [2, 2]> (image, w1, b1)
        r1 = Relu (c1)
        c2 = Conv <group = 8, strides = [2, 2], pads = [1, 0, 1, 1]> (r1, w2, b2)
        r2 = Relu (c2)
        c3 = Conv <group = 2, auto_pad = "SAME_UPPER"> (r2, w3)
        r3 = Relu (c3)
        p = GlobalAveragePool (r3)
        out = Flatten (p)
    }
    """
    return tm._with_weights(text, {
        "w1": r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.3, (8, 1, 3, 3)).astype(np.float32),
        "b2": r.normal(0, 0.1, 8).astype(np.float32),
        "w3": r.normal(0, 0.2, (16, 4, 3, 3)).astype(np.float32),
    })


def _smooth_images(seed, n=8):
    """Spatially smooth, channel-correlated images: strongly correlated patches."""
    r = np.random.default_rng(seed)
    low = r.normal(0, 1, (n, 1, 4, 4)) + 0.3 * r.normal(0, 1, (n, 3, 4, 4))
    img = np.kron(low, np.ones((1, 1, 4, 4)))
    return {"image": (img + 0.05 * r.normal(0, 1, img.shape)).astype(np.float32)}


def _layer_errors(fp32, new, feeds, precision):
    """Per Conv: squared output error on the FP32 calibration inputs, new vs nearest weights."""
    bits = precision.weight_bits
    taps = [n.input[0] for n in fp32.graph.node if n.op_type == "Conv"]
    tapped = onnx.ModelProto()
    tapped.CopyFrom(fp32.proto)
    tapped.graph.output.extend(onnx.ValueInfoProto(name=t) for t in taps)
    ins = run_all(tapped, feeds)
    out = {}
    for k, node in enumerate(n for n in fp32.graph.node if n.op_type == "Conv"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        w = fp32.initializer_array(node.input[1])
        enc = weight_encoding(w, bits, axis=0, signed=True, symmetric=True)
        s = enc.scale.reshape(-1, 1, 1, 1)
        near = (s * np.clip(np.round(w / s), enc.qmin, enc.qmax)).astype(np.float32)
        ada = new.initializer_array(node.input[1])
        errs = [0.0, 0.0]
        for batch in ins:
            x = batch[1 + k]
            ref = _conv(x, w, attrs)
            for i, wq in enumerate((ada, near)):
                errs[i] += float(np.sum((_conv(x, wq, attrs).astype(np.float64) - ref) ** 2))
        out[node.name or node.output[0]] = tuple(errs)
    return out


@pytest.mark.parametrize("precision", [Precision.A8_W4, Precision.A8_W8])
@pytest.mark.parametrize("build", [tm.conv_net, _stride_pad_net])
def test_adaround_conv_on_the_grid_and_below_nearest_layer_error(build, precision):
    m = load_proto(build())
    feeds = [_smooth_images(i) for i in range(3)]
    rep = adaround(m, feeds, Plan.uniform(precision), iterations=1000)
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    changed = {c.tensor for c in rep.changes}
    assert {n.input[1] for n in convs} <= changed
    assert not [s for s in rep.skipped if s[0] in {n.name for n in convs}]
    assert rep.effect_dict()["on_grid"] == 1.0
    new = rep.model()
    bits = precision.weight_bits
    for n in convs:
        w = new.initializer_array(n.input[1])
        enc = weight_encoding(w, bits, axis=0, signed=True, symmetric=True)
        codes = w / enc.scale.reshape(-1, 1, 1, 1)
        assert np.abs(codes - np.round(codes)).max() < 1e-3
        assert np.array_equal(enc.scale, weight_encoding(
            m.initializer_array(n.input[1]), bits, axis=0, signed=True, symmetric=True).scale)
    # H is exact here (no subsampling): a layer that moved any weight off nearest has a
    # strictly lower output error on the calibration data; the others kept nearest
    flips = {n.name: not c.note.startswith("0 of") for n in convs for c in rep.changes
             if c.tensor == n.input[1]}
    errors = _layer_errors(m, new, feeds, precision)
    for name, (ada, near) in errors.items():
        assert ada < near if flips[name] else ada == near, (name, ada, near)
    assert sum(flips.values()) >= len(convs) - 1, rep.changes
    assert np.mean([a / b for a, b in errors.values()]) < 0.95, errors


def test_adaround_conv_keeps_the_fp32_structure_and_names():
    m = load_proto(_stride_pad_net())
    rep = adaround(m, [_smooth_images(0)], Plan.uniform(Precision.A8_W4), iterations=50)
    a, b = m.proto.graph, rep.proto.graph
    assert [n.SerializeToString() for n in a.node] == [n.SerializeToString() for n in b.node]
    assert [i.SerializeToString() for i in a.input] == [i.SerializeToString() for i in b.input]
    assert [o.SerializeToString() for o in a.output] == [o.SerializeToString() for o in b.output]
    assert [(t.name, list(t.dims), t.data_type) for t in a.initializer] == [
        (t.name, list(t.dims), t.data_type) for t in b.initializer
    ]
    for t in a.initializer:  # only conv weights move (biases stay)
        same = np.array_equal(m.initializer_array(t.name), rep.model().initializer_array(t.name))
        assert same == (t.name.startswith("b")), t.name


def test_conv_patch_subsampling_is_seeded_and_still_helps():
    m = load_proto(tm.conv_net())
    feeds = [_smooth_images(i) for i in range(2)]
    plan = Plan.uniform(Precision.A8_W4)
    one = adaround(m, feeds, plan, iterations=1000, max_patches=600)
    two = adaround(m, feeds, plan, iterations=1000, max_patches=600)
    for t in ("w1", "w2"):
        assert np.array_equal(one.model().initializer_array(t), two.model().initializer_array(t))
    notes = {c.tensor: c.note for c in one.changes}
    # 16 samples, 38 positions each out of 256 (c1) / 64 (c2)
    assert "H from 608 of 4096 patch rows" in notes["w1"], notes["w1"]
    assert "H from 608 of 1024 patch rows" in notes["w2"], notes["w2"]
    other = adaround(m, feeds, plan, iterations=1000, max_patches=600, seed=1)
    ratio = one.effect_dict()["mean_output_error_ratio"]
    assert ratio != other.effect_dict()["mean_output_error_ratio"]  # another sample, another H
    errors = _layer_errors(m, one.model(), feeds, Precision.A8_W4)  # on every patch
    assert sum(a for a, _ in errors.values()) < 0.9 * sum(b for _, b in errors.values()), errors


def test_conv_that_cannot_be_handled_is_skipped_with_a_reason():
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    net (float[N, 4, 12] x) => (float[N, 4, 12] y, float[N, 4, 12] z) {
        y = Conv <pads = [1, 1]> (x, w)
        z = Conv <pads = [1, 1]> (y, v)
    }
    """
    r = np.random.default_rng(0)
    m = load_proto(tm._with_weights(text, {
        "w": r.normal(0, 1, (4, 4, 3)).astype(np.float32),
        "v": r.normal(0, 1, (4, 4, 3)).astype(np.float32),
    }))
    feeds = [{"x": r.normal(0, 1, (4, 4, 12)).astype(np.float32)}]
    rep = adaround(m, feeds, Plan.uniform(Precision.A8_W4), iterations=10)
    assert rep.changes == ()
    assert len(rep.skipped) == 2 and all("1-D kernel" in why for _, why in rep.skipped)
