"""Audio front-ends and wake-word chains (openWakeWord's melspectrogram.onnx ->
embedding_model.onnx -> a head): each defect found on the real models, reproduced on a
model built here."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.serde import read_stats


def _save(tmp_path, nodes, inputs, outputs, inits, opset=13, name="m.onnx"):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, tmp_path / name)
    return str(tmp_path / name)


# ------------------------------- 1. a reduction over every axis mixes the samples of a run


def _normalised(tmp_path):
    """``x [N, 8] -> MatMul -> ReduceMax (every axis) -> y - max``: openWakeWord's
    front-end normalises to its loudest value with a ReduceMax over every axis, so a
    batch of clips is normalised to the loudest clip's."""
    w = numpy_helper.from_array(np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMax", ["h"], ["m"], keepdims=0),
             helper.make_node("Sub", ["h", "m"], ["y"])]
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])


def test_a_reduction_over_the_samples_runs_each_sample_alone(tmp_path, capsys):
    model = _normalised(tmp_path)
    x = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    x[::7] *= 30  # a few loud samples: batched, they set every other sample's maximum
    np.savez(tmp_path / "x.npz", x=x)
    s, e = str(tmp_path / "s.npz"), str(tmp_path / "e.json")
    assert main(["calibrate", model, "--data", str(tmp_path / "x.npz"), "--out", s]) == 0
    assert main(["evaluate", model, "--data", str(tmp_path / "x.npz"), "--stats", s,
                 "--precision", "a8_w8", "--json", e]) == 0
    out = capsys.readouterr()
    assert "(over every axis, the samples' too) mixes the samples of a run" in out.out + out.err
    # the stats' range of h is the per-sample function's: the largest |y| of one sample is
    # its own spread, not the spread to the loudest sample of a batch
    sess = ort.InferenceSession(model)
    alone = np.concatenate([sess.run(None, {"x": r[None]})[0] for r in x])
    batched = sess.run(None, {"x": x[:32]})[0]
    assert not np.allclose(alone[:32], batched)  # the model does mix them
    y = read_stats(s).tensors["y"]
    assert np.isclose(y.min, alone.min(), rtol=1e-6) and y.max == 0.0
    notes = json.loads((tmp_path / "e.json").read_text())["notes"]
    assert any("mixes the samples of a run" in n for n in notes)


def test_run_verdict_json_carries_the_data_notes(tmp_path, capsys):
    """The sample-mixing note (the model runs one sample per run) was on the console and in
    the report, not in verdict.json: every data note is there now (``data_notes``)."""
    model = _normalised(tmp_path)
    x = np.random.default_rng(0).normal(size=(24, 8)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    w = tmp_path / "W"
    assert main(["run", model, "--data", str(tmp_path / "x.npz"), "--target", "hailo8",
                 "--finetune", "off", "--out", str(w)]) == 0
    capsys.readouterr()
    v = json.loads((w / "verdict.json").read_text())
    assert any("mixes the samples of a run" in n for n in v["data_notes"]), v["data_notes"]


def test_sample_mixers_reads_the_axes_of_each_reduction(tmp_path):
    from quantscope.model.load import load
    from quantscope.model.mixing import sample_mixers

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    ax0 = numpy_helper.from_array(np.array([0], np.int64), "ax0")
    ax1 = numpy_helper.from_array(np.array([-1], np.int64), "ax1")
    nodes = [helper.make_node("ReduceMean", ["x", "ax0"], ["a"], name="over_samples"),
             helper.make_node("ReduceMean", ["x", "ax1"], ["b"], name="per_sample"),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model = load(_save(tmp_path, nodes, [x], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, ["N", 1])], [ax0, ax1], opset=18))
    assert sample_mixers(model, ("x",), "N") == [
        "ReduceMean 'over_samples' (over axis 0, the samples' 'N')"]
    assert sample_mixers(model, ("x",), None) == []


# ------------------------- 2. int16-scale audio is no attention mask (analyze's outliers)


def test_a_wide_signal_is_not_called_an_attention_mask(tmp_path):
    import dataclasses

    from quantscope.analyze.outliers import find_outliers
    from quantscope.calibrate.collect import calibrate
    from quantscope.model.groups import find_groups
    from quantscope.model.load import load

    model = load(_normalised(tmp_path))
    groups = find_groups(model)
    x = np.random.default_rng(0).normal(0, 8000, size=(8, 8)).clip(-32768, 32767)
    stats = calibrate(model, groups, [{"x": x.astype(np.float32)}])
    audio = stats.tensors["x"]
    assert audio.min < -1e4 and audio.max > 1e4
    assert not [o for o in find_outliers(stats, groups) if o.kind == "mask_range"]
    # a real fill far below the values is still one
    masked = dataclasses.replace(stats, tensors={**stats.tensors, "x": dataclasses.replace(
        audio, min=-3.4e38)})
    assert [o.tensor for o in find_outliers(masked, groups) if o.kind == "mask_range"] == ["x"]


