import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
import pytest
import tiny_models as tm
from onnx import numpy_helper

from quantscope.model.load import load_proto
from quantscope.repair.bias_correction import correct_biases
from quantscope.repair.verify import calibrate_and_quantize, quantized_error
from quantscope.types import Plan, Precision


def _systematic(proto):
    """w2 0.45 of a grid step above its per-channel grid: rounding shifts every output."""
    r = np.random.default_rng(0)
    q = r.integers(-20, 20, (64, 32))
    w = ((q + 0.45) * 0.01).astype(np.float32)
    w[0, :] = 1.27  # sets each column's scale to exactly 0.01
    for t in proto.graph.initializer:
        if t.name == "w2":
            t.CopyFrom(numpy_helper.from_array(w, "w2"))
    return load_proto(proto)


@pytest.mark.parametrize("mode", ["weight", "output"])
def test_bias_correction_removes_a_systematic_shift(mode):
    m = _systematic(tm.residual_add())
    feeds = [tm.sample_inputs(m.proto, seed=i) for i in range(6)]
    held_out = [tm.sample_inputs(m.proto, seed=100 + i) for i in range(3)]
    plan = Plan.uniform(Precision.A8_W8)
    rep = correct_biases(m, feeds, plan, mode=mode)
    assert {c.tensor for c in rep.changes} == {"b1", "b2"}
    before = quantized_error(m.proto, calibrate_and_quantize(m.proto, feeds, plan), held_out)
    after = quantized_error(m.proto, calibrate_and_quantize(rep.proto, feeds, plan), held_out)
    assert after["rel_mse"] < 0.2 * before["rel_mse"], (before, after)


def test_a_bias_is_created_when_missing():
    m = load_proto(tm.attention())  # MatMuls without bias
    feeds = [tm.sample_inputs(m.proto, seed=i) for i in range(3)]
    rep = correct_biases(m, feeds, Plan.uniform(Precision.A8_W4))
    assert rep.changes and all(c.kind == "new" for c in rep.changes)
    out = rep.model()
    assert set(out.output_names()) == set(m.output_names())
    assert sum(n.op_type == "Add" for n in out.graph.node) == len(rep.changes)
