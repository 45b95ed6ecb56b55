"""h58: the planner ranked a picture's PSNR, a face verification's, image views' and an
embedding's SQNR without their noise: its measurements kept the per-sample powers of
these figures for ``run``'s held-out check only (h52), so the no-goal choice bought the
best measured figure whatever it cost ("its figure counts no items and keeps no
per-sample scores, so no noise estimate"). A tiny image model bought 6.12x for +1.3 dB
PSNR on six samples whose errors differ widely (noise ±2.3 dB). The tasks' powers are
now one ``sample_parts`` that the planner, a torch ranking and the held-out check read
(:func:`quantscope.analyze.measure.figure_parts`), so the planner takes the cheaper plan
and ``choice`` names the noise."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper, numpy_helper
from test_h48_db_noise import _evaluator, _target
from test_h52_held_out_more_db import _faces_task

from quantscope import stages
from quantscope.analyze.evalcache import EvalCache
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.search import search
from quantscope.tasks.db_noise import pooled_db
from quantscope.tasks.images import ViewRetrievalTask
from quantscope.tasks.layout import OutputTasks
from quantscope.tasks.neighbours import EmbeddingTask
from quantscope.tasks.pictures import ImageTask
from quantscope.types import Dataset, Plan, Precision, Sensitivity

SAMPLES, COPIES = 6, 3  # samples (faces, photos); a face's chips, a photo's views


def _near_identity(shape: tuple[int, ...], off: float, outputs: tuple[str, ...] = ("y",)):
    """``y = x + x @ W``, ``W`` the identity plus small off-diagonal weights: the weights'
    8-bit error grows with a sample's size, the activations' does not, so how much 16 bit
    gains differs from sample to sample. ``outputs=("a", "b")``: two outputs, ``a = x @ W``
    and ``b = x + a``."""
    d = shape[-1]
    r = np.random.default_rng(0)
    w = (np.eye(d) + r.normal(0, off, (d, d))).astype(np.float32)
    m, y = outputs if len(outputs) == 2 else ("m", outputs[0])
    nodes = [helper.make_node("MatMul", ["x", "w"], [m], name="MatMul_0"),
             helper.make_node("Add", ["x", m], [y], name="Add_1")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", *shape])],
                          [helper.make_tensor_value_info(o, 1, ["N", *shape]) for o in outputs],
                          [numpy_helper.from_array(w, "w")])
    return load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
                      "near-identity")


def _sized(units: int, copies: int, shape: tuple[int, ...], spread: float) -> np.ndarray:
    """``units x copies`` rows of ``shape``, each unit's rows of one log-normal size."""
    r = np.random.default_rng(2)
    size = np.repeat(np.exp(r.normal(0, spread, units)), copies)
    x = r.normal(0, 1, (units * copies, *shape)) * size.reshape(-1, *[1] * len(shape))
    return x.astype(np.float32)


def _data(task: object, x: np.ndarray) -> Dataset:
    b = ({"x": x},)
    return Dataset(name="x.npz", calibration=b, evaluation=b, task=task)  # type: ignore[arg-type]


def _search(model, data: Dataset, metric: str):
    """The no-goal search on the toy target (its Add stays at 8 bit: the MatMul at 16 bit
    is the one dearer plan), every plan measured by the planner's evaluator."""
    stats = stages.calibrate_model(model, data)
    groups = find_groups(model)
    sens = Sensitivity.from_gains(metric, 30.0, {g: {"a16_w16": 1.0} for g in groups.names()})
    return search(groups, sens, _target(elementwise_16=False), model,
                  evaluate=_evaluator(model, data, stats, metric), refine_steps=12,
                  measured_metric=metric)


def _picture(spread: float):
    task = ImageTask(name="image:y", output="y")
    return _near_identity((1, 4, 4), 0.005), _data(task, _sized(SAMPLES, 1, (1, 4, 4), spread))


def test_a_psnr_gain_within_its_noise_buys_no_cost():
    """Six pictures whose errors differ widely: the MatMul at 16 bit (6.12x) gains +1.3 dB
    PSNR, inside the ±2.3 dB noise of the difference: uniform a8_w8 is chosen (before:
    6.12x, "no noise estimate"), and the record says what the dearer plan would gain."""
    model, data = _picture(2.0)
    r = _search(model, data, "psnr_db")
    c = r.to_dict()["choice"]
    assert r.cost == pytest.approx(1.0) and r.plan.overrides == (), c
    assert c["best"]["cost"] > 6.0 and c["noise"] is not None, c
    assert 0.0 < c["best"]["measured"] - r.measured < c["noise"]["half_width"]
    assert f"over {SAMPLES} samples" in c["noise"]["words"]
    assert "jackknife" in c["noise"]["words"]
    assert "within noise of the best measured" in c["line"] and "would gain +1.3 dB" in c["line"]


