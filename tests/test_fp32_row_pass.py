"""A plan that quantizes nothing (the demo's and run's ``fp32`` row) was run as a second
full pass of the very graph the FP32 reference had just run (the demo: one of its six
passes, ~34 s of 230 s on minilm-l6). Its QDQ graph is the model's own, byte for byte, so
its outputs are now the FP32 pass's, and its notes say so; the figures are the same."""

from __future__ import annotations

from incremental_models import encoder, feeds

from quantscope.analyze import measure
from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision


def test_the_fp32_row_reads_the_fp32_pass_with_the_same_figures(monkeypatch) -> None:
    model = load_proto(encoder(), "enc")
    batches = [feeds(n=3, s=5 + i, seed=i) for i in range(2)]
    stats = calibrate(model, find_groups(model), batches)
    data = Dataset("tiny", calibration=tuple(batches), evaluation=tuple(batches))
    plans = {"fp32": Plan.uniform(Precision.FLOAT), "a8_w8": Plan.uniform(Precision.A8_W8)}
    opened = []
    real = measure.open_runs
    monkeypatch.setattr(measure, "open_runs",
                        lambda proto, *a, **k: opened.append(proto) or real(proto, *a, **k))
    res = measure.evaluate_plans(model, data, stats, plans, saturation=False)
    assert len(opened) == 1  # the a8_w8 graph; the fp32 row read the reference's pass
    assert measure.SAME_NOTE in res["fp32"]["notes"]
    assert measure.SAME_NOTE not in res["a8_w8"]["notes"]
    # against a reference of the same graph from another object: both rows run, same figures
    again = measure.evaluate_plans(model, data, stats, plans, saturation=False,
                                   reference=load_proto(encoder(), "enc (copy)"))
    assert len(opened) == 3 and measure.SAME_NOTE not in again["fp32"]["notes"]
    for k in plans:
        assert res[k]["metrics"] == again[k]["metrics"], k
