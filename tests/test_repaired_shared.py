"""The run's repaired model is the working model's proto when no repair changed it: the
stages from check to io hold one copy (``steps.repaired``), named ``repaired.onnx``; a
repair that changed the model keeps its own."""

from __future__ import annotations

from pathlib import Path

import onnx
import tiny_models as tm

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.pipeline import steps
from quantscope.pipeline.context import Context, RunOptions
from quantscope.serde import write_plan, write_stats
from quantscope.types import Plan, Precision


def _folder(tmp_path: Path, proto: onnx.ModelProto, model) -> Path:
    stats = calibrate(model, find_groups(model), [tm.sample_inputs(model.proto, seed=0)])
    folder = tmp_path / "run"
    folder.mkdir()
    onnx.save(proto, folder / steps.REPAIRED)
    write_stats(folder / steps.REPAIRED_STATS, stats)
    write_plan(folder / steps.REPAIRED_PLAN, Plan(default=Precision.A8_W8, target="ort_cpu"))
    return folder


def _ctx(folder: Path, cache: dict) -> Context:
    return Context(RunOptions(model="unused.onnx", data="unused.tsv", target="ort-cpu",
                              out=str(folder)), folder, _cache=cache)


def test_an_unchanged_repaired_model_is_the_working_models_proto(tmp_path):
    model = load_proto(tm.conv_net(), "conv")
    folder = _folder(tmp_path, model.proto, model)
    repaired, _, plan = steps.repaired(_ctx(folder, {"model": model}))
    assert repaired.proto is model.proto  # one copy
    assert repaired.source == steps.REPAIRED  # named as the evaluation names it
    assert plan.default == Precision.A8_W8
    # loaded before the working model (a run resumed at check): shared once it is loaded
    ctx = _ctx(folder, {})
    first = steps.repaired(ctx)[0]
    assert first.proto is not model.proto and first.proto == model.proto
    ctx._cache["model"] = model
    assert steps.repaired(ctx)[0].proto is model.proto


def test_a_changed_repaired_model_keeps_its_own(tmp_path):
    model = load_proto(tm.conv_net(), "conv")
    changed = onnx.ModelProto()
    changed.CopyFrom(model.proto)
    w = changed.graph.initializer[0]
    arr = onnx.numpy_helper.to_array(w) * 0.5
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    folder = _folder(tmp_path, changed, model)
    ctx = _ctx(folder, {"model": model})
    repaired = steps.repaired(ctx)[0]
    assert repaired.proto is not model.proto
    assert repaired.proto.graph.initializer[0] == changed.graph.initializer[0]
    assert steps.repaired(ctx)[0] is repaired
