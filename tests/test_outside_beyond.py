"""Vision models beyond classifiers and YOLOv8 heads (issue: models beyond the zoo):
a segmentation's per-pixel Softmax, a YOLOv5-style head with an objectness row, and a
model whose image size is symbolic, fed fixed-size tensors."""

from __future__ import annotations

import dataclasses

import numpy as np
from beyond_models import segmenter

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.tasks.layout import layout_tasks
from quantscope.types import Dataset, Plan, Precision


def _data(model, n=16, batch=8, shape=(3, 16, 16), seed=0):
    x = np.random.default_rng(seed).normal(0, 1, (n, *shape)).astype(np.float32)
    b = tuple({"x": x[i:i + batch]} for i in range(0, n, batch))
    data = Dataset(name="seg", calibration=b, evaluation=b)
    return data, stages.calibrate_model(model, data)


def test_a_per_pixel_softmax_is_read_as_class_scores_per_position():
    model = load_proto(segmenter(), "seg")
    task, notes = layout_tasks(model, (), "x.npz")
    assert task is not None and task.headline == "top1_agreement"
    assert notes == ("output 'probs' read as class scores (top-1 over 4 classes on axis 1) "
                     "(a Softmax over the classes); --layout probs=tensor for plain fidelity",)
    data, stats = _data(model)
    res = stages.evaluate_plan(model, dataclasses.replace(data, task=task), stats,
                               Plan.uniform(Precision.A8_W8))
    # judged per position (16 samples x 16 x 16 pixels: 4,096), and said so
    assert 0.9 < res["metrics"]["top1_agreement"] < 1.0
    ties = round(res["metrics"]["top1_ties"] * 4096)
    assert ties and any(f"on {ties} of 4096 positions the quantized top score is shared" in n
                        for n in res["notes"])
    # the logits have no Softmax to find: plain fidelity unless declared
    assert layout_tasks(load_proto(segmenter(softmax=False), "seg"), (), "x.npz") == (None, ())