# ------------------- 3. a Log of a power spectrum on a linear grid: said, with why and the fix


def _log_power(tmp_path):
    """``x [N, 16] -> Mul x x (power) -> MatMul (a mel bank, positive) -> Clip(1e-10) -> Log``:
    a power spectrum spans many decades, which a linear 8- or 16-bit grid cannot hold."""
    r = np.random.default_rng(2)
    mel = numpy_helper.from_array(r.uniform(0, 1, (16, 4)).astype(np.float32), "mel")
    lo = numpy_helper.from_array(np.array(1e-10, np.float32), "lo")
    nodes = [helper.make_node("Mul", ["x", "x"], ["p"]),
             helper.make_node("MatMul", ["p", "mel"], ["m"]),
             helper.make_node("Clip", ["m", "lo"], ["c"]),
             helper.make_node("Log", ["c"], ["y"])]
    model = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [mel, lo])
    x = (r.normal(size=(64, 16)) * np.exp(r.uniform(-6, 6, (64, 1)))).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    return model, str(tmp_path / "x.npz")


def test_a_log_of_a_linear_grid_is_said_in_analyze_and_the_run_verdict(tmp_path, capsys):
    model, data = _log_power(tmp_path)
    out = tmp_path / "run"
    assert main(["run", model, "--data", data, "--target", "hailo8l", "--out", str(out)]) == 0
    console = capsys.readouterr().out
    analysis = json.loads((out / "analysis.json").read_text())
    floors = [o for o in analysis["outliers"] if o["kind"] == "log_floor"]
    assert [o["tensor"] for o in floors] == ["c"]
    assert "keeps the top 2.4 decades (8 bit) or 4.8 (16 bit)" in floors[0]["reason"]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["log_floors"][0].startswith("c: Log 'Log_3' reads 'c' on a linear grid")
    assert "warning: c: Log 'Log_3' reads 'c' on a linear grid" in console
    assert "feed the device the Log's output" in console


# ----------- 4. a TF export's [N, C, 1, 1] -> [N, 1, 1, C] output keeps its channel axis


def _embedder(tmp_path):
    """``x [N, 3, 4, 4] -> Conv (8 channels, one 300x the others) -> [N, 8, 1, 1] ->
    Reshape [-1, 1, 1, 8]``: openWakeWord's embedding_model.onnx ends so (96 features)."""
    r = np.random.default_rng(3)
    w = r.normal(0, 0.1, (8, 3, 4, 4)).astype(np.float32)
    w[0] *= 300
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Reshape", ["c", "shape"], ["emb"])]
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(np.array([-1, 1, 1, 8], np.int64), "shape")]
    model = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                  ["N", 3, 4, 4])],
                  [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["M", 1, 1, 8])], inits)
    np.savez(tmp_path / "x.npz", x=r.normal(size=(32, 3, 4, 4)).astype(np.float32))
    return model, str(tmp_path / "x.npz")


def test_the_features_of_a_reshaped_conv_output_are_scored_per_channel(tmp_path, capsys):
    from quantscope.model.axes import output_channel_axes
    from quantscope.model.load import load

    model, data = _embedder(tmp_path)
    assert output_channel_axes(load(model)) == {"emb": 3}
    s, e = str(tmp_path / "s.npz"), tmp_path / "e.json"
    assert main(["calibrate", model, "--data", data, "--out", s]) == 0
    assert main(["evaluate", model, "--data", data, "--stats", s, "--precision", "a8_w8",
                 "--json", str(e)]) == 0
    m = json.loads(e.read_text())["metrics"]
    # the small features share the large one's 8-bit grid: per channel they read far worse
    assert m["sqnr_db_channel_min"] < m["sqnr_db"] - 20
    assert "of 8 channels collapse" in capsys.readouterr().out


# --------- 5. a wake-word score: FP32's few positives counted apart from the many negatives


