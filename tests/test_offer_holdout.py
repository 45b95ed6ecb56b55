"""Repair offers judged out of sample where the plan search measures on its calibration
data (tensor data): a repair that only helps in-sample is not offered, and says why."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tiny_models
from onnx import TensorProto, helper, numpy_helper

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.stages import Dataset, evaluate_plan, plan_repair_offer
from quantscope.stages.offer_holdout import halves
from quantscope.targets import load_target
from quantscope.types import Plan, Precision, Sensitivity, batch_rows

T, D, C = 12, 16, 5


def _token_classifier() -> tuple[onnx.ModelProto, np.ndarray]:
    """x [N, 12, 16] -> MatMul -> Relu (hr) -> MatMul -> Add -> logits [N, 12, 5], and 32
    samples: equalize looks better on the samples it calibrated on and clips ``hr`` on
    others."""
    r = np.random.default_rng(31)
    w1 = r.normal(0, 0.5, (D, D)).astype(np.float32)
    w2 = r.normal(0, 0.5, (D, C)).astype(np.float32)
    b2 = r.normal(0, 0.1, C).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["hr"]),
             helper.make_node("MatMul", ["hr", "w2"], ["z"]),
             helper.make_node("Add", ["z", "b2"], ["logits"])]
    g = helper.make_graph(
        nodes, "tok", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", T, D])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", T, C])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(b2, "b2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m, r.normal(0, 1, (32, T, D)).astype(np.float32)


def _offer(model, feeds, names, *, evaluation=None, target="hailo8"):
    """The measured offer of ``names`` on ``feeds`` (evaluated on ``evaluation``, default:
    the calibration batches themselves, as ``run`` does on the fit part of tensor data)."""
    data = Dataset("tiny", calibration=feeds, evaluation=feeds if evaluation is None
                   else evaluation)
    stats = calibrate(model, find_groups(model), iter(data.calibration))
    tgt = load_target(target)
    low = Plan(default=Precision.A8_W8, target=tgt.name)
    base = evaluate_plan(model, data, stats, low, scheme=tgt.scheme)["metrics"]["sqnr_db"]
    sens = Sensitivity.from_gains("sqnr_db", base, {g: {"a16_w16": 1.0}
                                                     for g in find_groups(model).names()})
    offer = plan_repair_offer(model, data, stats, sens, tgt, names, list(feeds),
                              task_metric="sqnr_db")
    return offer, {r["name"]: r for r in offer.measured}


def test_equalize_better_in_sample_but_clipping_out_of_sample_is_not_offered():
    proto, x = _token_classifier()
    offer, rows = _offer(load_proto(proto, "tok"), ({"x": x[:16]},), ("equalize",))
    eq = rows["equalize"]
    assert eq["gain"] > 0  # in-sample it looks better: what was offered before
    oos = eq["out_of_sample"]
    assert oos["offered"] is False and oos["mean"] < 0 and oos["samples"] == [8, 8]
    assert oos["mean"] == pytest.approx(sum(oos["folds"]) / 2, abs=1e-5)
    assert min(oos["folds"]) < -3  # one fold clips badly
    assert oos["clips"].get("hr", 0) > 0  # the Relu output clips out of sample
    assert [o.name for o in offer.options] == []
    note = next(n for n in offer.notes if n.startswith("repair equalize"))
    assert "not offered, better in-sample (+" in note and "worse out of sample" in note
    assert "mean of 2 folds" in note and "clips on samples it was not calibrated on (hr" in note
    # the noise of that mean is said (h61): one clipping sample in 8 makes it about as large
    # as the mean, and the point rule on a pooled figure still drops it
    assert oos["judged_by"] == "sqnr_db" and "pooled" not in oos
    assert oos["noise"]["n"] == [8, 8] and oos["noise"]["unit"] == "samples"
    assert oos["noise"]["lower"] < oos["mean"] < oos["noise"]["upper"]
    assert "noise 2.4 dB: one-sided 95% jackknife over 8 + 8 samples" in note


def test_a_repair_that_helps_out_of_sample_is_still_offered():
    model = load_proto(tiny_models.residual_add(), "residual")
    feeds = tuple(tiny_models.sample_inputs(model.proto, seed=i) for i in range(3))
    offer, rows = _offer(model, feeds, ("equalize",))
    oos = rows["equalize"]["out_of_sample"]
    assert oos["offered"] is True and oos["mean"] > 1.0
    assert oos["samples"] == [16, 8]  # the 3 batches of 8 split by batches: 2 and 1
    assert [o.name for o in offer.options] == ["equalize"]
    assert any(n.startswith("repair equalize: offered, not worse out of sample: +")
               for n in offer.notes)


def test_separate_evaluation_data_is_not_checked():
    """Calibration and evaluation differ (text data's calibration texts, --eval-data): the
    offer stands as measured, unchecked."""
    proto, x = _token_classifier()
    offer, rows = _offer(load_proto(proto, "tok"), ({"x": x[:16]},), ("equalize",),
                         evaluation=({"x": x[16:]},))
    assert "out_of_sample" not in rows["equalize"]
    assert not any("out of sample" in n for n in offer.notes)


def test_too_few_samples_are_said_not_checked():
    proto, x = _token_classifier()
    offer, rows = _offer(load_proto(proto, "tok"), ({"x": x[:3]},), ("equalize",))
    if not offer.options:  # equalize did not even help in-sample on 3 samples
        pytest.skip("nothing offered in-sample on 3 samples")
    assert "out_of_sample" not in rows["equalize"]
    assert any("not checked out of sample" in n and "3 repair sample(s) are too few" in n
               for n in offer.notes)


def test_halves_split_batches_or_rows():
    a, b = halves([{"x": np.zeros((5, 2))}])
    assert (batch_rows(a[0]), batch_rows(b[0])) == (3, 2)
    one, two, three = ({"x": np.full((2, 2), i)} for i in range(3))
    a, b = halves([one, two, three])
    assert a == (one, two) and b == (three,)


def test_run_on_tensor_data_no_longer_chooses_equalize_and_says_why(tmp_path, capsys):
    proto, x = _token_classifier()
    m, data, out = tmp_path / "tok.onnx", tmp_path / "x.npz", tmp_path / "W"
    onnx.save(proto, m)
    np.savez(data, x=x)
    assert main(["run", str(m), "--data", str(data), "--target", "hailo8",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    doc = json.loads((out / "plan.json").read_text())
    assert "equalize" not in [r["name"] for r in doc.get("repairs", [])]
    assert "equalize" not in dict(doc.get("meta", {})).get("repairs", "")
    notes = doc["repair_offer"]["notes"]
    said = next(n for n in notes if n.startswith("repair equalize: not offered, better in-sample"))
    assert f"plan: {said}" in err  # on the console
    assert said in (out / "report.html").read_text().replace("&#x27;", "'")  # in the report
    rows = {r["name"]: r for r in doc["repair_offer"]["measured"]}
    assert rows["equalize"]["out_of_sample"]["offered"] is False


def test_a_task_that_scores_all_samples_together_is_said_not_checked():
    """Face verification, retrieval: halves of the samples are not the task's data; the
    offer stands as measured and the note says it was not checked (before any run)."""
    from types import SimpleNamespace

    from quantscope.plan.joint import Offer
    from quantscope.plan.start import RepairOption
    from quantscope.stages.offer_holdout import check_offer

    proto, x = _token_classifier()
    feeds = ({"x": x[:16]},)
    data = Dataset("pairs", calibration=feeds, evaluation=feeds,
                   task=SimpleNamespace(name="verification", row_local=False))
    option = RepairOption("equalize", gain=0.3, cost=0.0, reason="measured")
    offer = Offer((option,), ({"name": "equalize", "gain": 0.3},), ())
    sens = Sensitivity.from_gains("sqnr_db", 30.0, {})
    out = check_offer(offer, load_proto(proto, "tok"), data, None, sens, load_target("hailo8"),
                      feeds)
    assert out.options == (option,) and out.measured == offer.measured
    assert out.notes == ("repair equalize: not checked out of sample (the plan search measures "
                         "on its calibration data; its task (verification) scores all samples "
                         "together)",)


def test_plans_console_writes_a_measured_offer_in_its_units() -> None:
    """`plan` printed an offer row as the raw dict ("gain 0.254471, sqnr_db [38.34987,
    38.604341], out_of_sample {'folds': [0.203303, -4.501366], …}")."""
    from quantscope.cli.plan import _offer_row

    row = {"name": "equalize", "changed": 2, "gain": 0.254471, "cost": 0.0,
           "sqnr_db": [38.34987, 38.604341],
           "out_of_sample": {"metric": "sqnr_db", "folds": [0.203303, -4.501366],
                             "mean": -2.149031, "samples": [8, 8], "offered": False,
                             "clips": {"hr": 0.002604}}}
    assert _offer_row(row) == ("changed 2, cost 0, sqnr_db 38.3 dB -> 38.6 dB, out of sample "
                               "-2.149 dB (folds +0.203 dB, -4.501 dB; not offered)")
