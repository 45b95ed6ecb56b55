"""Fidelity that a scale mix or a one-value output cannot fool, and saturation counted on
values (issue: models beyond the zoo get a true verdict).

A YOLO-style output concatenating boxes (0-640 px) with class probabilities keeps a
whole-output cosine of 0.9999 while every probability rounds to 0 on its one 8-bit grid;
the per-channel figures and the verdict must say so. A ``[N]`` probability must be scored
by its error and decisions, never by the cosine of one-value rows (always 1).
"""

import numpy as np
import pytest
from outside_models import mixed_scale_detector, prepared, scalar_probability

from quantscope import stages
from quantscope.analyze import analyze
from quantscope.analyze.scoring import outputs_scorer
from quantscope.calibrate.saturation import saturation
from quantscope.emulate.evaluate import output_fidelity
from quantscope.model.groups import find_groups
from quantscope.numerics import qparams
from quantscope.types import Encodings, Outputs, Plan, Precision, Stats, TensorStats


def _setup(fixture, name, n=32, batch=8):
    return prepared(fixture, name, n, batch)


@pytest.fixture(scope="module")
def detector():
    return _setup(mixed_scale_detector, "mixed_scale_detector")


def _not_like(res):
    return [n for n in res["notes"] if n.startswith("NOT LIKE FP32")]


def test_mixed_scale_output_at_a8_w8_is_not_like_fp32(detector):
    model, data, stats = detector
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8))
    out = res["outputs"]["detections"]
    assert out["cosine_mean"] > 0.999  # the trap: the whole output looks fine
    assert out["channel_axis"] == 1 and out["collapsed_channels"] == 3  # the 3 class rows
    assert out["channel_worst"] in (4, 5, 6) and out["sqnr_db_channel_min"] < 1
    m = res["metrics"]
    assert m["collapsed_channels"] == 3 and m["cosine_channel_min"] < 0.5
    assert m["sqnr_db_channel_min"] < 1 < 40 < m["sqnr_db"]
    assert _not_like(res) and "'detections'" in _not_like(res)[0]
    said = [n for n in res["notes"] if "channel" in n and "of axis 1" in n]
    assert said and "quantizes to 0" in said[0] and "one grid spans 0" in said[0]
    assert "NOT LIKE FP32" in stages.format_result(res)


def test_mixed_scale_output_at_16_bit_is_like_fp32(detector):
    model, data, stats = detector
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A16_W8))
    assert res["metrics"]["collapsed_channels"] == 0
    assert res["metrics"]["sqnr_db_channel_min"] > 20
    assert not _not_like(res)


def _outputs(name, arrays, batch):
    return Outputs(names=(name,), batches=tuple((a[i:i + batch],) for a in [arrays]
                                                for i in range(0, len(a), batch)))


def test_channel_figures_stream_and_follow_the_given_axis():
    r = np.random.default_rng(0)
    ref = np.concatenate([r.uniform(0, 600, (40, 4, 16)), r.uniform(0.01, 0.6, (40, 3, 16))],
                         axis=1).astype(np.float32)
    test = np.round(ref / 2.4) * np.float32(2.4)  # one 8-bit-like grid over 0..612
    whole = output_fidelity(_outputs("d", ref, 40), _outputs("d", test, 40))
    parts = output_fidelity(_outputs("d", ref, 7), _outputs("d", test, 7))
    assert whole.tables["d"]["collapsed_channels"] == 3
    assert parts.tables["d"]["collapsed_channels"] == 3
    for key in ("sqnr_db_channel_min", "cosine_channel_min"):
        assert parts.values[key] == pytest.approx(whole.values[key], abs=1e-9)
    per_anchor = output_fidelity(_outputs("d", ref, 8), _outputs("d", test, 8),
                                 channel_axes={"d": 2})
    assert per_anchor.tables["d"]["channel_axis"] == 2  # per anchor: no row collapses
    assert per_anchor.tables["d"]["collapsed_channels"] == 0


def test_an_axis_that_grows_between_batches_is_read_as_positions():
    """(h47) An axis longer in a later batch holds positions (tokens, frames), not
    channels: no channel figure along it, a note; a loss is still judged, by the
    whole-output figures (before: channel 3 or 4, seen in the second batch only)."""
    r = np.random.default_rng(1)
    a, b = r.normal(0, 1, (4, 3, 8)).astype(np.float32), r.normal(0, 1, (4, 5, 8)).astype(np.float32)
    ref = Outputs(names=("t",), batches=((a,), (b,)))
    test = Outputs(names=("t",), batches=((a,), (b * 0 + b[:, :1],)))  # positions 1-4 of b lost
    m = output_fidelity(ref, test)
    assert "channel_worst" not in m.tables["t"] and m.tables["t"]["positions_axis"] == 1
    assert any("axis 1 varies by sample (3 to 5 positions over 8 samples" in n for n in m.notes)
    assert m.values["cosine_mean"] < 0.9 and _not_like({"notes": m.notes})


