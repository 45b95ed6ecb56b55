"""Evaluation scores each emulated batch as it comes and keeps only what the task reads of
it (FP32 and the plan in lock-step when one plan is evaluated): every metric, per-output
table, note, saturation figure and coverage entry is the one of running both models in
full and scoring after, bit for bit (compared through their JSON text: NaN-safe, floats
written to the last digit)."""

import dataclasses
import json

import numpy as np
import onnx
import pytest
import tiny_models as tm
from onnx import TensorProto, helper, numpy_helper
from test_tasks_sts import _tsv
from test_tasks_text import tiny_encoder

from quantscope import stages
from quantscope.emulate.evaluate import output_fidelity, run_model
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision

PLANS = {"a8_w8": Plan.uniform(Precision.A8_W8), "a8_w4": Plan.uniform(Precision.A8_W4)}


def _held(model, data, stats, plan, ref=None):
    """Evaluation as it was: both models run in full, their raw outputs scored after
    (``ref``: FP32's full run, given when an earlier call made it)."""
    batches = list(data.evaluation)
    ref = run_model(model.proto, batches) if ref is None else ref
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan, None))
    test = run_model(q.proto, batches)
    fid = output_fidelity(ref, test, only=data.output, judge=data.task is None,
                          channel_axes=stages.output_channel_axes(model, batches))
    values, tables, notes = dict(fid.values), dict(fid.tables), fid.notes
    if data.task is not None:
        t = data.task.metrics(ref, test)
        values.update(t.values)
        tables.update(t.tables)
        notes = (*notes, *t.notes)
    return values, tables, notes


def _same(a, b):
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _check(model, data, stats, plans=PLANS):
    """Every plan together (FP32 held once) and each alone (lock-step): the held numbers;
    saturation and coverage alike in both ways."""
    together = stages.evaluate_plans(model, data, stats, plans)
    ref = run_model(model.proto, list(data.evaluation))  # FP32 in full, once for all plans
    for label, plan in plans.items():
        alone = stages.evaluate_plan(model, data, stats, plan)
        values, tables, notes = _held(model, data, stats, plan, ref)
        for res in (together[label], alone):
            _same(res["metrics"], values)  # exact: not one number changes
            _same(res["outputs"], tables)
            assert res["notes"][-len(notes):] == list(notes) if notes else True
        _same({k: v for k, v in alone.items() if k != "plan"},
              {k: v for k, v in together[label].items() if k != "plan"})
        assert "saturation" in alone and alone["coverage"]
    # not vacuous: the plans are measurably off FP32 (a8_w4 more than a8_w8)
    assert together["a8_w4"]["metrics"]["sqnr_db"] < together["a8_w8"]["metrics"]["sqnr_db"]
    return together


