"""finetune on the built-in real models: the converter against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import build_qdq
from quantscope.emulate.session import make_session
from quantscope.finetune.apply import fp32_weights
from quantscope.finetune.graph import to_torch
from quantscope.finetune.objectives import EmbeddingLoss
from quantscope.model.groups import find_groups
from quantscope.stages import open_data, open_model
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

pytestmark = pytest.mark.slow


def _small(batch, n=8):
    return {k: v[:n] for k, v in batch.items()}


@pytest.mark.parametrize("name,data", [("minilm-l3", "stdlib-docs"), ("dlib-face", "faces")])
def test_fp32_conversion_of_builtin_models_matches_ort(name, data):
    model = open_model(name)
    feeds = _small(open_data(data, model, max_pairs=16).evaluation[-1])
    with torch.no_grad():
        ours = to_torch(model.proto)(feeds)[0][0].numpy()
    ref = make_session(model.proto).run(None, feeds)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)


def test_qdq_student_of_a_text_encoder_agrees_with_ort_on_pooled_embeddings():
    model = open_model("minilm-l3")
    data = open_data("stdlib-docs", model, max_pairs=16)
    feeds = _small(data.evaluation[-1])
    groups = find_groups(model)
    stats = calibrate(model, groups, [_small(b) for b in data.calibration[:2]])
    scheme = load_target("hailo10h").scheme
    plan = Plan.uniform(Precision.A8_W8)
    qdq = build_qdq(model, encode(model, groups, stats, plan, scheme=scheme))
    student = to_torch(qdq, float_weights=fp32_weights(model), scheme=scheme)
    obj = EmbeddingLoss(0, "attention_mask")
    with torch.no_grad():
        ours = obj.target(student(feeds)[0], feeds)[0]
    ref = obj.target([torch.from_numpy(o) for o in make_session(qdq).run(None, feeds)], feeds)[0]
    # rounding-boundary flips only (float32 accumulation order differs): see docs/finetune.md
    assert float((ours * ref).sum(dim=1).min()) > 0.99
