"""Repairs are scored on rows they were not fitted on."""

import numpy as np
import pytest

from quantscope import stages
from quantscope.types import Dataset, QuantscopeError


def _batches(n, rows=4):
    rng = np.random.default_rng(0)
    return tuple({"x": rng.normal(0, 1, (rows, 3)).astype(np.float32)} for _ in range(n))


def test_tensor_data_is_split_when_evaluation_is_calibration():
    b = _batches(4)
    feeds, data, note = stages.held_out(Dataset("t", b, b), None)
    fitted = {id(f) for f in feeds}
    assert feeds and data.evaluation and not fitted & {id(e) for e in data.evaluation}
    assert "held out" in note


def test_one_batch_is_split_by_rows_and_one_sample_is_refused():
    b = _batches(1, rows=6)
    feeds, data, _ = stages.held_out(Dataset("t", b, b), None)
    assert len(feeds[0]["x"]) == 3 and len(data.evaluation[0]["x"]) == 3
    one = _batches(1, rows=1)
    with pytest.raises(QuantscopeError, match="one sample"):
        stages.held_out(Dataset("t", one, one), None)


def test_disjoint_data_is_left_alone_and_fitting_uses_only_calibration_batches():
    c, e = _batches(3), _batches(2)
    feeds, data, note = stages.held_out(Dataset("t", c, e), 2)
    assert note is None and data.evaluation is e and len(feeds) == 2
    # fitting on 2 of 4 shared batches scores on the other 2
    b = _batches(4)
    feeds, data, note = stages.held_out(Dataset("t", b, b), 2)
    assert len(data.evaluation) == 2 and "held-out" in note
