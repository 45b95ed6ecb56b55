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
