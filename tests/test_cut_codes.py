"""The activation cache keeps a quantized tensor crossing a cut as its integer codes (the
segment session's QuantizeLinear output), only where they give ONNX Runtime's
DequantizeLinear output back bit for bit (quantscope.analyze.cut_codes)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from incremental_models import encoder, feeds
from onnx import TensorProto, helper, numpy_helper

from quantscope.analyze.cut_codes import Coded, coded, decode, expose_codes
from quantscope.analyze.incremental import IncrementalConfig, IncrementalRunner
from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Encoding, Plan, Precision, QuantScheme


def _ort_qdq(x: np.ndarray, enc: Encoding) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """ONNX Runtime's QuantizeLinear codes and DequantizeLinear output of ``x`` on ``enc``
    (the graph's codes exposed by :func:`expose_codes`)."""
    dtype = {(8, True): TensorProto.INT8, (8, False): TensorProto.UINT8,
             (16, True): TensorProto.INT16, (16, False): TensorProto.UINT16}[
        (enc.bits, enc.signed)]
    np_zp = helper.tensor_dtype_to_np_dtype(dtype)
    axis = [] if enc.axis is None else [helper.make_attribute("axis", enc.axis)]
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_quantized"])
    dq = helper.make_node("DequantizeLinear", ["x_quantized", "s", "z"], ["y"])
    q.attribute.extend(axis)
    dq.attribute.extend(axis)
    graph = helper.make_graph(
        [q, dq], "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
        [numpy_helper.from_array(np.asarray(enc.scale, np.float32), "s"),
         numpy_helper.from_array(np.asarray(enc.zero_point).astype(np_zp), "z")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    names = expose_codes(proto, ["y"])
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    y, codes = sess.run(["y", names["y"]], {"x": x})
    return codes, y, names


@pytest.mark.parametrize(("bits", "signed", "zp"), [
    (8, False, 131), (8, True, 0), (16, False, 30000), (16, True, -7)])
def test_the_codes_give_onnx_runtimes_dequantized_tensor_back(bits, signed, zp):
    enc = Encoding(np.array(0.0123, np.float32), np.array(zp), bits, signed)
    x = np.random.default_rng(bits).normal(0, 200, size=(3, 7, 5)).astype(np.float32)
    codes, y, names = _ort_qdq(x, enc)
    assert names == {"y": "x_quantized"}
    c = coded(codes, enc, y.ndim)
    assert c is not None and c.nbytes < y.nbytes
    back = decode(c)
    assert back.dtype == np.float32 and np.array_equal(back, y)  # bit for bit


def test_per_channel_codes_along_the_encodings_axis():
    enc = Encoding(np.array([0.5, 0.01, 3.0], np.float32), np.array([0, 3, -2]), 8, True,
                   axis=1)
    x = np.random.default_rng(0).normal(0, 50, size=(2, 3, 4)).astype(np.float32)
    codes, y, _ = _ort_qdq(x, enc)
    assert np.array_equal(decode(coded(codes, enc, y.ndim)), y)


def test_what_has_no_codes_stays_float():
    enc = Encoding(np.array(0.1, np.float32), np.array(0), 8, True)
    y = np.ones((2, 3), np.float32)
    assert decode(y) is y
    assert coded(np.ones(3, np.int8), None, 1) is None  # no grid
    assert coded(np.ones(3, np.float32), enc, 1) is None  # no codes
    assert coded(np.ones(3, np.int32), enc, 1) is None  # wider than 16 bits
    per_channel = Encoding(np.array([0.1, 0.2], np.float32), np.array([0, 0]), 8, True, axis=5)
    assert coded(np.ones((2, 2), np.int8), per_channel, 2) is None  # an axis it lacks
    # only a DequantizeLinear of a QuantizeLinear's output is exposed
    relu = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([relu], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    proto = helper.make_model(graph)
    assert expose_codes(proto, ["y", "x"]) == {} and len(proto.graph.output) == 1


def test_the_runner_reads_the_same_tensors_from_codes_and_holds_more_cuts():
    model = load_proto(encoder(layers=3), "tiny-encoder")
    batches = [feeds(n=3, s=5 + i, seed=i) for i in range(3)]
    stats = calibrate(model, find_groups(model), batches)
    names = find_groups(model).names()
    plans = [Plan.uniform(Precision.A8_W8), *(Plan(default=Precision.A8_W8, overrides=(
        (names[i], Precision.A16_W16),)) for i in (len(names) - 2, 3, len(names) // 2))]
    runs = {}
    for codes in (False, True):
        r = IncrementalRunner(model, stats, batches, scheme=QuantScheme(),
                              config=IncrementalConfig(cut_codes=codes))
        runs[codes] = ([r.outputs(p) for p in plans], r)
    for a, b in zip(runs[False][0], runs[True][0], strict=True):
        for x, y in zip(a.batches, b.batches, strict=True):
            for u, v in zip(x, y, strict=True):
                assert np.array_equal(u, v)  # bit for bit
    plain, coded = runs[False][1], runs[True][1]
    kept = [v for e in coded._cache.entries.values() for part in e.parts for v in part.values()]
    assert any(isinstance(v, Coded) for v in kept)
    assert not any(isinstance(v, Coded) for e in plain._cache.entries.values()
                   for part in e.parts for v in part.values())
    # the same cuts take less room
    assert coded._cache.held < plain._cache.held
    assert coded.counts.segments_run <= plain.counts.segments_run
