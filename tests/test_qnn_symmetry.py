"""The QNN encodings file says of each grid what its offset and scale say.

``is_symmetric`` / ``is_sym`` used to come from the target's scheme flags and the file's
``quantizer_args.is_symmetric`` and ``per_channel_quantization`` were always true: a
profile with asymmetric or per-tensor weights got a file claiming symmetric per-channel
weights. AIMET calls an encoding symmetric when it is centred on 0 (offset
``-2**(bits-1)``: int8 symmetric -128) and its ``quantizer_args.is_symmetric`` is the
weights' default (its config's ``defaults.params``); on qnn_htp_v73 the uint8/uint16
activations are asymmetric (offset = -zero_point) and the int8 weights symmetric per
channel. Each entry here is checked against its own offsets, on real encodings.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import quantscope as qs
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.export.qnn_encodings import export_qnn_encodings
from quantscope.model.groups import find_groups
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

QNN_TOML = Path(__file__).parents[1] / "src/quantscope/targets/qnn_htp_v73.toml"


@pytest.fixture(scope="module")
def tiny():
    r = np.random.default_rng(3)
    w = numpy_helper.from_array(r.normal(0.3, 0.5, (8, 4)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4])], [w])
    model = qs.load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]),
                          "tiny")
    x = (np.random.default_rng(4).normal(0, 1, (256, 8)) + 1.5).astype(np.float32)
    data = qs.Dataset(name="x", calibration=({"x": x},), evaluation=({"x": x},))
    return model, qs.calibrate_model(model, data)


def _doc(model, stats, target: str, version: str):
    plan = Plan(default=Precision.A8_W8, overrides=(("mm", Precision.A16_W8),), target=target)
    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    return export_qnn_encodings(plan, groups, q.encodings, version=version)


def _entries(doc) -> list[tuple[str, str, bool, int, list[int]]]:
    """(section, name, the flag written, bits, offsets) of every integer entry."""
    out = []
    for section in ("activation_encodings", "param_encodings"):
        body = doc[section]
        if doc["version"] == "1.0.0":
            out += [(section, e["name"], e["is_sym"], e["bw"], e["offset"])
                    for e in body if e["dtype"] == "INT"]
        else:
            for name, es in body.items():
                if es[0]["dtype"] == "int":
                    flags = {e["is_symmetric"] for e in es}
                    assert len(flags) == 1 and flags <= {"True", "False"}, flags
                    out.append((section, name, flags == {"True"}, es[0]["bitwidth"],
                                [e["offset"] for e in es]))
    return out


def _flag(doc, key):
    value = doc["quantizer_args"][key]
    return value == "True" if doc["version"] == "0.6.1" else value


@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
def test_each_flag_agrees_with_its_offsets_on_qnn_htp(tiny, version):
    doc = _doc(*tiny, "qnn_htp_v73", version)
    entries = _entries(doc)
    for section, name, flag, bits, offsets in entries:
        centred = all(o == -(1 << (bits - 1)) for o in offsets)
        assert flag is centred, (section, name, flag, offsets)
    by_name = {e[1]: e for e in entries}
    assert by_name["W"][2] is True and len(by_name["W"][4]) == 4  # int8 symmetric per channel
    assert by_name["x"][2] is False and by_name["y"][2] is False  # uint offset -zero_point
    assert _flag(doc, "is_symmetric") is True and _flag(doc, "per_channel_quantization") is True


@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
def test_asymmetric_per_tensor_weights_are_not_called_symmetric(tiny, tmp_path, version):
    path = tmp_path / "asym.toml"
    text = (QNN_TOML.read_text().replace('name = "qnn_htp_v73"', 'name = "asym_npu"', 1)
            .replace("weight_signed = true", "weight_signed = false", 1)
            .replace("weight_symmetric = true", "weight_symmetric = false", 1)
            .replace("weight_per_channel = true", "weight_per_channel = false", 1))
    path.write_text(text)
    target = load_target(path)
    doc = _doc(*tiny, target.name, version)
    by_name = {e[1]: e for e in _entries(doc)}
    _, _, flag, bits, offsets = by_name["W"]
    assert len(offsets) == 1 and offsets[0] != -(1 << (bits - 1)) and flag is False
    assert _flag(doc, "is_symmetric") is False
    assert _flag(doc, "per_channel_quantization") is False
