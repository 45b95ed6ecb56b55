"""Evaluation data outside the calibrated range is said per tensor, never silent."""

import numpy as np
import tiny_models as tm

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision


def _data(scale):
    x = np.random.default_rng(0).normal(0, scale, (32, 3, 16, 16)).astype(np.float32)
    return tuple({"image": x[i:i + 8]} for i in range(0, 32, 8))


def test_held_out_data_beyond_the_calibrated_range_is_reported():
    model = load_proto(tm.conv_net(), "conv")
    calib = Dataset(name="c", calibration=_data(1.0), evaluation=_data(1.0))
    stats = stages.calibrate_model(model, calib)
    same = stages.evaluate_plan(model, calib, stats, Plan.uniform(Precision.A16_W16))
    assert same["saturation"]["tensors"] == [] and "saturation_note" not in same
    wide = Dataset(name="w", calibration=_data(1.0), evaluation=_data(3.0))
    res = stages.evaluate_plan(model, wide, stats, Plan.uniform(Precision.A16_W16))
    clipped = {c["tensor"]: c for c in res["saturation"]["tensors"]}
    assert "image" in clipped and clipped["image"]["below"] + clipped["image"]["above"] > 0.1
    assert res["saturation"]["rows"] == 32
    assert "saturation:" in res["saturation_note"]
    assert "saturation:" in stages.format_result(res)


def test_the_checks_statistics_are_calibrated_once_per_model_and_rows():
    from quantscope.analyze import saturation_rows as sr
    from quantscope.model.load import with_initializers

    model = load_proto(tm.conv_net(), "conv")
    rows = list(_data(1.0))
    first = sr._saturation_stats(model, rows)
    again = sr._saturation_stats(load_proto(tm.conv_net(), "conv again"), rows)
    assert again[0] is first[0] and again[1] == 32  # the same graph on the same rows
    other_rows = sr._saturation_stats(model, list(_data(3.0)))
    assert other_rows[0] is not first[0]
    assert other_rows[0].tensors["image"].max > first[0].tensors["image"].max
    w = next(t.name for t in model.graph.initializer if len(t.dims) == 4)
    changed = with_initializers(load_proto(tm.conv_net(), "conv"),
                                {w: model.initializer_array(w) * 2}, "doubled")
    other_model = sr._saturation_stats(changed, rows)
    assert other_model[0] is not first[0]  # other weights: calibrated again
    fresh = sr.calibrate(model, sr.find_groups(model), rows)
    for name, ts in first[0].tensors.items():  # what was kept is what a calibration gives
        assert (ts.min, ts.max) == (fresh.tensors[name].min, fresh.tensors[name].max)
