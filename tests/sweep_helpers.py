"""Helpers the sweep tests share: a tiny model made ready for a sweep, two sweeps compared."""

from __future__ import annotations

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto


def prepared(proto: onnx.ModelProto, name: str, rows: int, width: int, batches: int = 2):
    """(model, groups, stats, feeds): ``proto`` loaded, its groups, calibrated on
    ``batches`` seeded normal batches of ``x [rows, width]``."""
    model = load_proto(proto, name)
    groups = find_groups(model)
    feeds = [{"x": np.random.default_rng(i).normal(0, 1, (rows, width)).astype(np.float32)}
             for i in range(batches)]
    return model, groups, calibrate(model, groups, feeds), feeds


def assert_same_sweep(a, b) -> None:
    """Two sweep results equal bit for bit: candidates, rows, the chains' rows, noises."""
    assert [c.group for c in a.candidates] == [c.group for c in b.candidates]
    for x, y in zip(a.rows, b.rows, strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.ref_rows, b.ref_rows)
    np.testing.assert_array_equal(a.low_rows, b.low_rows)
    assert a.noise_cumulative == b.noise_cumulative
    assert a.noise_isolated == b.noise_isolated
