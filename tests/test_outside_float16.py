"""A float16 model (``model.half()`` exported, float16 input and weights): emulated as its
float32 form (issue: models beyond the zoo). Every command that quantized it stopped with
"ONNX Runtime cannot run this model (... QuantizeLinear bound to different types
(tensor(float16) and tensor(float)) ...): check that every op is supported", which blamed
the runtime."""

from __future__ import annotations

import numpy as np
import onnx
from tiny_models import _rng

from quantscope.cli import main
from quantscope.model.load import load_proto


def half_conv(seed: int = 5) -> onnx.ModelProto:
    """``x [N, 3, 8, 8]`` float16 -> Conv -> Relu -> Cast to float32 and back to float16
    -> pool -> Gemm -> ``y [N, 4]`` float16: weights, input and a Cast in float16."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    half (float16[N, 3, 8, 8] x) => (float16[N, 4] y) {
        c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        a = Relu (c)
        f32 = Cast <to = 1> (a)
        back = Cast <to = 10> (f32)
        p = GlobalAveragePool (back)
        f = Flatten (p)
        y = Gemm <transB = 1> (f, w2, b2)
    }
    """
    proto = onnx.parser.parse_model(text)
    weights = {"w1": r.normal(0, 0.4, (8, 3, 3, 3)), "b1": r.normal(0, 0.1, 8),
               "w2": r.normal(0, 0.4, (4, 8)), "b2": np.zeros(4)}
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(v.astype(np.float16), k)
                                   for k, v in weights.items())
    return proto


def test_the_float32_form_computes_the_same():
    from quantscope.emulate.session import make_session

    model = load_proto(half_conv(), "half")
    assert any("computes in float16" in n for n in model.notes)
    assert model.value_types()["x"] == onnx.TensorProto.FLOAT
    assert not any(a.name == "to" and a.i == onnx.TensorProto.FLOAT16
                   for n in model.graph.node for a in n.attribute)
    x = np.random.default_rng(0).random((4, 3, 8, 8)).astype(np.float16)
    ref = make_session(half_conv(), optimize=True).run(None, {"x": x})[0]
    got = make_session(model.proto).run(None, {"x": x.astype(np.float32)})[0]
    np.testing.assert_allclose(got, ref.astype(np.float32), atol=2e-2)


def _evaluated(tmp_path, capsys, proto, name, dtype) -> str:
    """``calibrate`` then ``evaluate --precision a8_w8`` of ``proto`` (saved as ``name``) on
    16 random images of ``dtype``: the console."""
    onnx.save(proto, tmp_path / name)
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).random((16, 3, 8, 8)).astype(dtype))
    m, x, s = (str(tmp_path / f) for f in (name, "x.npz", "s.npz"))
    assert main(["calibrate", m, "--data", x, "--out", s]) == 0
    assert main(["evaluate", m, "--data", x, "--stats", s, "--precision", "a8_w8"]) == 0
    return capsys.readouterr().out


def test_commands_run_on_a_float16_model(tmp_path, capsys):
    out = _evaluated(tmp_path, capsys, half_conv(), "half.onnx", np.float16)
    assert "the model computes in float16: emulated as its float32 form" in out
    assert "coverage: 2 weight(s)" in out


def test_analyze_says_the_float32_form(tmp_path, capsys):
    """``analyze`` printed its findings on the float32 form without saying so (neither
    its console nor ``analysis.json`` named float16)."""
    import json

    onnx.save(half_conv(), tmp_path / "half.onnx")
    np.savez(tmp_path / "x.npz",
             x=np.random.default_rng(0).random((16, 3, 8, 8)).astype(np.float16))
    m, x, s, a = (str(tmp_path / f) for f in ("half.onnx", "x.npz", "s.npz", "a.json"))
    assert main(["calibrate", m, "--data", x, "--out", s]) == 0
    assert main(["analyze", m, "--data", x, "--stats", s, "--target", "hailo8",
                 "--out", a]) == 0
    out = capsys.readouterr().out
    assert "note: the model computes in float16: emulated as its float32 form" in out
    assert any("computes in float16" in n for n in json.loads(open(a).read())["notes"])


