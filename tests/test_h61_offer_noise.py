"""The out-of-sample check of repair offers weighs each figure by its noise (h61).

h57's rule dropped an offer whose mean gain over the 2 folds was below zero in the offer's
metric. Where that metric is the worst channel (``sqnr_db_channel_min``, a minimum over
the output's columns), its mean over two folds of a few faces each is mostly noise: on
mobileface (``faces:raw``, 7 + 7 faces) ``ranges`` measured -0.25 dB +- 3.4 dB and was
dropped, while the pooled SQNR of the same outputs gained +0.34 dB +- 1.1 dB and ``ranges``
fitted on all the chips gained +1.55 dB on the held-out people. An offer is now judged by
the pooled figure's mean (the point rule, as before, where the offer's metric is itself
pooled: the token classifier's equalize, +0.2 and -4.5 dB, stays dropped), and a worst
channel counts against it only when below zero beyond its noise; the noise (a paired
jackknife per fold over the held half's units: a person's chips together since h66) is
said in the note and the JSON.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_h40_tfjs_human import _nhwc_embedder

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.numerics import t_quantile
from quantscope.pipeline.data import open_run_data
from quantscope.plan.joint import Offer
from quantscope.plan.start import RepairOption
from quantscope.stages.offer_holdout import Figure, check_offer, stands
from quantscope.targets import load_target
from quantscope.tasks.db_noise import (
    Parts,
    gain_interval,
    group_parts,
    mean_interval,
    pooled_db,
)
from quantscope.types import Dataset, Sensitivity


def _fit_half(tmp_path: Path) -> tuple[Dataset, object]:
    """``run EMBEDDER --data faces``'s fit half (5 and 7 people, 7 + 7 faces a fold)."""
    model = load_proto(_nhwc_embedder(0.0), "emb")
    rd = open_run_data(model, "faces", eval_data=None, pairs=None, tokenizer=None,
                       folder=tmp_path)
    return rd.fit, model


def _check(tmp_path: Path, name: str) -> tuple[Offer, dict]:
    """The offer of ``name`` judged out of sample on the worst channel's metric."""
    data, model = _fit_half(tmp_path)
    stats = calibrate(model, find_groups(model), iter(data.calibration))
    option = RepairOption(name, gain=0.5, cost=0.0, reason="measured")
    offer = Offer((option,), ({"name": name, "gain": 0.5},), ())
    sens = Sensitivity.from_gains("sqnr_db_channel_min", 30.0, {})
    out = check_offer(offer, model, data, stats, sens, load_target("hailo8l"),
                      list(data.calibration))
    return out, {r["name"]: r for r in out.measured}[name]["out_of_sample"]


def test_a_worst_channel_below_zero_within_its_noise_no_longer_drops_the_offer(tmp_path):
    """bias on the tiny embedder: worst channel -0.24, +0.20 dB (mean -0.02 dB, noise
    about 0.5 dB), pooled SQNR -0.08, +0.23 dB (mean +0.07 dB): h57 dropped it."""
    out, oos = _check(tmp_path, "bias")
    assert oos["metric"] == "sqnr_db_channel_min" and oos["mean"] < 0  # what h57 read
    # the units: the held half's people (h66; h61 counted its 7 + 7 photos)
    assert oos["noise"]["upper"] > 0 and oos["noise"]["unit"] == "people"
    assert oos["noise"]["n"] == [7, 5] and oos["noise"]["half_width"] > -oos["mean"]
    pooled = oos["pooled"]
    assert pooled["metric"] == oos["judged_by"] == "sqnr_db" and pooled["mean"] >= 0
    assert oos["offered"] is True and [o.name for o in out.options] == ["bias"]
    note = next(n for n in out.notes if n.startswith("repair bias"))
    assert note.startswith("repair bias: offered, not worse out of sample: +"), note
    assert "(sqnr_db, mean of 2 folds by person: 5 and 7 people:" in note
    assert "the worst channel's -0.0" in note and "judged against its noise" in note
    assert "one-sided 95% jackknife over 7 + 5 people" in note


def test_a_pooled_figure_worse_out_of_sample_drops_the_offer(tmp_path):
    """ranges on the tiny embedder: worst channel -0.38, +1.28 dB (mean +0.45 dB: h57
    offered it), pooled SQNR -0.34, -1.26 dB (worse in both folds, beyond noise)."""
    out, oos = _check(tmp_path, "ranges")
    assert oos["mean"] > 0  # the worst channel alone kept it
    pooled = oos["pooled"]
    assert pooled["mean"] < 0 and max(pooled["folds"]) < 0 and pooled["noise"]["upper"] < 0
    assert oos["offered"] is False and out.options == ()
    note = next(n for n in out.notes if n.startswith("repair ranges"))
    assert ("not offered, better in-sample (+0.5 dB) but its pooled sqnr_db is worse out of "
            "sample: -0.8 dB (sqnr_db, mean of 2 folds by person") in note, note


