"""QNN encodings and the host I/O snippet on tiny models beyond the built-ins.

* A model input that only float groups read stays float in the emulation (``encode``
  quantizes an input at the most bits of the groups reading it); the QNN export used to
  take the plan's default for every input and then stop with "no activation encoding for
  'x': re-run encode with this plan" (nothing the user could re-run), and with a float
  default it wrote a float entry for an input the emulation quantized.
* The snippet's ``from_device_*`` read against ONNX Runtime's own QuantizeLinear /
  DequantizeLinear at the exported scale and offset, at the ends of the range and beyond
  (saturation), for every precision, unsigned (every built-in target) and signed (a user
  profile with ``act_signed = true``), including a uint16 buffer misread as int16.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import quantscope as qs
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.export.device_io import python_snippet
from quantscope.export.qnn_encodings import export_qnn_encodings, parse_qnn_encodings
from quantscope.model.groups import find_groups
from quantscope.types import Plan, Precision

QNN_TOML = Path(__file__).parents[1] / "src/quantscope/targets/qnn_htp_v73.toml"


def _model() -> qs.Model:
    r = np.random.default_rng(3)
    w = numpy_helper.from_array(r.normal(0, 0.5, (8, 4)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Tanh", ["h"], ["y"], name="tanh")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])], [w])
    return qs.load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                         "tiny")


@pytest.fixture(scope="module")
def tiny():
    model = _model()
    x = np.random.default_rng(4).normal(0, 1, (256, 8)).astype(np.float32)
    data = qs.Dataset(name="x", calibration=({"x": x},), evaluation=({"x": x},))
    return model, qs.calibrate_model(model, data)


def _export(model, stats, plan, version="1.0.0"):
    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    doc = export_qnn_encodings(plan, groups, q.encodings, version=version)
    return q, parse_qnn_encodings(doc)


@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
def test_an_input_only_float_groups_read_is_exported_float(tiny, version):
    model, stats = tiny
    plan = Plan(default=Precision.A8_W8, overrides=(("mm", Precision.FLOAT),),
                target="qnn_htp_v73")
    q, parsed = _export(model, stats, plan, version)
    assert "x" not in q.encodings.activations  # the emulation leaves it float
    assert parsed["activations"]["x"] is None and parsed["params"]["W"] is None


def test_an_input_a_quantized_group_reads_is_exported_at_its_bits(tiny):
    model, stats = tiny
    plan = Plan(default=Precision.FLOAT, overrides=(("mm", Precision.A16_W8),),
                target="qnn_htp_v73")
    q, parsed = _export(model, stats, plan)
    enc = parsed["activations"]["x"]
    assert enc is not None and enc.bits == 16 == q.encodings.activations["x"].bits
    np.testing.assert_allclose(enc.range(), q.encodings.activations["x"].range(), rtol=1e-6)


def _ort_q_dq(values, scale, zero_point, dtype):
    """ORT's QuantizeLinear codes of ``values`` and its DequantizeLinear of them."""
    zp = numpy_helper.from_array(np.array(zero_point, dtype), "zp")
    sc = numpy_helper.from_array(np.array(scale, np.float32), "s")
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["v", "s", "zp"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"])], "qdq",
        [helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, [len(values)])],
        [helper.make_tensor_value_info("q", elem, [len(values)]),
         helper.make_tensor_value_info("d", onnx.TensorProto.FLOAT, [len(values)])], [sc, zp])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"v": values.astype(np.float32)})


def _signed_target(tmp_path) -> str:
    path = tmp_path / "signed.toml"
    text = QNN_TOML.read_text().replace("act_signed = false", "act_signed = true", 1)
    path.write_text(text.replace('name = "qnn_htp_v73"', 'name = "signed_npu"', 1))
    return str(path)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("precision", ["a8_w8", "a16_w8", "a16_w16"])
