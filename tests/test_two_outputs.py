"""Every output is measured: a degraded second head drives the ranking and the metrics."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope import stages
from quantscope.analyze import analyze
from quantscope.analyze.scoring import outputs_scorer
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision


def _two_heads() -> onnx.ModelProto:
    """Head A is benign; head B reads a tensor whose channel 0 is ~1000x the others."""
    r = np.random.default_rng(0)
    w1 = r.normal(0, 0.5, (8, 16)).astype(np.float32)
    wa = r.normal(0, 0.3, (16, 4)).astype(np.float32)
    wb = r.normal(0, 0.3, (16, 16)).astype(np.float32)
    wb[:, 0] *= 3000.0  # an outlier channel in head B's hidden tensor
    wc = r.normal(0, 0.3, (16, 4)).astype(np.float32)
    wc[0, :] = 0.0  # ... which head B's output does not even use
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((w1, "w1"), (wa, "wa"), (wb, "wb"), (wc, "wc"))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="trunk"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("MatMul", ["hr", "wa"], ["head_a"], name="head_a"),
             helper.make_node("MatMul", ["hr", "wb"], ["hb"], name="hidden_b"),
             helper.make_node("MatMul", ["hb", "wc"], ["head_b"], name="head_b")]
    g = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("head_a", onnx.TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("head_b", onnx.TensorProto.FLOAT, ["N", 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _setup():
    model = load_proto(_two_heads(), "two")
    x = np.random.default_rng(1).normal(0, 1, (64, 8)).astype(np.float32)
    feeds = tuple({"x": x[i:i + 16]} for i in range(0, 64, 16))
    data = Dataset(name="x", calibration=feeds, evaluation=feeds)
    return model, data, stages.calibrate_model(model, data)


def test_evaluate_scores_both_outputs_and_reports_the_worst():
    model, data, stats = _setup()
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8))
    a, b = res["outputs"]["head_a"]["sqnr_db"], res["outputs"]["head_b"]["sqnr_db"]
    assert b < a - 10  # head B is the degraded one
    assert res["metrics"]["sqnr_db"] == b
    assert any("2 outputs scored" in n and "head_b" in n for n in res["notes"])
    assert "output head_b: sqnr_db" in stages.format_result(res)


def test_the_worse_output_drives_the_ranking():
    model, data, stats = _setup()
    groups = find_groups(model)
    an = analyze(model, groups, stats, data.evaluation, scorer=outputs_scorer(),
                 proxy_fraction=1.0, recover_top=(1,))
    assert an.offenders[0].group == "hidden_b"
    assert an.offenders[0].score_db > 10
    low = an.baselines["a8_w8"]
    assert low["sqnr_db"] == min(low["sqnr_db:0"], low["sqnr_db:1"])


def test_a_degraded_output_is_called_not_like_fp32():
    model, data, stats = _setup()
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8))
    worst = min(v["cosine_mean"] for v in res["outputs"].values())
    said = any(n.startswith("NOT LIKE FP32") for n in res["notes"])
    assert said == (worst < 0.9)
    fine = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A16_W16))
    assert not any(n.startswith("NOT LIKE FP32") for n in fine["notes"])


def test_output_flag_scores_one_output_alone(tmp_path, capsys):
    import json

    from quantscope.cli import main

    m, x, s, r = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(_two_heads(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (64, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--output", "head_a", "--json", str(r)]) == 0
    res = json.loads(r.read_text())
    assert res["metrics"]["sqnr_db"] == res["outputs"]["head_a"]["sqnr_db"]
    assert any("--output" in n for n in res["notes"])
    a = tmp_path / "a.json"
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(s), "--output", "head_a",
                 "--proxy", "1.0", "--out", str(a)]) == 0
    assert json.loads(a.read_text())["offenders"][0]["group"] != "hidden_b"
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--output", "nope"]) == 2
    assert "no output of the model" in capsys.readouterr().err
