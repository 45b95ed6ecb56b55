"""A keyword-spotting Conv1d classifier outside the zoo (audio models).

``mfcc [N, 10, 49]`` -> Conv1d -> BatchNormalization -> Relu -> MaxPool -> Conv1d -> Relu
-> GlobalAveragePool -> Flatten -> Gemm -> Softmax ``probs [N, 5]``: read as class scores.
A confident head puts some classes at 1e-20 next to one at ~1: those channels are dead
(below float32's resolution of the output's largest), quantize to 0, and are not a collapse.
Real ORT sessions; the CLI through ``main``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.cli import main

F, T, C, K, N = 10, 49, 16, 5, 32


def kws(head_scale: float, seed: int = 0) -> onnx.ModelProto:
    r = np.random.default_rng(seed)
    w = {"w1": r.normal(0, 0.3, (C, F, 3)), "b1": r.normal(0, 0.1, C),
         "g": r.uniform(0.5, 1.5, C), "bt": r.normal(0, 0.1, C), "mu": r.normal(0, 0.2, C),
         "var": r.uniform(0.5, 2, C), "w2": r.normal(0, 0.2, (C, C, 3)),
         "b2": r.normal(0, 0.1, C), "wf": r.normal(0, head_scale, (K, C)),
         "bf": r.normal(0, 0.1, K)}
    mk = helper.make_node
    nodes = [mk("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3], pads=[1, 1]),
             mk("BatchNormalization", ["c1", "g", "bt", "mu", "var"], ["bn"]),
             mk("Relu", ["bn"], ["r1"]),
             mk("MaxPool", ["r1"], ["p1"], kernel_shape=[2], strides=[2]),
             mk("Conv", ["p1", "w2", "b2"], ["c2"], kernel_shape=[3], pads=[1, 1]),
             mk("Relu", ["c2"], ["r2"]), mk("GlobalAveragePool", ["r2"], ["gap"]),
             mk("Flatten", ["gap"], ["fl"]), mk("Gemm", ["fl", "wf", "bf"], ["lg"], transB=1),
             mk("Softmax", ["lg"], ["probs"], axis=1)]
    graph = helper.make_graph(
        nodes, "kws", [helper.make_tensor_value_info("x", 1, ["N", F, T])],
        [helper.make_tensor_value_info("probs", 1, ["N", K])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _evaluate(tmp_path, head_scale: float, capsys) -> tuple[dict, str]:
    onnx.save(kws(head_scale), tmp_path / "kws.onnx")
    x = np.random.default_rng(1).normal(0, 1, (N, F, T)).astype(np.float32)
    np.savez(tmp_path / "kws.npz", x=x)
    args = [str(tmp_path / "kws.onnx"), "--data", str(tmp_path / "kws.npz")]
    assert main(["calibrate", *args, "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "stats.npz"),
                 "--precision", "a8_w8", "--json", str(tmp_path / "ev.json")]) == 0
    return json.loads((tmp_path / "ev.json").read_text()), capsys.readouterr().out


def test_dead_softmax_classes_are_not_a_collapse(tmp_path, capsys):
    """Before, the classes FP32 puts at 1e-24 (every one quantizes to 0) counted as
    collapsed channels and the result said ``NOT LIKE FP32: output(s) 'probs' lose what
    FP32 computes`` while every top-1 pick agrees; they are dead channels now, said so."""
    doc, out = _evaluate(tmp_path, 4.0, capsys)
    probs = doc["outputs"]["probs"]
    assert doc["metrics"]["top1_agreement"] == 1.0 and probs["collapsed_channels"] == 0
    assert "read as class scores" in out
    assert "NOT LIKE FP32" not in out
    (dead,) = [n for n in doc["notes"] if "are dead on this data" in n]
    assert dead.startswith("output 'probs': 3 of 5 channels of axis 1 quantize to one value")


def test_a_small_live_class_still_collapses(tmp_path, capsys):
    """A class FP32 keeps between 1e-5 and 3e-4 (above float32's resolution of 1) is
    erased by the 8-bit grid of [0, 1]: still a collapse, still NOT LIKE FP32."""
    doc, out = _evaluate(tmp_path, 0.5, capsys)
    assert doc["outputs"]["probs"]["collapsed_channels"] >= 1
    assert "NOT LIKE FP32" in out and "channels collapse" in out
    assert not [n for n in doc["notes"] if "are dead on this data" in n]


def _mel_front_end() -> onnx.ModelProto:
    """``wav [N, 800]`` -> STFT (frame 128, hop 64) -> power -> mel MatMul -> Log: an
    exported audio front-end (torchaudio's spectrogram at opset 17 writes an STFT)."""
    r = np.random.default_rng(2)
    mk = helper.make_node
    nodes = [mk("Unsqueeze", ["wav", "last"], ["w3"]),
             mk("STFT", ["w3", "hop", "win", ""], ["spec"], onesided=1),
             mk("Mul", ["spec", "spec"], ["sq"]),
             mk("ReduceSum", ["sq", "last"], ["pw"], keepdims=0),
             mk("MatMul", ["pw", "mel"], ["mp"]), mk("Add", ["mp", "eps"], ["me"]),
             mk("Log", ["me"], ["logmel"])]
    inits = {"last": np.array([-1], np.int64), "hop": np.array(64, np.int64),
             "win": np.hanning(128).astype(np.float32),
             "mel": np.abs(r.normal(0, 0.1, (65, 12))).astype(np.float32),
             "eps": np.array(1e-6, np.float32)}
    graph = helper.make_graph(
        nodes, "mel", [helper.make_tensor_value_info("wav", 1, ["N", 800])],
        [helper.make_tensor_value_info("logmel", 1, ["N", 11, 12])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_an_stft_front_end_is_said_left_float(tmp_path, capsys):
    """The STFT's DFT basis is a weight with no initializer: the emulator computes it in
    float inside its group, and the coverage said ``3 weight(s) ... quantized`` with
    nothing left float. It is now an op left float, with why, in the console and JSON."""
    onnx.save(_mel_front_end(), tmp_path / "mel.onnx")
    wav = np.random.default_rng(3).normal(0, 1, (16, 800)).astype(np.float32)
    np.savez(tmp_path / "mel.npz", wav=wav)
    args = [str(tmp_path / "mel.onnx"), "--data", str(tmp_path / "mel.npz")]
    assert main(["calibrate", *args, "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "stats.npz"),
                 "--precision", "a8_w8", "--json", str(tmp_path / "ev.json")]) == 0
    out = capsys.readouterr().out
    cov = json.loads((tmp_path / "ev.json").read_text())["coverage"]
    (op,) = cov["ops_float"]
    assert op["op_type"] == "STFT" and "DFT basis" in op["why"]
    assert "LEFT FLOAT" in out and "(STFT) left float: its DFT basis" in out


def test_data_of_the_wrong_shape_names_the_fix(tmp_path, capsys):
    """One MFCC saved without its sample axis (``[10, 49]``), and clips of 40 frames for a
    model of 49: both got ``the model wants ('?', 10, 49): reshape the data``; each line
    now says what is wrong and what to do, naming the model's dims."""
    onnx.save(kws(1.0), tmp_path / "kws.onnx")
    x = np.random.default_rng(1).normal(0, 1, (N, F, T)).astype(np.float32)
    cases = {"one.npz": (x[0], "[N, 10, 49]: it is one sample without the sample axis: "
                                "save it as np.expand_dims(x, 0)"),
             "short.npz": (x[:, :, :40], "[N, 10, 49]: axis 2 is 40, the model's 49: pad or "
                                         "crop the data to the model's size")}
    for name, (arr, said) in cases.items():
        np.savez(tmp_path / name, x=arr)
        code = main(["calibrate", str(tmp_path / "kws.onnx"), "--data", str(tmp_path / name),
                     "--out", str(tmp_path / "stats.npz")])
        err = capsys.readouterr().err
        assert code != 0 and "Traceback" not in err and said in err, err
        assert not (tmp_path / "stats.npz").exists()