def test_scalar_probability_is_scored_by_error_and_decisions_not_cosine():
    model, data, stats = _setup(scalar_probability, "scalar_probability")
    for p in (Precision.A8_W8, Precision.A16_W8):
        res = stages.evaluate_plan(model, data, stats, Plan.uniform(p))
        t = res["outputs"]["speech"]
        assert not any(k.startswith("cosine") for k in (*t, *res["metrics"]))
        assert 0 < t["abs_err_mean"] <= t["abs_err_max"] < 0.1
        assert t["decision_threshold"] == 0.5 and t["decision_agreement@0.5"] == t["decision_agreement"]
        assert res["metrics"]["abs_err_max"] == t["abs_err_max"] and "sqnr_db" in res["metrics"]
        assert any("one value per sample" in n and "threshold 0.5" in n for n in res["notes"])
        stages.format_result(res)


def test_scalar_decisions_lost_are_not_like_fp32():
    r = np.random.default_rng(2)
    ref = r.uniform(0.3, 0.7, 64).astype(np.float32)  # [N]
    test = np.where(np.arange(64) % 4 == 0, 1 - ref, ref).astype(np.float32)  # 1 in 4 flipped
    m = output_fidelity(_outputs("p", ref, 16), _outputs("p", test, 16))
    assert m.tables["p"]["decision_agreement"] == pytest.approx(
        np.mean((ref > 0.5) == (test > 0.5)))
    assert m.values["decision_agreement"] < 0.95 and _not_like({"notes": m.notes})
    assert "cosine_mean" not in m.values
    logits = (ref[:, None] - 0.5) * 20  # [N, 1], outside [0, 1]: decided at 0
    m2 = output_fidelity(_outputs("l", logits, 16), _outputs("l", logits + 0.01, 16))
    assert m2.tables["l"]["decision_threshold"] == 0.0
    assert m2.tables["l"]["decision_agreement@0"] == 1.0 and not _not_like({"notes": m2.notes})


def test_analysis_scorer_sees_the_concat_that_collapses_the_classes(detector):
    model, data, stats = detector
    an = analyze(model, find_groups(model), stats, data.evaluation, scorer=outputs_scorer(),
                 proxy_fraction=1.0, recover_top=(1,))
    assert an.baselines["a8_w8"]["sqnr_db_channel_min"] < 1
    assert an.baselines["a16_w16"]["sqnr_db_channel_min"] > 20
    sens = {s.group: s for s in an.sensitivity}
    concat = next(g for g in sens if g.startswith("Concat"))
    # enable-one: the Concat alone at a8_w8 erases the class rows; disable-one: lifting it
    # restores them, while the whole-output SQNR barely moves
    assert sens[concat].enable_one["sqnr_db_channel_min"] < 1 < 40 < sens[concat].enable_one["sqnr_db"]
    assert sens[concat].disable_one["sqnr_db_channel_min"] > 20
    others = [s.disable_one["sqnr_db_channel_min"] for g, s in sens.items() if g != concat]
    assert max(others) < 1


def _stats_of(name, x):
    amax = float(np.abs(x).max())
    r = 2.0 ** np.ceil(np.log2(amax))
    hist, _ = np.histogram(x, bins=2048, range=(-r, r))
    return Stats(tensors={name: TensorStats(name, float(x.min()), float(x.max()), x.size,
                                            hist.astype(np.int64), float(r), np.zeros(1), 0)})


def test_saturation_at_16_bit_counts_values_not_bin_centres():
    enc = qparams(-0.9, 50.0, 16, signed=False, symmetric=False)
    rlo = float(enc.range()[0])
    r = np.random.default_rng(3)
    inside = r.uniform(rlo + 1e-3, -0.876, 2000)  # in the bin [-1, -0.875]: centre below rlo
    x = np.concatenate([inside, r.uniform(0, 100, 8000)]).astype(np.float32)
    assert x.min() > rlo and -0.9375 < rlo - float(enc.scale) / 2  # the old bin-centre trap
    rows = saturation(_stats_of("t", x), Encodings(activations={"t": enc}, weights={}))
    (row,) = rows
    assert row.below == 0.0  # the data minimum lies inside the range
    truth = float(np.mean(x > float(enc.range()[1]) + float(enc.scale) / 2))
    assert truth - 0.002 <= row.above <= truth  # exact to one bin (0.125 wide: ~0.1 %)
    below = np.concatenate([x, np.full(50, -0.99, np.float32)])
    (row,) = saturation(_stats_of("t", below), Encodings(activations={"t": enc}, weights={}))
    assert 0 < row.below <= 50 / below.size  # a lower bound, never more than the truth


def test_a_one_value_output_beside_a_tensor_one_still_counts_in_the_worst_sqnr():
    r = np.random.default_rng(4)
    prob, feat = r.uniform(0, 1, (32, 1)).astype(np.float32), r.normal(0, 1, (32, 8)).astype(np.float32)
    ref = Outputs(names=("prob", "feat"), batches=((prob, feat),))
    test = Outputs(names=("prob", "feat"), batches=((prob + 0.05, feat + 1e-4),))
    m = output_fidelity(ref, test)
    assert "cosine_mean" not in m.tables["prob"] and m.tables["feat"]["cosine_mean"] > 0.99
    assert m.values["sqnr_db"] == m.tables["prob"]["sqnr_db"] < m.tables["feat"]["sqnr_db"]
    assert any("worst output's (lowest SQNR: 'prob')" in n for n in m.notes)
    quiet = output_fidelity(ref, test, judge=False)  # a task judges: no fidelity lines
    assert quiet.values == m.values and not any("one value per sample" in n for n in quiet.notes)
