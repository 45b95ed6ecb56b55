"""Attention masks in other forms than the HF additive one, found by their symptom.

masked_fill (``Where``) with -1e9, a constant causal mask of -1e4, and a relative
position bias added before the padding mask: each leaves a constant far below the rest
in the calibrated statistics; encode sets the range from the rest and says so.
"""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode, sentinel_floor
from quantscope.emulate.qdq import build_qdq
from quantscope.emulate.session import make_session
from quantscope.model.groups import find_groups, find_mask_adds
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision, QuantScheme

HEAD = """
<ir_version: 9, opset_import: ["" : 17]>
masked (float[N, 6, 8] x, int64[N, 6] attention_mask) => (float[N, 6, 8] y) {
    q = MatMul (x, wq)
    k = MatMul (x, wk)
    kt = Transpose <perm = [0, 2, 1]> (k)
    s = MatMul (q, kt)
    ax = Constant <value = int64[1] {1}> ()
    m1 = Unsqueeze (attention_mask, ax)
    keep = Cast <to = 9> (m1)
"""
FORMS = {
    "where_fill": "    sm = Where (keep, s, fill)\n",
    "causal_const": "    sm = Add (s, causal)\n",
    "bias_then_fill": "    sb = Add (s, bias)\n    sm = Where (keep, sb, fill)\n",
}
TAIL = """
    p = Softmax <axis = -1> (sm)
    y = MatMul (p, x)
}
"""


def _model(form):
    proto = parser.parse_model(HEAD + FORMS[form] + TAIL)
    rng = np.random.default_rng(0)
    causal = np.triu(np.full((6, 6), -1e4, np.float32), 1)
    proto.graph.initializer.extend([
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "wq"),
        numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "wk"),
        numpy_helper.from_array(np.array(-1e9, np.float32), "fill"),
        numpy_helper.from_array(causal, "causal"),
        numpy_helper.from_array(rng.normal(0, 0.3, (6, 6)).astype(np.float32), "bias"),
    ])
    onnx.checker.check_model(proto)
    return load_proto(proto, form)


def _feeds(seed):
    rng = np.random.default_rng(seed)
    mask = np.ones((4, 6), np.int64)
    mask[1:, 4:] = 0
    return {"x": rng.normal(0, 1, (4, 6, 8)).astype(np.float32), "attention_mask": mask}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_mask_constant_is_kept_out_of_the_range(form):
    model = _model(form)
    assert not find_mask_adds(model)  # not the HF pattern: found by the symptom alone
    groups = find_groups(model)
    stats = calibrate(model, groups, [_feeds(i) for i in range(4)])
    floored = [t for t, ts in stats.tensors.items() if sentinel_floor(ts)]
    assert floored
    plan = Plan.uniform(Precision.A8_W8)
    enc = encode(model, groups, stats, plan, scheme=QuantScheme())
    assert any("constant far below the rest" in n for n in enc.notes)
    feeds = _feeds(9)
    ref = make_session(model.proto).run(None, feeds)[0]
    out = make_session(build_qdq(model, enc)).run(None, feeds)[0]
    cos = (ref * out).sum() / np.linalg.norm(ref) / np.linalg.norm(out)
    assert cos > 0.98
    # without the handling (min/max of the calibration, constant included) it breaks
    naive = dict(enc.activations)
    for t in floored:
        ts = stats.tensors[t]
        naive[t] = encode(model, groups, stats, plan, scheme=QuantScheme()).activations[t]
        from quantscope.numerics import qparams
        naive[t] = qparams(ts.min, ts.max, 8, signed=False, symmetric=False)
    bad = type(enc)(activations=naive, weights=enc.weights, scheme=enc.scheme)
    out_bad = make_session(build_qdq(model, bad)).run(None, feeds)[0]
    cos_bad = (ref * out_bad).sum() / np.linalg.norm(ref) / np.linalg.norm(out_bad)
    assert cos_bad < cos - 0.05


def test_relu_zeros_are_not_a_mask():
    from quantscope.types import TensorStats

    ts = TensorStats("r", 0.0, 5.0, 1000, np.zeros(8, np.int64), 8.0, np.zeros(1, np.float32),
                     -1, bulk_min=1e-3, floor_count=500)
    assert not sentinel_floor(ts)


def _observed(*batches: np.ndarray):
    from quantscope.calibrate.observe import Observer

    obs = Observer("t")
    for b in batches:
        obs.update(b)
    return obs.freeze()


def test_a_fill_is_one_value_and_a_real_outlier_channel_is_not():
    """A mask fill (scores plus -1e4, float32's minimum, or -1e9 rounded in float32) is
    nearly one value far below the rest: its range is the rest's. A real channel far below
    the rest (values -559 .. -355 beside a rest in -2 .. 1.7) spreads: it keeps its range
    (it was clipped to -2 as if it were a fill, and its output read 0 dB)."""
    r = np.random.default_rng(0)
    scores = r.uniform(-30, 30, (64, 16)).astype(np.float32)
    masked = np.zeros((64, 16), bool)
    masked[:, 12:] = True
    for fill in (-1e4, float(np.finfo(np.float32).min), -1e9):
        x = np.where(masked, scores + np.float32(fill), scores).astype(np.float32)
        ts = _observed(x[:32], x[32:])
        assert sentinel_floor(ts), fill
        assert ts.floor_max is not None and ts.floor_max < ts.bulk_min
    rest = r.uniform(-2.0, 1.7, (64, 8)).astype(np.float32)
    rest[:, 3] = r.uniform(-559.6, -355.0, 64)  # one output channel, far below the rest
    ts = _observed(rest[:32], rest[32:])
    assert ts.min < ts.bulk_min - 100 * 3.7  # far enough below to pass the gap rule alone
    assert not sentinel_floor(ts)
    # a stats file written before floor_max was recorded: read by the gap rule alone
    assert sentinel_floor(dataclasses.replace(ts, floor_max=None))
