import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
import pytest
import tiny_models as tm
from onnx import numpy_helper

from quantscope.model.load import load_proto
from quantscope.repair.equalize import equalize_pairs
from quantscope.repair.verify import calibrate_and_quantize, check_function, quantized_error
from quantscope.types import Plan, Precision, QuantScheme


def _mismatched(act: str = "Relu"):
    """conv_net with channels 0, 5 of conv1 30x wider and channel 2 50x narrower (conv2 compensates)."""
    proto = tm.conv_net()
    f = np.ones(8)
    f[[0, 5]], f[2] = 30.0, 0.02
    for t in proto.graph.initializer:
        a = numpy_helper.to_array(t).copy()
        if t.name in ("w1", "b1"):
            a = (a.T * f.reshape(-1) if a.ndim == 1 else a * f.reshape(-1, 1, 1, 1)).astype(
                np.float32
            )
        elif t.name == "w2":
            a = (a / f.reshape(1, -1, 1, 1)).astype(np.float32)
        else:
            continue
        t.CopyFrom(numpy_helper.from_array(a, t.name))
    if act == "PRelu":
        node = next(n for n in proto.graph.node if n.output[0] == "r1")
        node.op_type = "PRelu"
        node.input.append("slope")
        proto.graph.initializer.append(
            numpy_helper.from_array(
                np.linspace(0.05, 0.4, 8).reshape(8, 1, 1).astype(np.float32), "slope"
            )
        )
    return load_proto(proto)


@pytest.mark.parametrize("act", ["Relu", "PRelu"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_equalisation_keeps_fp32_and_cuts_quantized_error(act, per_channel):
    m = _mismatched(act)
    feeds = [tm.sample_inputs(m.proto, seed=i) for i in range(6)]
    rep = equalize_pairs(m, feeds)
    assert rep.effect_dict()["pairs"] == 1.0
    assert check_function(m.proto, rep.proto, feeds) <= 1e-5
    plan, scheme = Plan.uniform(Precision.A8_W8), QuantScheme(weight_per_channel=per_channel)
    before = quantized_error(m.proto, calibrate_and_quantize(m.proto, feeds, plan, scheme=scheme), feeds)
    after = quantized_error(m.proto, calibrate_and_quantize(rep.proto, feeds, plan, scheme=scheme), feeds)
    assert after["rel_mse"] < 0.1 * before["rel_mse"], (before, after)


def test_non_homogeneous_activation_stops_a_pair():
    proto = tm.conv_net()
    next(n for n in proto.graph.node if n.output[0] == "r1").op_type = "Sigmoid"
    m = load_proto(proto)
    rep = equalize_pairs(m, [tm.sample_inputs(m.proto)])
    assert rep.effect_dict()["pairs"] == 0.0
    assert "not positive-homogeneous" in dict(rep.skipped)["Conv_0"]
