import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
import onnx
import pytest
import tiny_models as tm
from onnx import numpy_helper, parser

from quantscope.model.load import load_proto
from quantscope.repair.apply import run_repairs
from quantscope.repair.split import channel_ranges, find_sites, plan_copies, split_channels
from quantscope.repair.verify import calibrate_and_quantize, check_function, quantized_error
from quantscope.types import Plan, Precision, QuantScheme

PLAN = Plan.uniform(Precision.A8_W8)


def _model(text: str, weights: dict[str, np.ndarray]):
    proto = parser.parse_model(text)
    proto.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    onnx.checker.check_model(proto)
    return load_proto(proto)


def _conv(r, cout: int, cin: int, k: int = 3) -> np.ndarray:
    return r.normal(0, 0.3 / np.sqrt(cin), (cout, cin, k, k)).astype(np.float32)


def conv_relu_conv(act: str = "Relu", outlier: float = 50.0):
    """Conv -> act -> Conv; output channel 2 of the first conv ``outlier`` times wider (the
    second conv reads it with weights ``outlier / 4`` times smaller)."""
    r = np.random.default_rng(10)
    w1, b1 = _conv(r, 8, 3), r.normal(0, 0.1, 8).astype(np.float32)
    w1[2] *= outlier
    b1[2] *= outlier
    act_call = "PRelu (c1, slope)" if act == "PRelu" else f"{act} (c1)"
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    ccr (float[N, 3, 12, 12] image) => (float[N, 6, 12, 12] out) {{
        c1 = Conv <pads = [1, 1, 1, 1]> (image, w1, b1)
        r1 = {act_call}
        out = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)
    }}
    """
    w2 = _conv(r, 6, 8)
    w2[:, 2] /= outlier / 4  # channel 2 still matters downstream, without drowning the rest
    weights = {"w1": w1, "b1": b1, "w2": w2, "b2": r.normal(0, 0.1, 6).astype(np.float32)}
    if act == "PRelu":
        weights["slope"] = np.linspace(0.05, 0.4, 8).reshape(8, 1, 1).astype(np.float32)
    return _model(text, weights)


def residual_block(outlier: float = 50.0):
    """x = conv0(in); y = relu(x + conv2(relu(conv1(x)))); out = conv3(y).

    Channel 3 of the residual stream is ``outlier`` times wider (conv0 and conv2 filters
    3 scaled); conv1 and conv3 read it with weights divided by the same factor, so the
    function is an ordinary network with one wide stream channel.
    """
    r = np.random.default_rng(11)
    w0, b0 = _conv(r, 8, 3), r.normal(0, 0.1, 8).astype(np.float32)
    w2, b2 = _conv(r, 8, 8), r.normal(0, 0.1, 8).astype(np.float32)
    w1, w3 = _conv(r, 8, 8), _conv(r, 4, 8)
    for w, b in ((w0, b0), (w2, b2)):
        w[3] *= outlier
        b[3] *= outlier
    w1[:, 3] /= outlier / 4  # the stream channel still matters downstream
    w3[:, 3] /= outlier / 4
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    res (float[N, 3, 10, 10] image) => (float[N, 4, 10, 10] out) {
        x = Conv <pads = [1, 1, 1, 1]> (image, w0, b0)
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        r1 = Relu (c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)
        s = Add (x, c2)
        y = Relu (s)
        out = Conv <pads = [1, 1, 1, 1]> (y, w3, b3)
    }
    """
    return _model(text, {"w0": w0, "b0": b0, "w1": w1,
                         "b1": r.normal(0, 0.1, 8).astype(np.float32), "w2": w2, "b2": b2,
                         "w3": w3, "b3": r.normal(0, 0.1, 4).astype(np.float32)})


