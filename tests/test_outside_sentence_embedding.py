"""A sentence-transformers export with both outputs: ``token_embeddings [N, S, H]`` and
``sentence_embedding [N, H]`` (mean pooling over the mask and Normalize in the graph)
(issue: models beyond the zoo).

The text task scored ``token_embeddings`` (pooled on the host): the task's figures and
``run``'s headline did not include the error of ``sentence_embedding`` -- the output such a
model is used for, whose in-graph pooling is quantized too -- and nothing said so (it was
in the per-output fidelity lines only); ``evaluate --output sentence_embedding`` printed the
retrieval figures of ``token_embeddings`` all the same (the text task ignored --output).
"""

from __future__ import annotations

import html

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.serde import read_json

VOCAB = 30522  # the packaged tokenizer's
WIDTH = 8


def two_output_encoder() -> onnx.ModelProto:
    """word rows -> MatMul -> token_embeddings; masked mean, L2 -> sentence_embedding."""
    r = np.random.default_rng(0)
    f = TensorProto.FLOAT
    inits = {
        "word": r.normal(0, 1, (VOCAB, WIDTH)).astype(np.float32),
        "w": r.normal(0, 0.5, (WIDTH, WIDTH)).astype(np.float32),
        "ax1": np.array([1], np.int64), "ax2": np.array([2], np.int64),
        "eps": np.array(1e-9, np.float32),
    }
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["rows"], name="word_gather"),
        helper.make_node("MatMul", ["rows", "w"], ["token_embeddings"], name="fc"),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=f),
        helper.make_node("Unsqueeze", ["mf", "ax2"], ["m3"]),
        helper.make_node("Mul", ["token_embeddings", "m3"], ["masked"], name="mask_mul"),
        helper.make_node("ReduceSum", ["masked", "ax1"], ["total"], keepdims=0, name="sum"),
        helper.make_node("ReduceSum", ["m3", "ax1"], ["count0"], keepdims=0),
        helper.make_node("Clip", ["count0", "eps"], ["count"]),
        helper.make_node("Div", ["total", "count"], ["mean"], name="mean"),
        helper.make_node("ReduceL2", ["mean"], ["norm0"], axes=[-1], keepdims=1, name="l2"),
        helper.make_node("Clip", ["norm0", "eps"], ["norm"], name="l2_clip"),
        helper.make_node("Div", ["mean", "norm"], ["sentence_embedding"], name="normalize"),
    ]
    graph = helper.make_graph(
        nodes, "st",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", "S"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("token_embeddings", f, ["N", "S", WIDTH]),
         helper.make_tensor_value_info("sentence_embedding", f, ["N", WIDTH])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


NOTE = ("output 'sentence_embedding' [B,8] scored for fidelity only (cosine, SQNR): the text "
        "task's figures (recall, top1_agreement, embedding_*) are 'token_embeddings''s; "
        "--output sentence_embedding makes the task score that output instead (commands that "
        "take --output)")


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    onnx.save(two_output_encoder(), d / "st.onnx")
    assert main(["calibrate", str(d / "st.onnx"), "--data", "stdlib-docs",
                 "--out", str(d / "s.npz")]) == 0
    return d


def _evaluate(st, *extra: str) -> dict:
    out = st / f"e{len(extra)}.json"
    assert main(["evaluate", str(st / "st.onnx"), "--data", "stdlib-docs", "--pairs", "16",
                 "--seq-len", "32", "--stats", str(st / "s.npz"), "--precision", "a8_w8",
                 *extra, "--json", str(out)]) == 0
    return read_json(out, "evaluate")


def test_the_output_left_unscored_is_said(st, capsys):
    result = _evaluate(st)
    assert f"note: {NOTE}" in capsys.readouterr().out
    assert NOTE in str(result)


def test_output_picks_what_the_text_task_scores(st, capsys):
    tokens, pooled = _evaluate(st), _evaluate(st, "--output", "sentence_embedding")
    out = capsys.readouterr().out
    assert "output pooled embedding 'sentence_embedding' [B,8] -> L2 normalisation" in out
    assert ("output 'token_embeddings' [B,S,8] scored for fidelity only (cosine, SQNR): the "
            "text task's figures (recall, top1_agreement, embedding_*) are "
            "'sentence_embedding''s") in out
    # the retrieval figures are the in-graph pooling's, not the host's pooling of the tokens
    a, b = tokens["metrics"], pooled["metrics"]
    assert a["embedding_sqnr_db"] != b["embedding_sqnr_db"]
    assert b["embedding_sqnr_db"] == pytest.approx(b["sqnr_db"], abs=0.01)


def test_run_warns_in_the_verdict(st, capsys):
    out = st / "W"
    assert main(["run", str(st / "st.onnx"), "--data", "stdlib-docs", "--pairs", "16",
                 "--seq-len", "32", "--target", "hailo10h", "--lengths", "off",
                 "--repairs", "none", "--rewrites", "none", "--finetune", "off",
                 "--out", str(out)]) == 0
    v = read_json(out / "verdict.json", "verdict")
    assert v["unscored"] == [NOTE]
    assert f"  warning: {NOTE}" in capsys.readouterr().out.splitlines()
    assert html.escape(NOTE) in (out / "report.html").read_text(encoding="utf-8")
