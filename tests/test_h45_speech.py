"""Speech models a user brings (h45): a TTS whose frame count is the sum of durations it
predicts (hibari-tts' length regulator: ``Exp``, ``Round``, ``Clip``, ``ReduceSum`` of the
durations, a ``Range`` over the frames). A duration the quantized model rounds otherwise
gives an output of another length: that was an internal error (``row cosine: shapes
differ, (1, 601, 154) vs (1, 601, 158)``); it is one line naming the op and the float
tensor to split the model at, before any work."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.model.dynamic import value_sized_sources
from quantscope.model.load import load_proto


def tts_model(limit_from: str = "durations") -> onnx.ModelProto:
    """``ids [1, L]`` int64 -> durations (a Gather, a MatMul, ``Exp``) -> frames: an
    output ``[1, F]`` whose F is the sum of the rounded durations (``limit_from=
    "durations"``), the input's length (``"shape"``) or the ids' own values (``"ids"``)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (12, 4)).astype(np.float32), "table"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
             helper.make_node("MatMul", ["emb", "w"], ["logd"], name="dur_proj"),
             helper.make_node("Exp", ["logd"], ["dur"], name="exp"),
             helper.make_node("Round", ["dur"], ["dur_r"], name="round"),
             helper.make_node("ReduceMean", ["emb"], ["level"], keepdims=0, name="level")]
    if limit_from == "durations":
        nodes += [helper.make_node("Cast", ["dur_r"], ["dur_i"], to=TensorProto.INT64),
                  helper.make_node("ReduceSum", ["dur_i"], ["total"], keepdims=0)]
    elif limit_from == "shape":
        nodes += [helper.make_node("Shape", ["dur"], ["dshape"]),
                  helper.make_node("ReduceProd", ["dshape"], ["total"], keepdims=0)]
    else:
        nodes += [helper.make_node("ReduceSum", ["ids"], ["total"], keepdims=0)]
    nodes += [helper.make_node("Range", ["zero", "total", "one"], ["frames_i"], name="frames"),
              helper.make_node("Cast", ["frames_i"], ["frames_f"], to=TensorProto.FLOAT),
              helper.make_node("Unsqueeze", ["frames_f", "ax0"], ["frames"]),
              helper.make_node("Mul", ["frames", "level"], ["audio"], name="out")]
    g = helper.make_graph(
        nodes, "tts", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "L"])],
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, "F"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_size_from_computed_durations_is_found():
    found = value_sized_sources(load_proto(tts_model()))
    assert found == {"audio": ("Range", "frames", "dur_r")}


def test_a_size_from_shapes_or_int_input_values_is_not():
    # the input's length (a Shape) and the ids' sum are the same in FP32 and quantized
    assert value_sized_sources(load_proto(tts_model("shape"))) == {}
    assert value_sized_sources(load_proto(tts_model("ids"))) == {}