def half_conv_bf16() -> onnx.ModelProto:
    """:func:`half_conv` in bfloat16 (a ``model.bfloat16()`` export): weights, input,
    output and the Cast back, all bfloat16."""
    import ml_dtypes

    proto = half_conv()
    bf16 = onnx.TensorProto.BFLOAT16
    for t in proto.graph.initializer:
        arr = onnx.numpy_helper.to_array(t).astype(np.float32).astype(ml_dtypes.bfloat16)
        t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    for v in [*proto.graph.input, *proto.graph.output]:
        v.type.tensor_type.elem_type = bf16
    for n in proto.graph.node:
        for a in n.attribute:
            if a.name == "to" and a.i == onnx.TensorProto.FLOAT16:
                a.i = bf16
    return proto


def test_a_bfloat16_model_is_its_float32_form(tmp_path, capsys):
    """A bfloat16 model was refused as having "nothing to quantize: no float input and
    no float tensor on the data path": bfloat16 is widened as float16 is."""
    model = load_proto(half_conv_bf16(), "bf16")
    assert any("computes in bfloat16" in n for n in model.notes)
    assert model.value_types()["x"] == onnx.TensorProto.FLOAT
    # the widened weights are the bfloat16 ones exactly
    w1 = onnx.numpy_helper.to_array(next(t for t in half_conv_bf16().graph.initializer
                                         if t.name == "w1")).astype(np.float32)
    np.testing.assert_array_equal(model.initializer_array("w1"), w1)
    out = _evaluated(tmp_path, capsys, half_conv_bf16(), "bf16.onnx", np.float32)
    assert "the model computes in bfloat16: emulated as its float32 form" in out
    assert "coverage: 2 weight(s)" in out


def test_repair_says_its_model_is_the_float32_form(tmp_path, capsys):
    """``repair`` on a float16 model wrote a float32 "repaired FP32 model for the vendor
    compiler" without saying the model it was given computes in float16."""
    onnx.save(half_conv(), tmp_path / "half.onnx")
    np.savez(tmp_path / "x.npz",
             x=np.random.default_rng(0).random((16, 3, 8, 8)).astype(np.float16))
    m, x, s = (str(tmp_path / f) for f in ("half.onnx", "x.npz", "s.npz"))
    assert main(["calibrate", m, "--data", x, "--out", s]) == 0
    capsys.readouterr()
    assert main(["repair", m, "--data", x, "--stats", s, "--precision", "a8_w8",
                 "--no-evaluate", "--repairs", "bias", "--out-model", str(tmp_path / "r.onnx"),
                 "--out-stats", str(tmp_path / "r.npz"), "--out-plan",
                 str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: the model computes in float16: emulated as its float32 form")
    assert onnx.load(tmp_path / "r.onnx").graph.input[0].type.tensor_type.elem_type == \
        onnx.TensorProto.FLOAT


def test_export_says_its_file_is_of_the_float32_form(tmp_path, capsys):
    """``export --format qdq`` of a float16 model wrote a float32 QDQ model in silence."""
    import json

    onnx.save(half_conv(), tmp_path / "half.onnx")
    np.savez(tmp_path / "x.npz",
             x=np.random.default_rng(0).random((16, 3, 8, 8)).astype(np.float16))
    m, x, s = (str(tmp_path / f) for f in ("half.onnx", "x.npz", "s.npz"))
    assert main(["calibrate", m, "--data", x, "--out", s]) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "quantscope.plan/1", "default": "a8_w8",
                                "target": "hailo8", "groups": {}}))
    for argv in (["export", "--model", m, "--stats", s, str(plan), "--format", "qdq",
                  "--out", str(tmp_path / "q.onnx")],
                 ["export-qdq", m, "--stats", s, "--plan", str(plan),
                  "--out", str(tmp_path / "q2.onnx")]):
        capsys.readouterr()
        assert main(argv) == 0
        assert "note: the model computes in float16: emulated as its float32 form" in \
            capsys.readouterr().out
