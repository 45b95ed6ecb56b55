"""finetune as a registered repair: runs through the one runner, pins ranges, records."""

import numpy as np
import pytest
import tiny_models as tm

pytest.importorskip("torch", reason="the finetune repair needs the finetune extra (torch)")

from quantscope import stages  # noqa: E402
from quantscope.model.load import load_proto  # noqa: E402
from quantscope.repair import finetune as ft  # noqa: E402
from quantscope.repair.apply import run_repairs  # noqa: E402
from quantscope.types import Dataset, Plan, Precision  # noqa: E402


def test_finetune_repair_writes_weights_pins_ranges_and_improves_held_out(monkeypatch):
    monkeypatch.setattr(ft, "FINETUNE_STEPS", 40)
    model = load_proto(tm.conv_net(), "conv")
    rng = np.random.default_rng(0)
    feeds = tuple({"image": rng.normal(0, 1, (8, 3, 16, 16)).astype(np.float32)}
                  for _ in range(6))
    held = tuple({"image": rng.normal(0, 1, (8, 3, 16, 16)).astype(np.float32)}
                 for _ in range(3))
    data = Dataset(name="x", calibration=feeds, evaluation=held)
    stats = stages.calibrate_model(model, data)
    plan = Plan.uniform(Precision.A8_W4)
    out = run_repairs(model, stats, plan, feeds, repairs=["finetune"])
    rec = out.records[0]
    assert rec.name == "finetune" and rec.skipped is None and rec.fp32_check is None
    assert set(rec.changed) >= {"w1", "w2", "w3"}
    assert out.plan.pinned and "finetune" in dict(out.plan.meta)
    repaired = load_proto(out.proto, "conv (finetuned)")
    before = stages.evaluate_plan(model, data, stats, plan, saturation=False)
    after = stages.evaluate_plan(repaired, data, out.stats, out.plan, saturation=False,
                                 reference=model)
    assert after["metrics"]["sqnr_db"] > before["metrics"]["sqnr_db"]


def test_plan_with_finetune_records_both_measurements(tmp_path, monkeypatch, capsys):
    import json

    import onnx

    from quantscope.cli import main

    monkeypatch.setattr(ft, "FINETUNE_STEPS", 20)
    m, x, s, a, p = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "a.json", "p.json"))
    onnx.save(tm.conv_net(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (96, 3, 16, 16)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(s), "--low", "a8_w4",
                 "--out", str(a)]) == 0
    assert main(["plan", str(m), "--analysis", str(a), "--target", "ort-cpu", "--max-cost",
                 "1.2", "--data", str(x), "--stats", str(s), "--repairs", "bias,finetune",
                 "--out", str(p)]) == 0
    assert "finetune (" in capsys.readouterr().out
    doc = json.loads(p.read_text())
    ftr = doc["pareto"]["finetune"]
    assert ftr["metric"] == "sqnr_db_channel_min" and ftr["after"] is not None and ftr["before"] is not None
    assert ftr["repairs"][-1] == "finetune" and "sqnr_db" in ftr["fp32_drift"]
    if ftr["kept"]:  # measured at least as well as the chosen plan without it
        base = doc["pareto"]["chosen"]["measured"]
        assert ftr["after"] >= (ftr["before"] if base is None else base)
        assert doc["meta"]["repairs"].endswith("finetune") and doc.get("pinned")
    else:
        assert "finetune" not in doc["meta"].get("repairs", "") and "dropped" in ftr


def test_a_finetune_that_measures_worse_is_dropped():
    from quantscope.stages import _keep_finetune, goal_verdict

    worse = {"chosen": {"measured": 0.9}, "higher_is_better": True,
             "finetune": {"before": 0.8, "after": 0.85, "skipped": None}}
    assert not _keep_finetune(worse)
    assert "0.85 with finetune against 0.9 without" in worse["finetune"]["dropped"]
    assert goal_verdict(worse, "top1_agreement", 0.95)["verdict"].endswith(
        "best legal plan 90.0 %; binding: no promotion left")
    better = {"chosen": {"measured": 0.9}, "finetune": {"before": 0.8, "after": 0.95}}
    assert _keep_finetune(better) and "dropped" not in better["finetune"]
    assert goal_verdict(better, "top1_agreement", 0.95)["reached"]
    lower = {"chosen": {"measured": 2.0}, "higher_is_better": False,
             "finetune": {"before": 3.0, "after": 1.5}}
    assert _keep_finetune(lower)
    skipped = {"chosen": {"measured": 0.9}, "finetune": {"after": None, "skipped": "no torch"}}
    assert not _keep_finetune(skipped) and "dropped" not in skipped["finetune"]
    # better quantized, but its float model drifted below it (mpnet-base: 89.8 % vs 77.0 %)
    drifted = {"chosen": {"measured": 0.893},
               "finetune": {"metric": "top1_agreement", "before": 0.893, "after": 0.898,
                            "fp32_drift": {"top1_agreement": 0.77}}}
    assert not _keep_finetune(drifted)
    assert "FP32 model measures 77.0 % against the original, worse than the fine-tuned " \
        "plan's 89.8 %" in drifted["finetune"]["dropped"]
    faithful = {"chosen": {"measured": 0.942},
                "finetune": {"metric": "top1_agreement", "before": 0.942, "after": 0.946,
                             "fp32_drift": {"top1_agreement": 0.956}}}
    assert _keep_finetune(faithful)
