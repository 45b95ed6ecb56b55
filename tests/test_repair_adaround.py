import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np
import tiny_models as tm

from quantscope.model.load import load_proto
from quantscope.numerics import weight_encoding
from quantscope.repair.adaround import adaround, optimise_rounding
from quantscope.repair.verify import quantize_model, quantized_error
from quantscope.types import Plan, Precision


def _correlated(model, seed, n=64):
    """Strongly correlated inputs: where nearest rounding is far from output-optimal."""
    r = np.random.default_rng(seed)
    mix = np.random.default_rng(7).normal(0, 1, (4, 32))
    return {"x": (r.normal(0, 1, (n, 4)) @ mix + 0.1 * r.normal(0, 1, (n, 32))).astype(np.float32)}


def test_rounding_beats_nearest_on_the_layer_objective():
    r = np.random.default_rng(0)
    x = r.normal(0, 1, (512, 4)) @ r.normal(0, 1, (4, 24))
    w = r.normal(0, 0.2, (24, 16))
    s = np.abs(w).max(axis=0, keepdims=True) / 7  # 4-bit grid
    h = x.T @ x / len(x)
    q = optimise_rounding(w, s, -8, 7, h, iterations=300)
    near = np.clip(np.round(w / s), -8, 7)

    def err(c):
        e = s * c - w
        return float(np.sum(e * (h @ e)))

    assert err(q) < 0.8 * err(near)


def test_adaround_weights_lie_on_the_grid_and_cut_the_error():
    m = load_proto(tm.residual_add())
    feeds = [_correlated(m, i) for i in range(4)]
    held_out = [_correlated(m, 100 + i) for i in range(2)]
    plan = Plan.uniform(Precision.A8_W4)
    rep = adaround(m, feeds, plan, iterations=300)
    assert rep.effect_dict()["on_grid"] == 1.0
    w = rep.model().initializer_array("w1")
    enc = weight_encoding(w, 4, axis=1, signed=True, symmetric=True)
    assert np.allclose(w / enc.scale, np.round(w / enc.scale), atol=1e-3)
    before = quantized_error(m.proto, quantize_model(m.proto, feeds, plan), held_out)
    after = quantized_error(m.proto, quantize_model(rep.proto, feeds, plan), held_out)
    assert after["rel_mse"] < before["rel_mse"], (before, after)