def _figure(key: str, folds: tuple[float, ...], upper: float | None) -> Figure:
    noise = "no powers" if upper is None else {"upper": upper, "half_width": 1.0,
                                                "n": [5, 7], "unit": "people"}
    return Figure(key, folds, noise)  # type: ignore[arg-type]


def test_the_rule_weighs_each_figure_by_its_noise():
    pooled_up = _figure("sqnr_db", (0.5, 0.1), 0.9)
    # a worst channel below zero beyond its noise drops an offer the pooled figure keeps
    assert stands(_figure("sqnr_db_channel_min", (-3.0, -2.0), -0.5), pooled_up) == (
        False, "its sqnr_db_channel_min is worse out of sample beyond its noise "
               "(-2.5 dB ± 1.0 dB over 5 + 7 people)")
    # within its noise it does not
    assert stands(_figure("sqnr_db_channel_min", (-3.0, 2.0), 1.5), pooled_up) == (True, "")
    assert stands(_figure("sqnr_db_channel_min", (-3.0, 2.0), None), pooled_up)[0]
    # a pooled figure (the offer's own, or the one judging a worst channel): the point rule
    tok = _figure("sqnr_db", (0.2, -4.5), 0.2)  # the token classifier's equalize
    assert stands(tok, None) == (False, "its sqnr_db is worse out of sample")
    assert stands(_figure("sqnr_db_channel_min", (1.0, 1.0), 2.0), tok)[0] is False


def test_the_mean_of_two_folds_noise_is_their_jackknife_errors_combined():
    rng = np.random.default_rng(3)

    def fold(n: int, shift: float) -> dict:
        s = rng.uniform(1.0, 2.0, n)
        before = Parts(s, rng.uniform(0.01, 0.02, n), "samples")
        after = Parts(s, before.noise * np.exp(rng.normal(shift, 0.3, n)), "samples")
        iv = gain_interval(after, before)
        assert iv is not None
        return iv

    a, b = fold(8, -0.1), fold(12, 0.2)
    got = mean_interval([a, b])
    se = [iv["half_width"] / t_quantile(0.95, iv["n"] - 1) for iv in (a, b)]
    dof = int((se[0] ** 2 + se[1] ** 2) ** 2 / (se[0] ** 4 / 7 + se[1] ** 4 / 11))
    half = t_quantile(0.95, dof) * np.hypot(*se) / 2
    assert got["mean"] == pytest.approx((a["difference"] + b["difference"]) / 2)
    assert got["dof"] == dof and got["half_width"] == pytest.approx(half)
    assert got["upper"] == pytest.approx(got["mean"] + half) and got["n"] == [8, 12]


def test_parts_grouped_per_face_pool_to_the_same_figure():
    rng = np.random.default_rng(5)
    p = Parts(rng.uniform(1, 2, (6, 3)), rng.uniform(0.01, 0.1, (6, 3)), "samples")
    g = group_parts(p, [2, 0, 2, 1, 0, 2], "faces")
    assert g.unit == "faces" and g.signal.shape == (3, 3)
    assert pooled_db(g) == pytest.approx(pooled_db(p))
    assert np.allclose(g.signal[2], p.signal[[0, 2, 5]].sum(axis=0))
    with pytest.raises(ValueError, match="unit labels"):
        group_parts(p, [0, 1], "faces")


def test_plans_console_says_the_noise_and_the_pooled_figure() -> None:
    from quantscope.cli.plan import _offer_row

    row = {"name": "ranges", "gain": 2.1, "out_of_sample": {
        "metric": "sqnr_db_channel_min", "folds": [0.459, -0.958], "mean": -0.25,
        "noise": {"half_width": 3.368, "upper": 3.118}, "offered": True,
        "judged_by": "sqnr_db",
        "pooled": {"metric": "sqnr_db", "folds": [0.891, -0.207], "mean": 0.342,
                   "noise": {"half_width": 1.076, "upper": 1.418}},
        "folded": {"by": "person"}}}
    assert _offer_row(row) == (
        "out of sample -0.250 dB (folds by person +0.459 dB, -0.958 dB; noise 3.368 dB; "
        "judged by sqnr_db +0.342 dB, folds +0.891 dB, -0.207 dB, noise 1.076 dB)")
