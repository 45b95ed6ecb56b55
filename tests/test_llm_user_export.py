"""A user's own decoder LLM, exported as Hugging Face exports do (one graph, ``input_ids`` +
``attention_mask`` -> ``logits``, with or without ``past_key_values.*`` / ``present.*``).

quantscope measures next-token quality only for a prefill/decode pair of phase graphs. Such
an export given text data was treated as a sentence encoder (retrieval scored on its
mean-pooled logits), given as a phase pair it failed inside ONNX Runtime ("internal error"),
and given token ids its logits' SQNR was the verdict without a word that it is no LM figure.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantscope.cli import main
from quantscope.model.load import load
from quantscope.tasks.registry import tensor_task

VOCAB, WIDTH, HEADS, HEAD_DIM = 40, 8, 2, 4


def hf_decoder(kv: bool) -> onnx.ModelProto:
    """input_ids, attention_mask [, past_key_values.0.key|value] -> logits [B, S, VOCAB]
    [, present.0.key|value]: the interface of a Hugging Face causal-LM export (the mask
    is read by nothing: only the interface matters here)."""
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["B", "S"]),
              helper.make_tensor_value_info("attention_mask", i64, ["B", "T"])]
    outputs = [helper.make_tensor_value_info("logits", f, ["B", "S", VOCAB])]
    inits = [numpy_helper.from_array(rng.normal(0, 1, (VOCAB, WIDTH)).astype(np.float32), "embed"),
             numpy_helper.from_array(rng.normal(0, 1, (WIDTH, VOCAB)).astype(np.float32), "head"),
             numpy_helper.from_array(np.array([1, HEADS, -1, HEAD_DIM], np.int64), "split")]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed_tokens"),
             helper.make_node("Relu", ["h"], ["hr"], name="act"),
             helper.make_node("MatMul", ["hr", "head"], ["logits"], name="lm_head")]
    if kv:
        for part in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(
                f"past_key_values.0.{part}", f, [1, HEADS, "P", HEAD_DIM]))
            outputs.append(helper.make_tensor_value_info(
                f"present.0.{part}", f, [1, HEADS, "T", HEAD_DIM]))
            nodes += [helper.make_node("Reshape", ["h", "split"], [f"new_{part}"]),
                      helper.make_node("Concat", [f"past_key_values.0.{part}", f"new_{part}"],
                                       [f"present.0.{part}"], axis=2, name=f"{part}_cache")]
    graph = helper.make_graph(nodes, "lm", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(args)
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("kv", [False, True], ids=["logits", "kv-cache"])
def test_text_data_on_a_decoder_is_refused_in_one_line(tmp_path: Path, kv: bool,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    path = tmp_path / "lm.onnx"
    onnx.save(hf_decoder(kv), str(path))
    run = ["run", str(path), "--data", "stdlib-docs", "--target", "hailo10h", "--goal", "0.9",
           "--out", str(tmp_path / "W")]
    for args in (["calibrate", str(path), "--data", "stdlib-docs", "--out",
                  str(tmp_path / "s.npz")], run):
        code, err = _cli(args, capsys)
        assert code == 2, err
        assert len(err.splitlines()) == 1 and "internal error" not in err, err
        if kv and args is run:  # run converts an export with its cache: it needs the tokenizer
            assert "no tokenizer.json beside it: give --tokenizer" in err, err
            continue
        assert "language model, not a sentence encoder" in err, err
        assert ("past_key_values.0.key" if kv else f"'logits' has {VOCAB} values") in err, err
        assert "--phase prefill,decode" in err and "TOKENS.npz" in err, err
        if kv:
            assert "'quantscope run MODEL --data stdlib-docs" in err, err
    assert not (tmp_path / "s.npz").exists() and not (tmp_path / "W").exists()


def test_token_ids_on_a_decoder_say_the_figures_are_no_lm_figures(tmp_path: Path) -> None:
    path = tmp_path / "lm.onnx"
    onnx.save(hf_decoder(False), str(path))
    _, notes = tensor_task(load(path), "tokens.npz")
    said = [n for n in notes if n.startswith("language model")]
    assert len(said) == 1 and "says little of next-token quality" in said[0], notes
    assert "--phase prefill,decode" in said[0]


def test_a_hugging_face_export_given_as_phase_graphs_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    onnx.save(hf_decoder(True), str(tmp_path / "u.prefill.onnx"))
    shutil.copy(tmp_path / "u.prefill.onnx", tmp_path / "u.decode.onnx")
    for args in (["analyze", str(tmp_path / "u.prefill.onnx"), "--phase", "prefill,decode",
                  "--out", str(tmp_path / "d.json")],
                 ["plan", str(tmp_path / "u.prefill.onnx"), "--target", "hailo10h",
                  "--phase", "prefill,decode", "--out", str(tmp_path / "p.json")]):
        code, err = _cli(args, capsys)
        assert code == 2 and "internal error" not in err, err
        assert len(err.splitlines()) == 1, err
        assert "'u.prefill.onnx' is no prefill graph quantscope can run" in err, err
        assert "'attention_mask'" in err and "past.{i}.key|value" in err, err
