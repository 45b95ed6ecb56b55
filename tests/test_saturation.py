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
