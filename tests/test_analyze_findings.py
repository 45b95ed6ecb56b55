"""Outliers and degenerate weights: planted cases are found exactly; clean models report nothing."""

import numpy as np
import pytest
import tiny_models as tm

from quantscope.analyze import find_outliers, find_weight_issues
from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto

MLP = """
<ir_version: 9, opset_import: ["" : 17]>
mlp (float[N, S, 32] x) => (float[N, S, 16] y) {
    h = MatMul (x, w1)
    hb = Add (h, b1)
    a = Relu (hb)
    y = MatMul (a, w2)
}
"""

FOUR = """
<ir_version: 9, opset_import: ["" : 17]>
four (float[N, 16] x) => (float[N, 16] y) {
    a = MatMul (x, wa)
    b = MatMul (a, wb)
    c = MatMul (b, wc)
    y = MatMul (c, wd)
}
"""


def _prepared(proto, n_batches=4):
    model = load_proto(proto, "planted")
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(n_batches)]
    return model, groups, calibrate(model, groups, feeds)


def _mlp(outlier_scale=1.0):
    r = np.random.default_rng(0)
    w1 = r.normal(0, 0.2, (32, 32)).astype(np.float32)
    w1[:, 5] *= outlier_scale
    return tm._with_weights(
        MLP,
        {
            "w1": w1,
            "b1": np.zeros(32, np.float32),
            "w2": r.normal(0, 0.2, (32, 16)).astype(np.float32),
        },
    )


def test_planted_outlier_channel_is_found_with_its_index():
    model, groups, stats = _prepared(_mlp(outlier_scale=60.0))
    found = find_outliers(stats, groups)
    assert [(o.tensor, o.kind, o.channels) for o in found] == [("a", "channels", (5,))]
    assert found[0].ratio > 20 and found[0].remedies


@pytest.mark.parametrize("name", list(tm.ALL))
def test_clean_models_report_nothing(name):
    model, groups, stats = _prepared(tm.ALL[name]())
    assert find_outliers(stats, groups) == ()
    assert find_weight_issues(model, groups) == ()


def test_unplanted_mlp_reports_nothing():
    model, groups, stats = _prepared(_mlp())
    assert find_outliers(stats, groups) == ()
    assert find_weight_issues(model, groups) == ()


def _degenerate():
    r = np.random.default_rng(1)
    scale = r.uniform(0.001, 0.01, 16).astype(np.float32)
    codes = r.integers(-127, 128, (16, 16))
    codes[0, :] = 127  # every channel reaches the grid end, so min/max scale == scale
    wa = (codes * scale).astype(np.float32)  # an already-quantized export: on an 8-bit grid
    wb = r.normal(0, 0.3, (16, 16)).astype(np.float32)
    wb[:, 3] = 0.0  # a dead output channel
    wc = r.normal(0, 0.3, (16, 16)).astype(np.float32)
    wc[:, 7] *= 1e-5  # a channel 1000x below the others
    wd = np.full((16, 16), 0.25, np.float32)  # constant
    return tm._with_weights(FOUR, {"wa": wa, "wb": wb, "wc": wc, "wd": wd})


def test_planted_degenerate_weights_are_found_exactly():
    model, groups, _ = _prepared(_degenerate(), n_batches=1)
    found = {(w.weight, w.kind, w.channels) for w in find_weight_issues(model, groups)}
    assert found == {
        ("wa", "a16_low_byte_zero", ()),
        ("wb", "dead_channels", (3,)),
        ("wb", "zero_scale", (3,)),
        ("wc", "tiny_channels", (7,)),
        ("wd", "constant", ()),
    }


def test_mask_range_is_reported():
    model, groups, stats = _prepared(_mlp())
    ts = stats.tensors["a"]
    import dataclasses

    bad = dataclasses.replace(
        stats, tensors={**stats.tensors, "a": dataclasses.replace(ts, min=-3.4e38)}
    )
    found = find_outliers(bad, groups)
    assert [(o.tensor, o.kind) for o in found] == [("a", "mask_range")]
