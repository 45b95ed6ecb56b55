"""Sequence length is a decision: one search per allowed length, the best kept."""

import numpy as np
import pytest

from quantscope import stages
from quantscope.model.groups import find_groups
from quantscope.targets import load_target
from quantscope.types import Dataset, Precision, Sensitivity


@pytest.mark.slow
def test_shorter_length_unblocks_promotions_on_hailo10h(minilm_l3_model):
    model = minilm_l3_model
    groups = find_groups(model)
    # every group gains the same when promoted: the plan is decided by legality and cost
    sens = Sensitivity(metric="sqnr_db", base=10.0, gains=tuple(
        (g.name, ((Precision.A16_W16, 1.0), (Precision.A16_W8, 0.5))) for g in groups.groups))
    target = load_target("hailo10h")
    options = stages.PlanOptions(max_cost=10.0)
    out = stages.plan_lengths(model, sens, target, options, (128, 256))
    rows = {r["seq_len"]: r for r in out.pareto["seq_lens"]}
    assert set(rows) == {128, 256}
    # super-defuse binds at 256 ([256, 384] = 98,304 values), not at 128
    assert rows[128]["promoted"] > rows[256]["promoted"]
    assert out.pareto["seq_len"] == 128
    assert "seq 128:" in stages.format_search(out.pareto)


def test_fit_fraction_from_the_data_token_lengths():
    lengths = np.array([10, 100, 130, 300])
    data = Dataset(name="t", calibration=(), evaluation=(), token_lengths=lengths)
    assert stages._fit(data, 128) == {"texts_fit": 0.5}
    assert stages._fit(None, 128) == {}


@pytest.fixture(scope="module")
def minilm_l3_model():
    from quantscope.model.load import load
    from quantscope.types import QuantscopeError
    from quantscope.zoo.text import find_minilm_l3_onnx

    try:
        return load(find_minilm_l3_onnx())
    except QuantscopeError as exc:
        pytest.skip(str(exc))


def test_best_length_reads_the_metric_direction_and_ranks_no_figure_last():
    """Before, the highest figure won whatever the direction, and a NaN compared as
    neither better nor worse (the first length met could win with it)."""
    from quantscope.stages.plan import best_length

    assert best_length({128: 0.9, 256: 0.8}, higher_is_better=True) == 128
    assert best_length({128: 0.9, 256: 0.8}, higher_is_better=False) == 256
    assert best_length({128: float("nan"), 256: 0.1}, higher_is_better=True) == 256
    assert best_length({128: 0.1, 256: float("nan")}, higher_is_better=False) == 128
    assert best_length({128: None, 256: 0.1}, higher_is_better=True) == 256
    assert best_length({128: 0.5, 256: 0.5}, higher_is_better=False) == 256  # tie: longer