def _wake(tmp_path):
    """``x [N, 8] -> Gemm (bias -6) -> Sigmoid score [N, 1]``: near 0 but on 3 samples."""
    r = np.random.default_rng(4)
    w = numpy_helper.from_array(r.normal(0, 1, (8, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.array([-6.0], np.float32), "b")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["score"])]
    model = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                  [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N", 1])], [w, b])
    x = r.normal(0, 1, (80, 8)).astype(np.float32)
    x[:3] = 4 * np.sign(numpy_helper.to_array(w).ravel())  # 3 wake words
    np.savez(tmp_path / "x.npz", x=x)
    return model, x


def test_analyze_judges_no_score_by_the_cosine_of_one_value(tmp_path, capsys):
    """A one-value row's cosine is its sign agreement: 0 wherever a small score rounds to 0.
    analyze said 'NOT LIKE FP32 (mean cosine to FP32 0.205)' of openWakeWord's alexa head."""
    model, _ = _wake(tmp_path)
    s, a = str(tmp_path / "s.npz"), tmp_path / "a.json"
    assert main(["calibrate", model, "--data", str(tmp_path / "x.npz"), "--out", s]) == 0
    for layout in ([], ["--layout", "score=tensor"]):
        assert main(["analyze", model, "--data", str(tmp_path / "x.npz"), "--stats", s,
                     "--target", "hailo8l", "--out", str(a), *layout]) == 0
        assert "NOT LIKE FP32" not in capsys.readouterr().out
        base = json.loads(a.read_text())["baselines"]
        assert all("cosine_mean" not in m for m in base.values()), base


def test_a_score_note_counts_fp32s_positives_and_what_the_quantized_model_keeps(tmp_path, capsys):
    model, x = _wake(tmp_path)
    s = str(tmp_path / "s.npz")
    assert main(["calibrate", model, "--data", str(tmp_path / "x.npz"), "--out", s]) == 0
    assert main(["evaluate", model, "--data", str(tmp_path / "x.npz"), "--stats", s,
                 "--precision", "a8_w8"]) == 0
    out = capsys.readouterr().out
    sess = ort.InferenceSession(model)
    pos = int((sess.run(None, {"x": x})[0] > 0.5).sum())
    assert 0 < pos < 0.05 * len(x)
    assert f"FP32 decides {pos} of 80 positive: the quantized model keeps {pos} of them" in out
    assert f"(the agreement is mostly the negatives': judge the {pos} others" in out


# ------- 6. an If on a score (hey_jarvis: a verifier when the score is >= 0.5) cannot be folded


def _gated(tmp_path, cond_from_data: bool):
    then = helper.make_graph([helper.make_node("Sigmoid", ["z"], ["v"])], "then", [],
                             [helper.make_tensor_value_info("v", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["p"], ["q"])], "else", [],
                              [helper.make_tensor_value_info("q", TensorProto.FLOAT, None)])
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 1, (8, 1)).astype(np.float32), "w")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    flag = numpy_helper.from_array(np.array(True), "flag")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p"])]
    if cond_from_data:
        nodes.append(helper.make_node("GreaterOrEqual", ["p", "half"], ["c"]))
    nodes.append(helper.make_node("If", ["c" if cond_from_data else "flag"], ["y"],
                                  then_branch=then, else_branch=other, name="gate"))
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], [w, half, flag])


def test_an_if_on_the_data_is_refused_naming_the_split_not_a_fold(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))
    model = _gated(tmp_path, True)
    assert main(["calibrate", model, "--data", str(tmp_path / "x.npy"), "--out",
                 str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "quantscope: error: node 'gate' is control flow (If), which quantscope cannot emulate: "
        "its condition 'c' is computed from the data (input 'x'), so the branch differs per "
        "sample and no fold keeps the model: export one model per path, the graph up to the "
        "tensors the If reads ('p', 'z') and each branch ('else_branch' (1 node), "
        "'then_branch' (1 node)) as a model of its own, measure each, and pick the branch on "
        "the host")
    assert not (tmp_path / "s.npz").exists()
    assert main(["calibrate", _gated(tmp_path, False), "--data", str(tmp_path / "x.npy"),
                 "--out", str(tmp_path / "s.npz")]) == 2
    assert "fold it for your inputs and re-export" in capsys.readouterr().err


def test_a_sigmoid_score_is_judged_by_its_decisions_not_its_sqnr(tmp_path, capsys):
    """openWakeWord's alexa head ([1, 16, 96] -> Gemm ... -> Sigmoid [1, 1]) was planned by
    the worst channel's SQNR of its score (0.0 dB at a8_w8 on clips whose scores are all
    near 0), and its plan bought 7.4x the cost for it; the decisions never moved."""
    r = np.random.default_rng(5)
    w = numpy_helper.from_array(r.normal(0, 1, (8, 1)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p"]),
             helper.make_node("Reshape", ["p", "flat"], ["score"])]
    model = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                  [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["N"])], [w, shape])
    np.savez(tmp_path / "x.npz", x=r.normal(0, 1, (64, 8)).astype(np.float32))
    out = tmp_path / "run"
    assert main(["run", model, "--data", str(tmp_path / "x.npz"), "--target", "hailo8l",
                 "--out", str(out)]) == 0
    console = capsys.readouterr()
    assert "output 'score' read as one score per sample, decided at 0.5 (a Sigmoid" in \
        console.out + console.err
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["metric"] == "decision_agreement"
    assert console.out.count("verdict: no --goal given; decision_agreement ") == 1


