"""The held-out check's inputs built through the real measuring path (h49, h52): outputs
of FP32, uniform a8_w8 and the plan scored as ``run``'s evaluate stage scores them (the
fidelity with per-sample powers, the task's figures, the powers kept beside them), written
as ``evaluate.json`` keeps them, and the verdict's check read from them."""

from __future__ import annotations

import json

import numpy as np

from quantscope.analyze.measure import figure_parts, kept_parts
from quantscope.emulate.evaluate import compare_model
from quantscope.pipeline.held_out import headline_parts, keep_powers, worse_held_out
from quantscope.types import Dataset, Outputs


class Runs:  # an emulated model's runs, as compare_model reads them
    def __init__(self, names: tuple[str, ...], outputs: tuple[np.ndarray, ...]) -> None:
        self.names = names
        self.batches = iter([(outputs, {})])


def measured(ref: dict[str, np.ndarray], tests: dict[str, dict[str, np.ndarray]],
             metric: str, task: object | None = None) -> dict:
    """evaluate.json's results of each label in ``tests`` (output name -> array, one
    batch) against FP32's ``ref``: scored with per-sample powers and ``task``'s figures and
    their powers, as ``run``'s evaluate stage scores them, the headline ``metric``'s
    powers kept, read back from JSON."""
    names = tuple(ref)
    fp32 = Outputs(names, (tuple(ref[n] for n in names),))
    data = Dataset("held-out", (), (), task=task)  # type: ignore[arg-type]
    results = {}
    for label, outs in tests.items():
        fid, test = compare_model(Runs(names, tuple(outs[n] for n in names)), fp32,
                                  per_sample=True)
        metrics = dict(fid.values)
        if task is not None:
            metrics.update(task.metrics(fp32, test).values)  # type: ignore[attr-defined]
        parts = figure_parts(data, fid, fp32, test)
        results[label] = {"metrics": metrics, "sample_parts": kept_parts(parts, metrics)}
    keep_powers(results, metric)
    return json.loads(json.dumps(results))  # as the verdict reads evaluate.json


def check_held_out(results: dict, metric: str) -> dict | None:
    """The verdict's check of the plan (1.3x) against a8_w8 on ``results``."""
    quality = {k: {metric: r["metrics"][metric]} for k, r in results.items()}
    return worse_held_out(metric, "dB", quality, 1.3, higher=True, uniform_meets_goal=False,
                          parts=headline_parts(results, metric))


def assert_beyond_noise(rec: dict | None, samples: int) -> None:
    """The check's record of a plan worse by under 0.1 dB over ``samples`` steady samples:
    beyond its jackknife noise (under the worse-by), said, with the advice to ship a8_w8."""
    assert rec is not None and 0.02 < rec["worse_by"] < 0.1, rec
    assert rec["noise_from"] == "jackknife" and rec["margin"] < rec["worse_by"], rec
    assert rec["beyond_noise"], rec
    assert "jackknife noise" in rec["line"] and f"over {samples} samples" in rec["line"], rec
    assert "ship uniform a8_w8 or add data" in rec["line"]