def test_the_snippet_reads_ort_codes_at_the_exported_scale_and_offset(
        tiny, tmp_path, precision, signed):
    model, stats = tiny
    target = _signed_target(tmp_path) if signed else "qnn_htp_v73"
    plan = Plan(default=Precision(precision), target=target)
    q, parsed = _export(model, stats, plan)
    row = next(r for r in qs.device_io_rows(model, stats, plan) if r["tensor"] == "y")
    bits = Precision(precision).act_bits
    assert row["bits"] == bits and row["signed"] is signed
    # the QNN file's grid (unsigned domain, zero_point = -offset) is the io row's grid
    exported = parsed["activations"]["y"]
    shift = (1 << (bits - 1)) if signed else 0
    assert float(exported.scale) == pytest.approx(row["scale"], rel=1e-7)
    assert int(exported.zero_point) == row["zero_point"] + shift
    lo, hi = row["min"], row["max"]
    step = row["scale"]
    values = np.array([lo - 10 * step, lo, lo + step / 3, 0.0, hi - step / 3, hi,
                       hi + 10 * step], np.float32)
    codes, ort_real = _ort_q_dq(values, row["scale"], row["zero_point"], row["stored_type"])
    assert codes.dtype == np.dtype(row["stored_type"])
    assert codes.min() == row["q_min"] and codes.max() == row["q_max"]  # both ends reached
    space: dict = {}
    exec(python_snippet([row]), space)  # the snippet exactly as the user pastes it
    read = space["from_device_y"](codes)
    np.testing.assert_allclose(read, ort_real, rtol=1e-6, atol=1e-7 * step)
    inside = (values >= lo) & (values <= hi)
    assert np.all(np.abs(read[inside] - values[inside]) <= step / 2 + 1e-6 * abs(hi))
    if not signed:  # the classic misread: the unsigned buffer read as signed
        misread = codes.view(np.dtype(row["stored_type"].lstrip("u")))
        np.testing.assert_allclose(space["from_device_y"](misread), ort_real, rtol=1e-6,
                                   atol=1e-7 * step)
    # the input's to_device gives ORT's QuantizeLinear codes, saturated at both ends
    xrow = next(r for r in qs.device_io_rows(model, stats, plan) if r["tensor"] == "x")
    exec(python_snippet([xrow]), space)
    xs = np.array([xrow["min"] - 1, xrow["min"], 0.0, xrow["max"], xrow["max"] + 1], np.float32)
    want, _ = _ort_q_dq(xs, xrow["scale"], xrow["zero_point"], xrow["stored_type"])
    np.testing.assert_array_equal(space["to_device_x"](xs), want)


def test_an_output_the_plan_leaves_float_is_said_by_io(tmp_path, capsys):
    """Before: ``io`` said only "no quantized model inputs or outputs"; which tensors the
    host feeds and reads as float, with no scale, was in no line, JSON or snippet."""
    import json

    from quantscope.cli import main

    model, data, stats = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "s.npz"
    onnx.save(_model().proto, model)
    np.save(data, np.random.default_rng(7).normal(0, 1, (64, 8)).astype(np.float32))
    assert main(["calibrate", str(model), "--data", str(data), "--out", str(stats)]) == 0
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"default": "a8_w8", "target": "qnn_htp_v73",
                                "groups": {"mm": "float"}}))
    j, py = tmp_path / "io.json", tmp_path / "io.py"
    capsys.readouterr()
    assert main(["io", str(model), "--stats", str(stats), "--plan", str(plan), "--json", str(j),
                 "--snippet", str(py)]) == 0
    out = capsys.readouterr().out
    assert "output y: float: the plan leaves it unquantized" in out
    assert "input  x: float: the plan leaves it unquantized" in out
    assert json.loads(j.read_text())["float_io"] == [{"role": "input", "tensor": "x"},
                                                     {"role": "output", "tensor": "y"}]
    assert "# output y: float" in py.read_text()


def test_the_run_verdict_names_the_float_io():
    from quantscope.report.summary import _compile_line

    v = {"compiler_files": ["repaired.onnx", "qnn.encodings.json", "quantized.qdq.onnx"],
         "io": [], "io_float": [{"role": "output", "tensor": "y"}]}
    assert "device I/O (io_snippet.py): output y float (unquantized)" in _compile_line(v, None)