def test_an_if_on_a_rank0_setting_still_names_the_fold(tmp_path, capsys):
    """silero VAD (npm @ricky0123/vad-web's silero_vad_v5.onnx, openWakeWord's bundled
    silero_vad.onnx): an If on Equal(sr, 16000), sr a rank-0 input: a fold fixes it."""
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    k = numpy_helper.from_array(np.array(16000, np.int64), "k")
    nodes = [helper.make_node("Equal", ["sr", "k"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="rate")]
    model = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                                    helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [k])
    np.savez(tmp_path / "x.npz", x=np.ones((4, 4), np.float32), sr=np.array(16000))
    assert main(["calibrate", model, "--data", str(tmp_path / "x.npz"), "--out",
                 str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err
    assert "node 'rate' is control flow (If)" in err and "fold it for your inputs" in err


def test_a_state_whose_samples_lie_on_an_unnamed_axis_is_told_its_batch_axis(tmp_path, capsys):
    """silero VAD v5 (npm @ricky0123/vad-web 0.0.31): ``input ['', '']`` and ``state [2, '',
    128]`` with unnamed dims: the state's samples on axis 1 were refused with 'give every
    input the same sample count' and no word of which axis or flag."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["state", "y"], ["s2"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4]),
              helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, None, 4])],
        [helper.make_tensor_value_info("s2", TensorProto.FLOAT, [2, None, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.ones((6, 4), np.float32), state=np.zeros((2, 6, 4), np.float32))
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--out", str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err
    assert "its axis 1 holds 6, the others' count: --batch-axis state=1" in err
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--batch-axis", "state=1", "--out", str(tmp_path / "s.npz")]) == 0


def test_evaluate_says_the_log_floor_where_the_plan_quantizes_it(tmp_path, capsys):
    model, data = _log_power(tmp_path)
    s = str(tmp_path / "s.npz")
    assert main(["calibrate", model, "--data", data, "--out", s]) == 0
    assert main(["evaluate", model, "--data", data, "--stats", s, "--precision", "a16_w16"]) == 0
    out = capsys.readouterr().out
    assert "note: Log 'Log_3' reads 'c' on a linear grid" in out and "; fix: compute the chain" in out
    assert main(["evaluate", model, "--data", data, "--stats", s, "--precision", "float"]) == 0
    assert "on a linear grid" not in capsys.readouterr().out


def test_a_reduction_of_a_shape_mixes_no_samples(tmp_path):
    """torch's flatten exports ReduceProd over Shape(x)[1:] (int64, every axis): no data."""
    from quantscope.model.load import load
    from quantscope.model.mixing import sample_mixers

    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "one", "big"], ["tail"]),
             helper.make_node("ReduceProd", ["tail"], ["n"], keepdims=1),
             helper.make_node("Concat", ["minus", "n"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [one, numpy_helper.from_array(np.array([9], np.int64), "big"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus")]
    model = load(_save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])], inits))
    assert sample_mixers(model, ("x",), "N") == []


def test_the_share_of_fp32_positives_is_written_in_percent():
    """evaluate printed 'decisions_positive_fp32  0.09639' beside 'decision_agreement 100.0 %'."""
    from quantscope.units import value

    assert value("decisions_positive_fp32", 0.09639) == "9.6 %"
    assert value("mask_share_fp32", 0.5) == "50.0 %"


def test_a_score_far_from_its_threshold_is_not_called_lost_for_a_tiny_range(tmp_path, capsys):
    """openWakeWord's alexa head on held-out clips without the word: FP32 1e-7 .. 4.5e-5,
    the 8-bit grid reads 0, |error| 4.5e-5 = '100.3 % of FP32's range': 'NOT LIKE FP32:
    lose what FP32 computes', while every decision agreed and none was near 0.5."""
    model, x = _wake(tmp_path)
    r = np.random.default_rng(6)  # no wake word: every score far below 0.5, in 1e-7 .. 1e-4
    neg = (-0.5 * x[:1] + r.normal(0, 0.3, (20, 8))).astype(np.float32)
    np.savez(tmp_path / "neg.npz", x=neg)
    s = str(tmp_path / "s.npz")
    assert main(["calibrate", model, "--data", str(tmp_path / "x.npz"), "--out", s]) == 0
    assert main(["evaluate", model, "--data", str(tmp_path / "neg.npz"), "--stats", s,
                 "--precision", "a8_w8", "--layout", "score=tensor"]) == 0
    out = capsys.readouterr().out
    assert "of FP32's range" in out and "NOT LIKE FP32" not in out
    assert "so not a loss" in out
