import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
import tiny_models as tm
from onnx import numpy_helper

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.repair.smooth import smooth_outliers
from quantscope.repair.verify import calibrate_and_quantize, check_function, quantized_error
from quantscope.types import Plan, Precision


def _set(proto, name, fn):
    for t in proto.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(fn(numpy_helper.to_array(t).copy()), name))
    return proto


def _huge_gamma(a):
    a[[3, 17]] = 40.0  # a few LayerNorm channels 40x the others: per-tensor grid wasted
    return a


def _prepared(proto):
    m = load_proto(proto)
    feeds = [tm.sample_inputs(m.proto, seed=i) for i in range(6)]
    return m, feeds, calibrate(m, find_groups(m), feeds)


def test_smoothing_keeps_fp32_and_cuts_quantized_error():
    m, feeds, stats = _prepared(_set(tm.layernorm_block(), "g1", _huge_gamma))
    rep = smooth_outliers(m, stats, feeds)
    assert check_function(m.proto, rep.proto, feeds) <= 1e-5
    assert {c.tensor for c in rep.changes} == {"g1", "be1", "w1"}
    plan = Plan.uniform(Precision.A8_W8)
    before = quantized_error(m.proto, calibrate_and_quantize(m.proto, feeds, plan), feeds)["rel_mse"]
    after = quantized_error(m.proto, calibrate_and_quantize(rep.proto, feeds, plan), feeds)["rel_mse"]
    assert after < 0.6 * before, (before, after)
    names = [n.name for n in m.graph.node]
    assert [n.name for n in rep.proto.graph.node] == names  # names kept, no new nodes


def test_non_linear_consumer_is_skipped_with_reason_unless_rescaled():
    m, feeds, stats = _prepared(tm.layernorm_block())
    rep = smooth_outliers(m, stats, feeds)
    assert dict(rep.skipped)["gelu"].startswith("produced by Mul")
    # the last LayerNorm feeds only the graph output: not a candidate at all
    assert all(c.tensor != "g2" for c in rep.changes)


def test_rescale_others_inserts_one_mul_and_keeps_fp32():
    # embeddings-style: the LayerNorm output feeds a MatMul AND a residual Add
    proto = _set(tm.layernorm_block(), "g1", _huge_gamma)
    for node in proto.graph.node:
        if node.output[0] == "res":
            node.input[0] = "n1"
    m, feeds, stats = _prepared(proto)
    skipped = smooth_outliers(m, stats, feeds)
    assert "not linear ops" in dict(skipped.skipped)["n1"]
    rep = smooth_outliers(m, stats, feeds, rescale_others=True)
    assert len(rep.proto.graph.node) == len(m.graph.node) + 1
    assert check_function(m.proto, rep.proto, feeds) <= 1e-5
    assert any(c.kind == "insert" for c in rep.changes)


def test_check_function_rejects_a_broken_transform():
    m, feeds, _ = _prepared(tm.layernorm_block())
    broken = _set(load_proto(tm.layernorm_block()).proto, "w1", lambda a: a * 1.001)
    try:
        check_function(m.proto, broken, feeds)
    except Exception as exc:  # RepairError
        assert "changed the FP32 outputs" in str(exc)
    else:
        raise AssertionError("a changed function passed the check")
    assert np.isfinite(check_function(m.proto, m.proto, feeds))