def layernorm_stream(outlier: float = 50.0):
    """Transformer-like: residual stream x + f(x) (channel 5 wide) read by LayerNormalization."""
    r = np.random.default_rng(12)
    w0, b0 = r.normal(0, 0.3, (16, 16)).astype(np.float32), r.normal(0, 0.1, 16).astype(np.float32)
    w2, b2 = r.normal(0, 0.2, (32, 16)).astype(np.float32), r.normal(0, 0.1, 16).astype(np.float32)
    w0[:, 5] *= outlier
    b0[5] *= outlier
    w2[:, 5] *= outlier
    b2[5] *= outlier
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    lns (float[N, S, 16] tokens) => (float[N, S, 16] out) {
        h0 = MatMul (tokens, w0)
        x = Add (h0, b0)
        h1 = MatMul (x, w1)
        hb1 = Add (h1, b1)
        a = Relu (hb1)
        h2 = MatMul (a, w2)
        f = Add (h2, b2)
        s = Add (x, f)
        n = LayerNormalization <axis = -1, epsilon = 0.00001> (s, g, be)
        out = MatMul (n, w3)
    }
    """
    return _model(text, {"w0": w0, "b0": b0, "w1": r.normal(0, 0.05, (16, 32)).astype(np.float32),
                         "b1": r.normal(0, 0.1, 32).astype(np.float32), "w2": w2, "b2": b2,
                         "g": np.ones(16, np.float32), "be": np.zeros(16, np.float32),
                         "w3": r.normal(0, 0.3, (16, 16)).astype(np.float32)})


def _feeds(m, n: int = 4):
    return [tm.sample_inputs(m.proto, n=4, seed=i) for i in range(n)]


def _errors(m, rep, feeds, per_channel: bool = True):
    scheme = QuantScheme(weight_per_channel=per_channel)
    before = quantized_error(m.proto, calibrate_and_quantize(m.proto, feeds, PLAN, scheme=scheme), feeds)
    after = quantized_error(m.proto, calibrate_and_quantize(rep.proto, feeds, PLAN, scheme=scheme), feeds)
    return before["rel_mse"], after["rel_mse"]


def _width(proto: onnx.ModelProto, tensor: str, axis: int) -> int:
    return load_proto(proto).value_shapes()[tensor][axis]


@pytest.mark.parametrize("act", ["Relu", "PRelu", "LeakyRelu"])
def test_split_conv_relu_conv_keeps_fp32_lowers_range_and_error(act):
    m = conv_relu_conv(act)
    feeds = _feeds(m)
    rep = split_channels(m, feeds, min_extra=4)
    fx = rep.effect_dict()
    assert fx["sites"] == 1.0 and fx["c1:extra_channels"] == 4.0
    assert check_function(m.proto, rep.proto, feeds) <= 1e-5
    onnx.checker.check_model(rep.proto, full_check=True)
    assert _width(rep.proto, "r1", 1) == 12  # 8 channels + 4 copies of channel 2
    split = {c.tensor: c for c in rep.changes}
    assert split["r1"].channels == (2,) and split["r1"].factors == (5.0,)
    assert fx["c1:range_after"] < 0.3 * fx["c1:range_before"]
    assert fx["c1:ratio_before"] > 4 and fx["c1:ratio_after"] < 0.3 * fx["c1:ratio_before"]
    before, after = _errors(m, rep, feeds)
    assert after < 0.5 * before, (before, after)
    if act == "PRelu":
        slope = numpy_helper.to_array(next(t for t in rep.proto.graph.initializer
                                           if t.name == "slope"))
        assert slope.shape == (12, 1, 1) and np.all(slope[8:] == slope[2])


def test_split_measured_range_matches_the_record():
    m = conv_relu_conv()
    feeds = _feeds(m)
    rep = split_channels(m, feeds, min_extra=4)
    sites, _ = find_sites(rep.model())
    new = channel_ranges(rep.model(), sites, feeds, None)
    assert new["r1"].size == 12
    assert np.isclose(new["r1"].max(), rep.effect_dict()["c1:range_after"], rtol=1e-5)
    assert np.allclose(new["r1"][8:], new["r1"][2], rtol=1e-5)  # equal parts of channel 2


def test_split_residual_stream_across_the_add():
    m = residual_block()
    feeds = _feeds(m)
    rep = split_channels(m, feeds, min_extra=4)
    assert check_function(m.proto, rep.proto, feeds) <= 1e-5
    onnx.checker.check_model(rep.proto, full_check=True)
    stream = {c.tensor: c for c in rep.changes}
    for t in ("x", "c2", "s", "y"):  # both Add operands and everything after it, identically
        assert stream[t].channels == (3,), t
        assert _width(rep.proto, t, 1) == 8 + stream[t].factors[0] - 1
    for w in ("w0", "w2", "w3"):
        assert w in stream
    w1 = numpy_helper.to_array(next(t for t in rep.proto.graph.initializer if t.name == "w1"))
    assert w1.shape[1] > 8 and np.all(w1[:, 8:] == w1[:, 3:4])  # exit rows: copies, undivided
    fx = rep.effect_dict()
    assert fx["x:range_after"] < 0.3 * fx["x:range_before"]
    before, after = _errors(m, rep, feeds)
    assert after < 0.5 * before, (before, after)


def test_layernorm_on_the_stream_stops_the_site():
    m = layernorm_stream()
    feeds = _feeds(m)
    rep = split_channels(m, feeds)
    assert rep.changes == () and rep.effect_dict()["sites"] == 0.0
    why = dict(rep.skipped)["x"]
    assert "LayerNormalization" in why and "mean and variance" in why
    assert check_function(m.proto, rep.proto, feeds) == 0.0


def test_no_outlier_nothing_split():
    m = load_proto(tm.conv_net())
    rep = split_channels(m, [tm.sample_inputs(m.proto, seed=i) for i in range(2)])
    assert rep.changes == ()
    why = dict(rep.skipped)
    assert "below 4" in why["c1"] and "nothing to gain" in why["c1"]
    assert "GlobalAveragePool" in why["c2"]  # r2 is pooled, then flattened


def test_plan_copies_spreads_ties_and_drops_useless_copies():
    norm = np.array([1.0, 1.0, 40.0, 1.0, 40.0, 1.0])
    k, why = plan_copies(norm, 4.0, allowed=5)
    assert why is None and list(k) == [1, 1, 3, 1, 3, 1]  # 4 copies; a 5th could not help
    k, why = plan_copies(norm, 4.0, allowed=1)
    assert list(k) == [1] * 6 and "cannot lower the widest" in why


def test_run_repairs_runs_split():
    from quantscope.calibrate.collect import calibrate
    from quantscope.model.groups import find_groups

    m = conv_relu_conv()
    feeds = _feeds(m)
    stats = calibrate(m, find_groups(m), iter(feeds))
    out = run_repairs(m, stats, PLAN, feeds, repairs=("split",))
    assert [r.name for r in out.records] == ["split"]
    assert "r1" in out.records[0].changed
    assert out.stats.tensors["r1"].channel_absmax.size == 10  # recalibrated, default budget


def test_equalize_leaves_the_residual_stream_to_split():
    from quantscope.calibrate.collect import calibrate
    from quantscope.model.groups import find_groups

    m = residual_block()
    feeds = _feeds(m)
    stats = calibrate(m, find_groups(m), iter(feeds))
    out = run_repairs(m, stats, PLAN, feeds, repairs=("equalize", "split"))
    eq, sp = out.records
    assert eq.changed and "w0" not in eq.changed  # CLE cannot touch a 2-reader stream
    assert {"x", "s", "w0"} <= set(sp.changed)
    effect = dict(sp.effect)
    assert effect["x:range_after"] < 0.6 * effect["x:range_before"]
    assert check_function(m.proto, out.proto, feeds) <= 1e-5