def test_calibrate_refuses_it_in_one_line(tmp_path, capsys):
    m, x, s = tmp_path / "tts.onnx", tmp_path / "ids.npy", tmp_path / "s.npz"
    onnx.save(tts_model(), m)
    np.save(x, np.random.default_rng(1).integers(1, 12, (6, 9)).astype(np.int64))
    rc = main(["calibrate", str(m), "--data", str(x), "--out", str(s)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert not s.exists()
    assert "internal error" not in err and len(err.strip().splitlines()) == 1
    assert "output 'audio' has a size set by values the model computes" in err
    assert "Range 'frames' takes its size from 'dur_r'" in err
    assert "split the model there" in err


def squeezed_model() -> onnx.ModelProto:
    """``x [1, 8]`` (one sample per run) -> ``y [6]``: the batch axis squeezed out, as
    hibari-tts' durations ``[L]`` of its ``ids [1, L]``."""
    w = numpy_helper.from_array(
        np.random.default_rng(0).normal(0, 0.5, (8, 6)).astype(np.float32), "w")
    ax = numpy_helper.from_array(np.array([0], np.int64), "ax")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Squeeze", ["h", "ax"], ["y"], name="squeeze")]
    g = helper.make_graph(
        nodes, "squeezed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])], [w, ax])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_an_output_without_a_sample_axis_is_refused(tmp_path, capsys):
    """Its 6 values per run had been read as 6 samples (60 "samples" of one value for 10
    fed): a score per sample, "decided as FP32" on every one, and no cosine."""
    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "s.npz"
    onnx.save(squeezed_model(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (10, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    capsys.readouterr()
    rc = main(["evaluate", str(m), "--data", str(x), "--stats", str(s),
               "--precision", "a8_w8"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1
    assert "output 'y' has shape (6,) for one sample" in err
    assert "Unsqueeze of axis 0" in err


def test_an_argmax_per_step_names_the_ctc_layout_too(tmp_path, capsys):
    """hibari's G2P outputs only ``ids [1, T]``, the ``ArgMax`` of CTC logits
    ``[1, T, C]``: the refusal named ``--layout OUT=class`` alone."""
    w = numpy_helper.from_array(
        np.random.default_rng(0).normal(0, 0.5, (8, 12)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="head"),
             helper.make_node("ArgMax", ["logits"], ["ids"], axis=-1, keepdims=0)]
    g = helper.make_graph(
        nodes, "g2p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 8])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "T"])], [w])
    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (4, 5, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err
    assert "--layout OUT=class (per step), or --layout OUT=ctc where the host" in err


def test_fp32_own_ties_are_not_blamed_on_the_grid(tmp_path, capsys):
    """A CTC encoder's log-probabilities on frames past its lengths input are uniform in
    FP32 already (the frames masked to 0): 285 of 800 such positions had been counted in
    ``top1_ties`` as ties "the grid step merges"."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (8, 6)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="head"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax")]
    g = helper.make_graph(
        nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 6])], [w])
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), m)
    data = rng.normal(0, 1, (40, 8)).astype(np.float32)
    data[20:] = 0  # masked positions: every class equal in FP32
    np.save(x, data)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s),
                 "--precision", "a8_w8", "--json", str(j)]) == 0
    import json

    result = json.loads(j.read_text())
    values = result["metrics"]
    assert values["top1_ties_fp32"] == 0.5
    assert values["top1_ties"] < 0.5
    assert any("on 20 of 40 samples FP32's own top score is shared" in n
               for n in result["notes"])


def asr_model() -> onnx.ModelProto:
    """An icefall-style CTC encoder's signature: ``x [N, T, 4]``, ``x_lens [N]`` int64 ->
    ``log_probs [N, T, 7]`` (a LogSoftmax) and ``log_probs_len [N]``; frames past the
    lengths are not masked (they hold whatever the padding gives)."""
    w = numpy_helper.from_array(
        np.random.default_rng(0).normal(0, 1.5, (4, 7)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="head"),
             helper.make_node("LogSoftmax", ["logits"], ["log_probs"], axis=-1),
             helper.make_node("Identity", ["x_lens"], ["log_probs_len"])]
    g = helper.make_graph(
        nodes, "asr", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 4]),
                       helper.make_tensor_value_info("x_lens", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["N", "T", 7]),
         helper.make_tensor_value_info("log_probs_len", TensorProto.INT64, ["N"])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_ctc_decodes_each_sample_up_to_its_lengths(tmp_path, capsys):
    """A host decodes ``log_probs_len`` frames of each utterance; the frames past it (the
    padding of a batch) had been decoded too, their labels counted in every figure."""
    import json

    import onnxruntime as ort

    from quantscope.tasks.ctc import greedy_decode

    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (12, 10, 4)).astype(np.float32)
    lens = rng.integers(3, 7, 12).astype(np.int64)
    m, d, s, j = (tmp_path / n for n in ("asr.onnx", "asr.npz", "s.npz", "r.json"))
    onnx.save(asr_model(), m)
    np.savez(d, x=x, x_lens=lens)
    assert main(["calibrate", str(m), "--data", str(d), "--out", str(s)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(m), "--data", str(d), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", "log_probs=ctc:lengths=log_probs_len",
                 "--json", str(j)]) == 0, capsys.readouterr().err
    result = json.loads(j.read_text())
    lp = ort.InferenceSession(str(m)).run(["log_probs"], {"x": x, "x_lens": lens})[0]
    want = sum(len(greedy_decode(lp[k:k + 1, :n], 0)[0]) for k, n in enumerate(lens))
    whole = sum(len(t) for t in greedy_decode(lp, 0))
    assert want < whole  # the padding decodes to labels of its own
    assert result["metrics"]["chars_fp32"] == want
    assert any("each sample's first 'log_probs_len' steps" in n for n in result["notes"])


def test_ctc_lengths_must_be_an_integer_output(tmp_path, capsys):
    m, d = tmp_path / "asr.onnx", tmp_path / "asr.npz"
    onnx.save(asr_model(), m)
    np.savez(d, x=np.ones((4, 10, 4), np.float32), x_lens=np.full(4, 5, np.int64))
    assert main(["calibrate", str(m), "--data", str(d), "--out", str(tmp_path / "s.npz")]) == 0
    capsys.readouterr()
    rc = main(["evaluate", str(m), "--data", str(d), "--precision", "a8_w8",
               "--stats", str(tmp_path / "s.npz"), "--layout",
               "log_probs=ctc:lengths=x_lens"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "lengths=x_lens is no integer output of the model" in err
    assert "'log_probs_len'" in err


def test_log_probs_per_step_name_the_ctc_layout(tmp_path, capsys):
    """The encoder's ``log_probs`` is found as per-step class scores (its LogSoftmax); the
    note said nothing of CTC, whose strings a per-step top-1 (mostly the blank's) hides."""
    rng = np.random.default_rng(3)
    m, d, s = tmp_path / "asr.onnx", tmp_path / "asr.npz", tmp_path / "s.npz"
    onnx.save(asr_model(), m)
    np.savez(d, x=rng.normal(0, 1, (6, 10, 4)).astype(np.float32),
             x_lens=np.full(6, 10, np.int64))
    assert main(["calibrate", str(m), "--data", str(d), "--out", str(s)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(m), "--data", str(d), "--stats", str(s),
                 "--precision", "a8_w8"]) == 0
    out = capsys.readouterr().out
    assert "--layout log_probs=ctc[:blank=B,lengths=LEN] judges the decoded strings" in out


def test_an_input_of_one_value_is_said(tmp_path, capsys):
    """A streaming encoder calibrated on its first chunks only (caches all 0) or a TTS's
    ``speed`` saved once (1.0): the input's grid is that value's alone, so the carried
    states or another speed clip in deployment while every figure here looks right."""
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "cache"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="fc")]
    g = helper.make_graph(
        nodes, "stream", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                          helper.make_tensor_value_info("cache", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], [w])
    m, d = tmp_path / "s.onnx", tmp_path / "d.npz"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), m)
    np.savez(d, x=rng.normal(0, 1, (16, 8)).astype(np.float32),
             cache=np.zeros((16, 8), np.float32))
    assert main(["calibrate", str(m), "--data", str(d), "--out", str(tmp_path / "st.npz")]) == 0
    out = capsys.readouterr().err
    assert "input 'cache' holds one value (0) over all the data" in out
    assert "input 'x' holds" not in out