def test_a_steady_psnr_gain_beyond_its_noise_is_still_bought():
    """The same model on six pictures of one size: the gain is beyond its noise, the
    dearer plan is bought, and the record names the noise the closest cheaper plan was
    beyond (before: "no noise estimate")."""
    model, data = _picture(0.0)
    r = _search(model, data, "psnr_db")
    c = r.to_dict()["choice"]
    assert r.cost > 6.0 and c["chosen"] == c["best"] and c["noise"] is not None, c
    assert "no cheaper measured plan within its noise: the closest" in c["line"], c["line"]


def _views() -> ViewRetrievalTask:
    return ViewRetrievalTask("photos", photo=np.repeat(np.arange(SAMPLES, dtype=np.int32),
                                                       COPIES))


@pytest.mark.parametrize("task, unit", [(lambda: _faces_task(SAMPLES, COPIES), "faces"),
                                        (_views, "photos")])
def test_an_embedding_sqnr_gain_within_its_noise_buys_no_cost(task, unit):
    """``--data faces`` / ``photos`` asked for ``embedding_sqnr_db``: six faces (photos)
    of three chips (views) each, each face of its own size: +1.3 dB at 7.02x is within its
    noise per face (per photo), uniform a8_w8 chosen (before: 7.02x, no estimate)."""
    model = _near_identity((16,), 0.005)
    data = _data(task(), _sized(SAMPLES, COPIES, (16,), 2.0))
    r = _search(model, data, "embedding_sqnr_db")
    c = r.to_dict()["choice"]
    assert r.cost == pytest.approx(1.0), c
    assert c["best"]["cost"] > 7.0 and c["noise"] is not None, c
    assert 0.0 < c["best"]["measured"] - r.measured < c["noise"]["half_width"]
    assert f"over {SAMPLES} {unit}" in c["noise"]["words"], c["noise"]


@pytest.mark.parametrize("metric, layout", [
    ("psnr_db:b", "outputs"), ("psnr_db", "outputs"), ("embedding_sqnr_db", "embedding")])
def test_the_planners_evaluator_keeps_the_powers_of_every_db_figure(metric, layout, tmp_path):
    """An image output's per-output ``psnr_db:OUTPUT`` and the worst output's ``psnr_db``
    (two image outputs), an embedding's ``embedding_sqnr_db`` (``--layout y=embedding``):
    the evaluator keeps per-sample powers pooling to the figure, read back from the
    evaluation cache too."""
    x = _sized(SAMPLES, 1, (16,), 1.0)
    if layout == "embedding":
        task, model = EmbeddingTask(name="embedding:y", output="y"), _near_identity((16,), 0.01)
    else:
        task = OutputTasks(name="outputs", headline="psnr_db", tasks=tuple(
            ImageTask(name=f"image:{o}", output=o) for o in ("a", "b")))
        model = _near_identity((16,), 0.01, ("a", "b"))
    data = _data(task, x)
    stats = stages.calibrate_model(model, data)
    ev = stages.plan_evaluator(model, data, stats, metric, cache=EvalCache(tmp_path / "e"))
    value = ev(Plan.uniform(Precision.A8_W8))
    assert ev.parts is not None and ev.parts.unit == "samples", metric
    assert len(ev.parts.signal) == SAMPLES
    assert pooled_db(ev.parts) == pytest.approx(value, abs=1e-6)
    again = stages.plan_evaluator(model, data, stats, metric, cache=EvalCache(tmp_path / "e"))
    assert again(Plan.uniform(Precision.A8_W8)) == value
    assert np.array_equal(again.parts.noise, ev.parts.noise)


def test_plan_json_names_the_psnr_noise(tmp_path, capsys):
    """``quantscope plan --layout y=image`` without a goal: ``plan.json``'s choice names
    the jackknife noise over the pictures (before: ``noise`` null, "no noise
    estimate")."""
    import onnx

    from quantscope.cli import main

    model, data = _picture(2.0)
    onnx.save(model.proto, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", data.evaluation[0]["x"])
    f = {k: str(tmp_path / v) for k, v in (("model", "m.onnx"), ("data", "x.npy"),
                                           ("stats", "s.npz"), ("analysis", "a.json"),
                                           ("plan", "p.json"))}
    lay = ["--layout", "y=image"]
    assert main(["calibrate", f["model"], "--data", f["data"], "--out", f["stats"]]) == 0
    assert main(["analyze", f["model"], "--data", f["data"], *lay, "--stats", f["stats"],
                 "--target", "hailo8", "--out", f["analysis"]]) == 0
    assert main(["plan", f["model"], "--analysis", f["analysis"], "--stats", f["stats"],
                 "--data", f["data"], *lay, "--target", "hailo8", "--max-cost", "8",
                 "--out", f["plan"]]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "p.json").read_text())
    c = doc["pareto"]["choice"]
    assert c["noise"] is not None, c
    assert f"over {SAMPLES} samples" in c["noise"]["words"], c
