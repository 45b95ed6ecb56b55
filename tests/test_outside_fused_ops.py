"""An encoder after ONNX Runtime's transformer optimiser: ``com.microsoft`` fused ops
(issue: models beyond the zoo).

``onnxruntime.transformers.optimizer.optimize_model(minilm-l3, model_type='bert')`` gives
EmbedLayerNormalization, Attention x3, SkipLayerNormalization x6, BiasGelu x3. ``run`` on
it stopped in calibration with ``internal error: ValueError: zip() argument 2 is longer
than argument 1`` (exit 3); a fused node cannot be grouped or quantized (its weights and
intermediates are inside it) and the NPU compilers take standard ops only. Every command
now refuses such a model before any work, in one line naming the ops and the fix.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main

VOCAB = 30522  # the packaged tokenizer's
WIDTH = 8


def fused_encoder() -> onnx.ModelProto:
    """word rows -> SkipLayerNormalization (with a constant position row) -> MatMul ->
    FastGelu -> MatMul: the contrib ops the transformer optimiser writes; ``hidden``."""
    r = np.random.default_rng(0)
    inits = {
        "word": r.normal(0, 1, (VOCAB, WIDTH)).astype(np.float32),
        "pos": r.normal(0, 0.1, (1, 1, WIDTH)).astype(np.float32),
        "gamma": np.ones(WIDTH, np.float32), "beta": np.zeros(WIDTH, np.float32),
        "w1": r.normal(0, 0.5, (WIDTH, 2 * WIDTH)).astype(np.float32),
        "b1": np.zeros(2 * WIDTH, np.float32),
        "w2": r.normal(0, 0.5, (2 * WIDTH, WIDTH)).astype(np.float32),
    }
    ms = "com.microsoft"
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["rows"], name="word_gather"),
        helper.make_node("Expand", ["pos", "shape"], ["pos_rows"]),
        helper.make_node("Shape", ["rows"], ["shape"]),
        helper.make_node("SkipLayerNormalization", ["rows", "pos_rows", "gamma", "beta"],
                         ["ln"], name="skip_ln", domain=ms, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "w1"], ["h1"], name="fc1"),
        helper.make_node("FastGelu", ["h1", "b1"], ["g"], name="gelu", domain=ms),
        helper.make_node("MatMul", ["g", "w2"], ["hidden"], name="fc2"),
    ]
    nodes.insert(1, nodes.pop(2))  # Shape before the Expand that reads it
    graph = helper.make_graph(
        nodes, "fused",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", "S"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", "S", WIDTH])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(ms, 1)])


LINE = ("quantscope: error: model '{path}' has 2 op(s) outside the ONNX standard domain "
        "(com.microsoft.FastGelu, com.microsoft.SkipLayerNormalization) that quantscope "
        "cannot quantize or emulate and NPU compilers do not take: give the model as "
        "exported, before ONNX Runtime's transformer optimiser "
        "(onnxruntime.transformers.optimizer) fused it, with standard ONNX ops")


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    path = tmp_path_factory.mktemp("fused") / "fused.onnx"
    onnx.save(fused_encoder(), path)
    return path


def test_the_fixture_is_a_model_onnx_runtime_runs(fused):
    ids = np.array([[101, 2054, 102]], np.int64)
    (hidden,) = ort.InferenceSession(str(fused)).run(
        None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert hidden.shape == (1, 3, WIDTH) and np.isfinite(hidden).all()


@pytest.mark.parametrize("command", [
    ["run", "--target", "hailo10h", "--seq-len", "16", "--pairs", "8", "--out"],
    ["run", "--target", "qnn-htp-v73", "--seq-len", "16", "--pairs", "8", "--out"],
    ["calibrate", "--out"],
])
def test_fused_ops_are_refused_in_one_line_before_any_work(fused, tmp_path, capsys, command):
    before = hashlib.sha256(fused.read_bytes()).hexdigest()
    out = tmp_path / "out"
    argv = [command[0], str(fused), "--data", "stdlib-docs", *command[1:], str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [LINE.format(path=fused)]
    assert not out.exists()
    assert hashlib.sha256(fused.read_bytes()).hexdigest() == before


def test_a_call_of_a_function_the_model_defines_is_not_refused():
    """torch's exporter may leave calls of model-local functions (a custom domain); ONNX
    Runtime inlines them: they are not contrib ops."""
    from quantscope.model.load import load_proto

    fn = helper.make_function("local.fns", "Twice", ["x"], ["y"],
                              [helper.make_node("Add", ["x", "x"], ["y"])],
                              [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["y"], domain="local.fns")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("local.fns", 1)])
    assert load_proto(model, "fn").output_names() == ("y",)
