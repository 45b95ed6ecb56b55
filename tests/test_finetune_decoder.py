"""finetune on decoder phase graphs: RoPE's Cos/Sin, Split and RMSNormalization converted,
the FP32 teacher and the QDQ student equal to ONNX Runtime on the tiny decoder's prefill
and decode graphs (the student computes what the emulation measures)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from decoder_tiny import phase_graphs, run_graph
from onnx import TensorProto, helper

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.qdq import quantize_model
from quantscope.finetune.apply import fp32_weights
from quantscope.finetune.graph import to_torch
from quantscope.model.groups import find_groups
from quantscope.types import Plan, Precision, QuantScheme

HAILO = QuantScheme(weight_signed=False)


def _out(module, feeds):
    with torch.no_grad():
        outs, _ = module({k: torch.from_numpy(v) for k, v in feeds.items()})
    return dict(zip(module.output_names, (o.numpy() for o in outs), strict=True))


def _feeds(graphs, seed=0):
    """A prefill window and the decode step after it on the prefill's cache."""
    ids = np.random.default_rng(seed).integers(0, 61, 12).astype(np.int64)
    out = run_graph(graphs["prefill"].proto, {"input_ids": ids[None, :11]})
    past = {k.replace("present.", "past."): v for k, v in out.items() if k != "logits"}
    return {"prefill": {"input_ids": ids[None, :11]},
            "decode": {"input_ids": ids[None, 11:12], **past}}


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_the_fp32_decoder_converts_to_what_ort_computes(phase):
    graphs = phase_graphs()
    feeds = _feeds(graphs)[phase]
    ours = _out(to_torch(graphs[phase].proto), feeds)
    ref = run_graph(graphs[phase].proto, feeds)
    assert set(ours) == set(ref) and any(k.startswith("present.") for k in ref)
    for k, v in ref.items():
        np.testing.assert_allclose(ours[k], v, rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("precision", [Precision.A8_W8, Precision.A16_W8])
def test_the_qdq_decoder_student_equals_the_emulation(phase, precision):
    graphs = phase_graphs()
    model = graphs[phase]
    feeds = [_feeds(graphs, seed)[phase] for seed in range(4)]
    stats = calibrate(model, find_groups(model), feeds)
    q = quantize_model(model, stats, Plan.uniform(precision), scheme=HAILO)
    student = to_torch(q.proto, float_weights=fp32_weights(model), scheme=q.encodings.scheme)
    assert student.act_quants and student.weight_quants
    fp32 = run_graph(model.proto, feeds[0])["logits"]
    ref = run_graph(q.proto, feeds[0])["logits"]
    assert np.abs(ref - fp32).max() > 1e-3  # the grids change the logits ...
    ours = _out(student, feeds[0])["logits"]
    if precision is Precision.A8_W8:  # ... and the student computes the same codes
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    else:  # a 16-bit step is fine enough that an ulp of RMSNorm's float32 (torch's sum
        # order, not ORT's) moves a rare value by one step, which the layers after carry
        assert np.abs(ours - ref).max() < 0.05 * np.abs(ref - fp32).max()  # 1 % seen
        assert (ours.argmax(-1) == ref.argmax(-1)).all()


def _one(op, inputs, outputs, inits=(), **attrs):
    node = helper.make_node(op, [i[0] for i in inputs] + [n for n, _ in inits],
                            [o[0] for o in outputs], **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [helper.make_tensor(n, TensorProto.INT64 if v.dtype == np.int64 else TensorProto.FLOAT,
                            v.shape, v.reshape(-1).tolist()) for n, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("how", ["num_outputs", "sizes"])
def test_split_by_count_and_by_sizes(how):
    x = np.random.default_rng(1).standard_normal((2, 7, 3)).astype(np.float32)
    if how == "num_outputs":  # 7 in 3 parts: 3, 3, 1 (the last one smaller)
        model = _one("Split", [("x", [2, 7, 3])], [("a", None), ("b", None), ("c", None)],
                     axis=1, num_outputs=3)
    else:
        model = _one("Split", [("x", [2, 7, 3])], [("a", None), ("b", None)],
                     [("s", np.array([5, 2], np.int64))], axis=1)
    ours, ref = _out(to_torch(model), {"x": x}), run_graph(model, {"x": x})
    assert [v.shape for v in ours.values()] == [v.shape for v in ref.values()]
    for k, v in ref.items():
        np.testing.assert_array_equal(ours[k], v)


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization_over_the_axes_from_its_axis(axis):
    x = np.random.default_rng(2).standard_normal((2, 3, 8)).astype(np.float32) * 4
    shape = [8] if axis == -1 else [3, 8]
    g = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    model = _one("RMSNormalization", [("x", [2, 3, 8])], [("y", [2, 3, 8])], [("g", g)],
                 axis=axis, epsilon=1e-3)
    np.testing.assert_allclose(_out(to_torch(model), {"x": x})["y"],
                               run_graph(model, {"x": x})["y"], rtol=1e-5, atol=1e-6)
