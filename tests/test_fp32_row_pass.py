"""A plan that quantizes nothing (the demo's and run's ``fp32`` row) was run as a second
full pass of the very graph the FP32 reference had just run (the demo: one of its six
passes, ~34 s of 230 s on minilm-l6). Its QDQ graph is the model's own, byte for byte, so
its outputs are now the FP32 pass's, and its notes say so; the figures are the same."""

from __future__ import annotations

from incremental_models import encoder, feeds
from onnx import numpy_helper

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


def test_given_reference_outputs_are_not_taken_for_the_models_own() -> None:
    """The fine-tune measures its FP32 drift as the float plan of the fine-tuned model
    against the given model's outputs (``reference_outputs``): those are another model's,
    so the float plan must run (the first version of the reuse read them, and the drift
    came out as no error at all)."""
    from quantscope.emulate.evaluate import run_model

    model = load_proto(encoder(), "enc")
    batches = [feeds(n=3, s=5 + i, seed=i) for i in range(2)]
    data = Dataset("tiny", calibration=tuple(batches), evaluation=tuple(batches))
    stats = calibrate(model, find_groups(model), batches)
    other = load_proto(encoder(), "other")
    for init in other.proto.graph.initializer:  # another function: weights scaled
        if init.data_type == 1 and init.raw_data:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    other = load_proto(other.proto, "other")
    given = run_model(other.proto, batches)
    res = measure.evaluate_plans(model, data, stats, {"fp32": Plan.uniform(Precision.FLOAT)},
                                 saturation=False, reference_outputs=given)["fp32"]
    assert measure.SAME_NOTE not in res["notes"]
    assert res["metrics"]["embedding_cosine_min" if "embedding_cosine_min" in res["metrics"]
                          else "cosine_min"] < 0.999999


def test_outputs_the_caller_says_are_the_models_own_are_read(monkeypatch) -> None:
    """The run's evaluate stage computes the held-out FP32 outputs of the model once and
    hands them to the uniform rows and the plan's: its fp32 row ran the same graph a
    second time (14 s of minilm-l6's evaluate stage) until the caller could say the
    outputs are the model's own (``own_outputs``)."""
    from quantscope.emulate.evaluate import run_model

    model = load_proto(encoder(), "enc")
    batches = [feeds(n=3, s=5 + i, seed=i) for i in range(2)]
    data = Dataset("tiny", calibration=tuple(batches), evaluation=tuple(batches))
    stats = calibrate(model, find_groups(model), batches)
    ref = run_model(model.proto, batches)
    opened = []
    real = measure.open_runs
    monkeypatch.setattr(measure, "open_runs",
                        lambda proto, *a, **k: opened.append(proto) or real(proto, *a, **k))
    plans = {"fp32": Plan.uniform(Precision.FLOAT), "a8_w8": Plan.uniform(Precision.A8_W8)}
    own = measure.evaluate_plans(model, data, stats, plans, saturation=False,
                                 reference_outputs=ref, own_outputs=True)
    assert len(opened) == 1 and measure.SAME_NOTE in own["fp32"]["notes"]
    given = measure.evaluate_plans(model, data, stats, plans, saturation=False,
                                   reference_outputs=ref)
    assert len(opened) == 3 and measure.SAME_NOTE not in given["fp32"]["notes"]
    for k in plans:
        assert own[k]["metrics"] == given[k]["metrics"], k
