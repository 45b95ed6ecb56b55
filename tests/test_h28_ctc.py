"""``--layout OUT=ctc``: a text recognizer's ``[N, T, C]`` judged by its CTC greedy
decoding (h28). Per step top-1 agreement reads high on such an output (most steps are
the blank) while the strings the host reads change; the ctc task scores the strings."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.tasks.classes import ClassTask
from quantscope.tasks.ctc import CtcTask, edit_distance, greedy_decode
from quantscope.tasks.layout import LayoutError, layout_tasks, parse_layout
from quantscope.types import Outputs


def test_greedy_decode_merges_repeats_and_drops_the_blank() -> None:
    steps = np.eye(4)[[0, 2, 2, 0, 2, 3, 3, 1, 0]][None]  # [1, 9, 4]
    assert greedy_decode(steps, 0) == [(2, 2, 3, 1)]
    assert greedy_decode(steps, 3) == [(0, 2, 0, 2, 1, 0)]
    assert edit_distance((1, 2, 3), (1, 3)) == 1
    assert edit_distance((), (4, 4)) == 2
    assert edit_distance((1, 2), (2, 1)) == 2


def _outputs(top: np.ndarray, classes: int = 5) -> Outputs:
    return Outputs(names=("probs",), batches=((np.eye(classes, dtype=np.float32)[top],),))


def test_strings_change_while_step_top1_reads_high() -> None:
    rng = np.random.default_rng(0)
    ref = np.zeros((8, 40), np.int64)
    ref[:, 5:25:4] = rng.integers(1, 5, (8, 5))  # 5 labels per sample among 40 steps
    test = ref.copy()
    test[:, 9] = np.where(ref[:, 9] == 1, 2, 1)  # one label per sample read as another
    r, t = _outputs(ref), _outputs(test)
    top1 = ClassTask(name="c", output="probs", axis=2).metrics(r, t).values["top1_agreement"]
    assert top1 >= 0.97  # 39 of 40 steps agree: the class task calls it like FP32
    m = CtcTask(name="ctc", output="probs").metrics(r, t)
    assert m.values["string_agreement"] == 0.0
    assert m.values["string_agreement_items"] == 8
    assert m.values["char_error_rate"] == pytest.approx(8 / 40)
    assert m.values["chars_fp32"] == 40
    assert any(n.startswith("NOT LIKE FP32: output 'probs': the decoded string changes on 8 "
                            "of 8 samples") for n in m.notes)
    same = CtcTask(name="ctc", output="probs").metrics(r, r)
    assert same.values["string_agreement"] == 1.0 and same.values["char_error_rate"] == 0.0
    assert not same.notes


def test_blank_last_and_an_all_blank_fp32() -> None:
    top = np.full((3, 10), 4)
    top[:, 3] = 2
    r = _outputs(top)
    m = CtcTask(name="ctc", output="probs", blank=-1).metrics(r, r)
    assert m.values["chars_fp32"] == 3 and m.values["string_agreement"] == 1.0
    empty = CtcTask(name="ctc", output="probs", blank=0).metrics(_outputs(np.zeros((3, 10), np.int64)),
                                                               _outputs(np.zeros((3, 10), np.int64)))
    assert np.isnan(empty.values["char_error_rate"])
    assert any("FP32 decodes an empty string on every sample" in n for n in empty.notes)


def _recognizer(classes: int = 6) -> onnx.ModelProto:
    """x [N, 12, 8] -> MatMul -> Softmax(-1) -> probs [N, 12, C]; and a 2-D output."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (8, classes)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
             helper.make_node("ReduceMean", ["x"], ["pooled"], axes=[1], keepdims=0,
                              name="pool")]
    g = helper.make_graph(
        nodes, "rec", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 12, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 12, classes]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 8])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_layout_values_refused_in_one_line() -> None:
    model = load_proto(_recognizer())
    with pytest.raises(LayoutError, match="blank 'x' is not a whole number"):
        parse_layout("probs=ctc:blank=x")
    for text, why in (("probs=ctc:blank=6", "blank 6 is no class of the 6 on axis 2"),
                      ("probs=ctc:blank=-7", "blank -7 is no class"),
                      ("probs=ctc:axis=0", "axis 0 is no class axis"),
                      ("pooled=ctc", "not \\[samples, time, classes\\]")):
        with pytest.raises(LayoutError, match=why):
            layout_tasks(model, (parse_layout(text),), "d.npz")
    task, notes = layout_tasks(model, (parse_layout("probs=ctc:blank=-1"),), "d.npz")
    assert isinstance(task, CtcTask) and task.blank == -1
    assert "read as CTC sequences" in notes[0]


def test_evaluate_scores_the_decoded_strings(tmp_path, capsys) -> None:
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(_recognizer(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (24, 12, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", "probs=ctc", "--json", str(j)]) == 0
    out = capsys.readouterr().out
    assert "string_agreement" in out and "char_error_rate" in out
    metrics = json.loads(j.read_text())["metrics"]
    assert 0.0 <= metrics["string_agreement"] <= 1.0
    assert metrics["string_agreement_items"] == 24 and metrics["chars_fp32"] > 24
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", "probs=ctc:blank=9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "blank 9 is no class of the 6" in err[0]


def test_a_time_major_output(tmp_path, capsys) -> None:
    """``y [T, N, C]`` (a CRNN exported time-first): with ``--batch-axis`` the strings are
    each sample's, the same figures as the batch-first model's on the same data."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (8, 6)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "tmajor",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "N", 6])], [w])
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), m)
    data = rng.normal(0, 1, (12, 24, 8)).astype(np.float32)  # 24 samples of 12 steps
    np.save(x, data)
    common = ["--data", str(x), "--batch-axis", "x=1", "--batch-axis", "y=1"]
    assert main(["calibrate", str(m), *common, "--out", str(s)]) == 0, capsys.readouterr().err
    assert main(["evaluate", str(m), *common, "--stats", str(s), "--precision", "a8_w8",
                 "--layout", "y=ctc", "--json", str(j)]) == 0, capsys.readouterr().err
    metrics = json.loads(j.read_text())["metrics"]
    assert metrics["string_agreement_items"] == 24
    labels = sum(len(t) for t in greedy_decode(np.moveaxis(data @ numpy_helper.to_array(w), 1, 0), 0))
    assert metrics["chars_fp32"] == labels
