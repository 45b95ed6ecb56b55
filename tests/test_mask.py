"""The additive attention-mask pitfall: detected, and kept out of the quantized range."""

import numpy as np
import onnx
from onnx import numpy_helper, parser

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import MASK_MARGIN, encode
from quantscope.emulate.qdq import build_qdq
from quantscope.emulate.session import make_session
from quantscope.model.groups import find_groups, find_mask_adds
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision, QuantScheme

TEXT = """
<ir_version: 9, opset_import: ["" : 17]>
masked (float[N, S, 8] x, int64[N, S] attention_mask) => (float[N, S, 8] y) {
    q = MatMul (x, wq)
    k = MatMul (x, wk)
    kt = Transpose <perm = [0, 2, 1]> (k)
    s = MatMul (q, kt)
    ax = Constant <value = int64[1] {1}> ()
    m1 = Unsqueeze (attention_mask, ax)
    mf = Cast <to = 1> (m1)
    inv = Sub (one, mf)
    neg = Mul (inv, big)
    sm = Add (s, neg)
    p = Softmax <axis = -1> (sm)
    y = MatMul (p, x)
}
"""


def _model():
    proto = parser.parse_model(TEXT)
    rng = np.random.default_rng(0)
    proto.graph.initializer.extend([
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "wq"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "wk"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "big"),
    ])
    onnx.checker.check_model(proto)
    return load_proto(proto, "masked")


def _feeds(seed):
    rng = np.random.default_rng(seed)
    mask = np.ones((4, 6), np.int64)
    mask[1:, 4:] = 0  # padded positions
    return {"x": rng.normal(0, 1, (4, 6, 8)).astype(np.float32), "attention_mask": mask}


def test_mask_add_is_detected_and_its_range_excludes_the_constant():
    model = _model()
    adds = find_mask_adds(model)
    assert [a.output for a in adds] == ["sm"] and adds[0].scores == "s"
    groups = find_groups(model)
    stats = calibrate(model, groups, [_feeds(i) for i in range(4)])
    assert stats.tensors["sm"].min < -1e30  # what a naive calibration would use
    enc = encode(model, groups, stats, Plan.uniform(Precision.A8_W8), scheme=QuantScheme())
    lo, hi = enc.activations["sm"].range()
    assert stats.tensors["s"].min - MASK_MARGIN - 1 < lo < stats.tensors["s"].min
    assert any("attention mask" in n for n in enc.notes)


def test_masked_positions_still_get_zero_weight_at_8_bit():
    model = _model()
    groups = find_groups(model)
    stats = calibrate(model, groups, [_feeds(i) for i in range(4)])
    plan = Plan.uniform(Precision.A8_W8)
    qdq = build_qdq(model, encode(model, groups, stats, plan, scheme=QuantScheme()))
    feeds = _feeds(9)
    ref = make_session(model.proto).run(None, feeds)[0]
    out = make_session(qdq).run(None, feeds)[0]
    cos = (ref * out).sum() / np.linalg.norm(ref) / np.linalg.norm(out)
    assert cos > 0.98