def test_tensor_data_two_outputs_and_only(tmp_path):
    proto = tm.residual_add()
    proto.graph.output.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 64]))
    onnx.save(proto, tmp_path / "m.onnx")
    model = stages.open_model(tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", **tm.sample_inputs(model.proto, n=20))
    data = stages.open_data(tmp_path / "x.npz", model)
    stats = stages.calibrate_model(model, data)
    assert len(_check(model, data, stats)["a8_w8"]["outputs"]) == 2
    only = stages.open_data(tmp_path / "x.npz", model, output="y")
    assert "alone" in " ".join(_check(model, only, stats)["a8_w8"]["notes"])


def test_tensor_data_conv(tmp_path):
    onnx.save(tm.conv_net(), tmp_path / "m.onnx")
    x = np.random.default_rng(0).normal(0, 1, (24, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    model = stages.open_model(tmp_path / "m.onnx")
    data = stages.open_data(tmp_path / "x.npy", model)
    _check(model, data, stages.calibrate_model(model, data))


def _mixed_encoder():
    """tiny_encoder's token table followed by a MatMul (so quantization changes rows)."""
    m = tiny_encoder()
    w = np.random.default_rng(1).normal(0, 0.5, (8, 8)).astype(np.float32)
    g = m.graph
    g.node[1].output[0] = "emb"
    g.node.insert(2, helper.make_node("MatMul", ["emb", "w"], ["tokens"]))
    g.initializer.append(numpy_helper.from_array(w, "w"))
    return load_proto(m, "enc")


def pairs_file(path, n):
    """``n`` random query/document pairs of a 12-word vocabulary as JSONL at ``path``."""
    rng = np.random.default_rng(0)
    words = "file open read list dict sort join split path string number value".split()
    with open(path, "w") as f:
        for _ in range(n):
            q, d = (" ".join(rng.choice(words, rng.integers(2, 9))) for _ in range(2))
            f.write(json.dumps({"query": q, "document": d}) + "\n")
    return path


def test_text_retrieval_keeps_pooled_rows(tmp_path):
    model = _mixed_encoder()
    data = stages.open_data(str(pairs_file(tmp_path / "pairs.jsonl", 40)), model)
    batch = data.evaluation[0]
    out = run_model(model.proto, [batch]).batches[0]
    kept = data.task.keep(out, batch)
    assert out[0].ndim == 3 and kept[0].shape == (out[0].shape[0], out[0].shape[2])
    res = _check(model, data, stages.calibrate_model(model, data))
    assert "recall@1" in res["a8_w8"]["metrics"]


def test_sts_keeps_pooled_rows(tmp_path):
    model = _mixed_encoder()
    data = stages.open_data(str(_tsv(tmp_path / "p.tsv")), model)
    res = _check(model, data, stages.calibrate_model(model, data))
    assert "score_agreement" in res["a8_w8"]["metrics"]


def _tiny_face_net():
    """[B,3,112,112] -> strided conv -> relu -> flatten -> 32-d (the arcface chip size)."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0, 0.2, (8, 3, 8, 8)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.normal(0, 0.05, (8 * 14 * 14, 32)).astype(np.float32), "fc")
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], strides=[8, 8]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["embedding"])]
    graph = helper.make_graph(
        nodes, "face", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                      ["B", 3, 112, 112])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["B", 32])], [w, fc])
    return load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                        ir_version=8), "face")


def test_face_verification(tmp_path):
    model = _tiny_face_net()
    data = stages.open_data("faces", model)
    res = _check(model, data, stages.calibrate_model(model, data))
    assert "decision_agreement" in res["a8_w8"]["metrics"]


@pytest.mark.slow
def test_minilm_l3_stdlib_docs_as_held():
    """20 pairs: two evaluation batches (32 texts of 74 tokens, 8 cut at 256), so the
    streamed scoring spans batches of different lengths, one ragged; the stats from every
    4th calibration batch (11 to 67 tokens): both ways quantize with the same ones."""
    model = stages.open_model("minilm-l3")
    data = stages.open_data("stdlib-docs", model, max_pairs=20)
    assert [b["input_ids"].shape for b in data.evaluation] == [(32, 74), (8, 256)]
    few = dataclasses.replace(data, calibration=data.calibration[::4])
    _check(model, data, stages.calibrate_model(model, few))


def _patch_tokens(seed=0):
    """[B, 3, 224, 224] -> 56-px patches -> tokens [B, 16, 8] (token 0 plays CLS)."""
    r = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["pixel_values", "w", "b"], ["c"], strides=[56, 56]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("Transpose", ["f"], ["tokens"], perm=[0, 2, 1])]
    graph = helper.make_graph(
        nodes, "patches",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["N", 16, 8])],
        [numpy_helper.from_array(r.normal(0, 0.02, (8, 3, 56, 56)).astype(np.float32), "w"),
         numpy_helper.from_array(r.normal(0, 0.1, 8).astype(np.float32), "b"),
         numpy_helper.from_array(np.array([0, 8, 16], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_image_view_retrieval_keeps_cls_and_patch_mean(tmp_path):
    onnx.save(_patch_tokens(), tmp_path / "vit.onnx")
    model = stages.open_model(tmp_path / "vit.onnx")
    data = stages.open_data("photos-small", model)
    stats = stages.calibrate_model(model, data)
    out = _check(model, data, stats)["a8_w8"]["metrics"]
    assert "recall@1_patch_mean" in out and "top1_agreement" in out
    batch = data.evaluation[0]
    raw = run_model(model.proto, [batch]).batches[0]
    small = data.task.keep(raw, batch)
    assert small[0].shape == (len(raw[0]), 2, 8) and raw[0].shape[1] == 16
