"""Per-token class outputs with the classes on the LAST axis (issue: beyond the zoo).

A token classifier (NER, POS tagging; an LM head) outputs ``logits [N, T, C]``: positions
on axis 1, classes on the last. ``--layout logits=class`` read the classes on axis 1 (the
vision ``[N, C, H, W]`` convention): T was taken for the classes and C for the positions,
the note said "top-1 over 12 classes on axis 1", and the top-1 agreement, its ties and its
item count were computed over the tokens of each class, silently. Now the class axis is
the one given (``class:axis=K``), else the graph's (the features of the weighted MatMul/Gemm
that makes the output), else axis 1 said to be a default; a bad axis is one line.

Real ORT sessions on tiny models built here; the CLI as a user runs it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from tiny_models import _rng, _with_weights

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.serde import read_json
from quantscope.tasks.classes import ClassTask
from quantscope.tasks.layout import layout_tasks, parse_layout
from quantscope.tasks.shares import clustered_items
from quantscope.types import Outputs

T, C, V, D = 12, 5, 40, 16


def token_classifier(seed: int = 31, *, classes: int = C) -> onnx.ModelProto:
    """``input_ids [N, 12]`` -> embedding Gather -> MatMul, Relu -> MatMul + bias ->
    ``logits [N, 12, classes]``: a token classifier's head, classes on the last axis."""
    r = _rng(seed)
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    tok (int64[N, {T}] input_ids) => (float[N, {T}, {classes}] logits) {{
        e = Gather (emb, input_ids)
        h0 = MatMul (e, w1)
        h = Relu (h0)
        m = MatMul (h, w2)
        logits = Add (m, b2)
    }}
    """
    return _with_weights(text, {
        "emb": r.normal(0, 1, (V, D)).astype(np.float32),
        "w1": r.normal(0, 0.5, (D, D)).astype(np.float32),
        "w2": r.normal(0, 0.5, (D, classes)).astype(np.float32),
        "b2": r.normal(0, 0.1, classes).astype(np.float32),
    })


def passthrough_scores() -> onnx.ModelProto:
    """``scores [N, 12, 5]`` = features x features (no weight): the graph does not say
    which axis holds the classes."""
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    pt (float[N, {T}, {D}] a, float[N, {D}, {C}] b) => (float[N, {T}, {C}] scores) {{
        scores = MatMul (a, b)
    }}
    """
    return _with_weights(text, {})


def _save(tmp_path, model: onnx.ModelProto, n: int = 32) -> tuple[str, str]:
    onnx.save(model, tmp_path / "tok.onnx")
    ids = np.random.default_rng(0).integers(0, V, (n, T)).astype(np.int64)
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    return str(tmp_path / "tok.onnx"), str(tmp_path / "ids.npz")


def test_declared_class_reads_the_last_axis_of_a_token_classifier():
    model = load_proto(token_classifier(), "tok")
    task, notes = layout_tasks(model, (parse_layout("logits=class"),), "x.npz")
    assert isinstance(task, ClassTask) and task.axis == 2
    assert notes == ("output 'logits' read as class scores (top-1 over 5 classes on axis 2, "
                     "the last, the graph's channel axis of its Add; judged per position, 12 "
                     "positions per sample; another axis: --layout logits=class:axis=K) "
                     "(--layout)",)
    # given: -1 and 2 are the last axis; 1 is read as given (the tokens as classes)
    for given, axis in (("-1", 2), ("2", 2), ("1", 1)):
        t, n = layout_tasks(model, (parse_layout(f"logits=class:axis={given}"),), "x.npz")
        assert t.axis == axis and ", as given;" in n[0]
    t, n = layout_tasks(model, (parse_layout("logits=class:axis=1"),), "x.npz")
    assert "top-1 over 12 classes on axis 1, as given; judged per position, 5 positions" in n[0]


def test_an_axis_the_graph_does_not_tell_is_said_to_be_the_default():
    model = load_proto(passthrough_scores(), "pt")
    task, notes = layout_tasks(model, (parse_layout("scores=class"),), "x.npz")
    assert task.axis == 1
    assert notes[0] == ("output 'scores' read as class scores (top-1 over 12 classes on axis "
                        "1, by default: the graph does not say which axis holds the classes; "
                        "judged per position, 5 positions per sample; another axis: --layout "
                        "scores=class:axis=K) (--layout)")


def _outputs(*batches, name="logits"):
    return Outputs(names=(name,), batches=tuple((np.asarray(b, np.float32),)
                                               for b in batches))


def test_top1_and_its_items_are_over_the_classes_of_each_token_clustered_by_sample():
    r = np.random.default_rng(1)
    ref = r.normal(0, 1, (6, T, C))
    test = ref.copy()
    # sample 0: every token's top class moves to another class; sample 3: two tokens
    for s, tokens in ((0, range(T)), (3, (4, 9))):
        for k in tokens:
            top = int(ref[s, k].argmax())
            test[s, k, (top + 1) % C] = ref[s, k, top] + 1.0
    task = ClassTask(name="class:logits", output="logits", axis=2)
    m = task.metrics(_outputs(ref[:4], ref[4:]), _outputs(test[:4], test[4:]))
    agree = ref.argmax(-1) == test.argmax(-1)
    assert agree.sum() == 6 * T - T - 2
    assert m.values["top1_agreement"] == agree.mean()
    assert m.values["top1_agreement_clusters"] == 6
    hits = agree.sum(axis=1).astype(float)
    assert m.values["top1_agreement_items"] == np.floor(clustered_items(hits, np.full(6, T)))
    assert m.values["top1_agreement_items"] < 6 * T  # a whole sample flipped: clustered
    assert any("the top class changes on 14 of 72 positions" in n for n in m.notes)
    # the classes on axis 1 ([N, C, T]) read the same with the default axis
    moved = ClassTask(name="class:logits", output="logits").metrics(
        _outputs(np.moveaxis(ref, 2, 1)), _outputs(np.moveaxis(test, 2, 1)))
    assert {k: moved.values[k] for k in m.values} == m.values


def test_an_axis_the_arrays_do_not_have_is_not_scored_and_said():
    task = ClassTask(name="class:logits", output="logits", axis=3)
    x = np.zeros((2, T, C))
    m = task.metrics(_outputs(x), _outputs(x))
    assert np.isnan(m.values["top1_agreement"])
    assert m.notes == ("output 'logits' not scored as classes: its arrays have shape "
                       "(2, 12, 5): axis 3 is no class axis; give --layout "
                       "logits=class:axis=K",)


def test_evaluate_scores_a_token_classifier_over_its_classes(tmp_path, capsys):
    model, data = _save(tmp_path, token_classifier())
    stats = str(tmp_path / "s.npz")
    assert main(["calibrate", model, "--data", data, "--out", stats]) == 0
    capsys.readouterr()
    assert main(["evaluate", model, "--data", data, "--stats", stats, "--precision",
                 "a8_w8", "--layout", "logits=class", "--json",
                 str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    assert "top-1 over 5 classes on axis 2, the last" in out
    res = read_json(tmp_path / "e.json", "evaluation")
    m = res["metrics"]
    assert m["top1_agreement_clusters"] == 32 and m["top1_agreement_items"] <= 32 * T
    # the figure is the share of FP32's top class kept over the 5 classes of each token
    import onnxruntime as ort

    from quantscope import stages
    from quantscope.model.load import load
    from quantscope.types import Plan, Precision

    ids = np.load(data)["input_ids"]
    ref = ort.InferenceSession(model).run(None, {"input_ids": ids})[0]
    qdq, _ = stages.qdq_for_plan(load(model), stages.read_stats(stats),
                                 Plan.uniform(Precision.A8_W8))
    got = ort.InferenceSession(qdq.SerializeToString()).run(None, {"input_ids": ids})[0]
    assert m["top1_agreement"] == pytest.approx(np.mean(ref.argmax(-1) == got.argmax(-1)))


def test_run_reads_the_classes_of_each_token(tmp_path, capsys):
    model, data = _save(tmp_path, token_classifier())
    assert main(["run", model, "--data", data, "--target", "hailo8", "--repairs", "none",
                 "--layout", "logits=class", "--out", str(tmp_path / "W")]) == 0
    out, err = capsys.readouterr()
    assert "note: output 'logits' read as class scores (top-1 over 5 classes on axis 2" in err
    # the verdict names the items counted: positions, an effective count (h25)
    assert "(n=16 held-out samples, an effective 192 positions; fp32" in out
    ev = read_json(tmp_path / "W" / "evaluate.json", "evaluation")
    fp32 = ev["results"]["fp32"]["metrics"]
    assert fp32["top1_agreement_clusters"] == 16  # the held-out samples
    assert fp32["top1_agreement_items"] == 16 * T  # FP32 against itself: every token
    assert "on axis 2" in ev["data"]["held_out"]["notes"][0]
    assert "on axis 2" in (tmp_path / "W" / "report.html").read_text()


@pytest.mark.parametrize(("layout", "why"), [
    ("logits=class:axis=3", "--layout 'logits=class:axis=3': axis 3 is outside output "
     "'logits' of shape ('?', 12, 5): give one of 1..2 (-1: the last)"),
    ("logits=class:axis=-4", "--layout 'logits=class:axis=-4': axis -4 is outside output "
     "'logits' of shape ('?', 12, 5): give one of 1..2 (-1: the last)"),
    ("logits=class:axis=0", "--layout 'logits=class:axis=0': axis 0 is the samples' axis of "
     "output 'logits': give the class axis, 1..2 (-1: the last)"),
    ("logits=class:axis=-3", "--layout 'logits=class:axis=-3': axis -3 is the samples' axis "
     "of output 'logits': give the class axis, 1..2 (-1: the last)"),
    ("logits=class:axis=last", "run: argument --layout: 'logits=class:axis=last': axis 'last' "
     "is not a whole number: give the class axis (e.g. -1, the last) (see 'quantscope run "
     "--help')"),
])
def test_a_bad_class_axis_is_one_line_before_any_work(tmp_path, capsys, layout, why):
    model, data = _save(tmp_path, token_classifier())
    assert main(["run", model, "--data", data, "--target", "hailo8", "--layout", layout,
                 "--out", str(tmp_path / "W")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"quantscope: error: {why}"
    assert not (tmp_path / "W").exists()


def test_a_class_axis_of_one_value_is_one_line(tmp_path, capsys):
    """``[N, T, 1]`` (one score per token): its graph axis (the last) holds one value."""
    model, data = _save(tmp_path, token_classifier(classes=1))
    for layout in ("logits=class", "logits=class:axis=-1"):
        assert main(["run", model, "--data", data, "--target", "hailo8", "--layout", layout,
                     "--out", str(tmp_path / "W")]) == 2
        assert not (tmp_path / "W").exists()
        err = capsys.readouterr().err.strip()
        assert err == (f"quantscope: error: --layout '{layout}': output 'logits' has shape "
                       "('?', 12, 1): axis 2 holds 1 value, no classes to pick: give the "
                       "class axis with logits=class:axis=K, or use kind score for one value "
                       "per sample")


def test_run_warns_when_the_class_axis_is_a_default(tmp_path, capsys):
    """Where the graph does not say which axis holds the classes, axis 1 is read: the
    verdict (console, verdict.json, report) says so as a warning, with how to change it."""
    onnx.save(passthrough_scores(), tmp_path / "pt.onnx")
    r = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", a=r.normal(0, 1, (16, T, D)).astype(np.float32),
             b=r.normal(0, 1, (16, D, C)).astype(np.float32))
    assert main(["run", str(tmp_path / "pt.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--repairs", "none", "--layout", "scores=class",
                 "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    said = ("output 'scores' read as class scores (top-1 over 12 classes on axis 1, by "
            "default: the graph does not say which axis holds the classes; judged per "
            "position, 5 positions per sample; another axis: --layout scores=class:axis=K) "
            "(--layout)")
    assert f"  warning: {said}\n" in out
    assert read_json(tmp_path / "W" / "verdict.json", "verdict")[
        "class_axis_by_default"] == [said]
    # given, it is no default: no warning
    assert main(["run", str(tmp_path / "pt.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--repairs", "none", "--layout",
                 "scores=class:axis=-1", "--out", str(tmp_path / "W2")]) == 0
    assert "warning: output 'scores' read as" not in capsys.readouterr().out


def _softmax_model(opset: int, axis: int, *, attention: bool = False) -> onnx.ModelProto:
    """``x [N, 12, 16]`` -> MatMul (a weight, or x's own transpose: attention scores) ->
    Softmax over ``axis`` -> ``probs``."""
    second, shape = ("xt", f"{T}, {T}") if attention else ("w", f"{T}, {C}")
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    sm (float[N, {T}, {D}] x) => (float[N, {shape}] probs) {{
        xt = Transpose <perm = [0, 2, 1]> (x)
        s = MatMul (x, {second})
        probs = Softmax <axis = {axis}> (s)
    }}
    """
    return _with_weights(text, {"w": _rng(5).normal(0, 1, (D, C)).astype(np.float32)})


def test_a_softmax_over_the_last_axis_of_token_scores_is_read_per_token():
    model = load_proto(_softmax_model(17, -1), "sm")
    task, notes = layout_tasks(model, (), "x.npz")
    assert isinstance(task, ClassTask) and task.axis == 2
    assert notes == ("output 'probs' read as class scores (top-1 over 5 classes on axis 2, "
                     "the last) (a Softmax over the classes); --layout probs=tensor for plain "
                     "fidelity",)
    r = np.random.default_rng(2)
    ref = r.random((4, T, C))
    test = ref.copy()
    test[0, 3] = ref[0, 3, ::-1]
    m = task.metrics(_outputs(ref, name="probs"), _outputs(test, name="probs"))
    want = np.mean(ref.argmax(-1) == test.argmax(-1))
    assert m.values["top1_agreement"] == want and m.values["top1_agreement_clusters"] == 4
    # attention probabilities [N, T, T] are no classes
    assert layout_tasks(load_proto(_softmax_model(17, -1, attention=True), "a"), (),
                        "x.npz") == (None, ())
    # an old opset's Softmax over the last axis is one axis too
    assert layout_tasks(load_proto(_softmax_model(11, 2), "o"), (), "x.npz")[0].axis == 2


def lm_head(seed: int = 41, vocab: int = V) -> onnx.ModelProto:
    """``input_ids [N, 12]`` -> a ``[vocab, 16]`` table -> MatMul -> ``logits [N, 12,
    vocab]``: one value per row of the table the ids index (an LM head)."""
    r = _rng(seed)
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    lm (int64[N, {T}] input_ids) => (float[N, {T}, {vocab}] logits) {{
        e = Gather (emb, input_ids)
        logits = MatMul (e, head)
    }}
    """
    return _with_weights(text, {"emb": r.normal(0, 1, (vocab, D)).astype(np.float32),
                                "head": r.normal(0, 0.5, (D, vocab)).astype(np.float32)})


def test_an_lm_head_declared_as_classes_is_said_to_be_teacher_forced_top1(tmp_path, capsys):
    """An LM head [N, T, V] declared ``class`` is judged per token over its vocabulary, and
    the verdict no longer says its figures are tensor fidelity."""
    model, data = _save(tmp_path, lm_head())
    assert main(["run", model, "--data", data, "--target", "hailo8", "--repairs", "none",
                 "--layout", "logits=class", "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr()
    assert "top-1 over 40 classes on axis 2, the last" in out.err
    warning = next(line for line in out.out.splitlines() if "language model (" in line)
    assert "'logits' scored as class scores over the last axis: the top-1 agreement is " \
           "FP32's top token kept at each position of the token ids given (teacher-forced), " \
           "which says little of KL, perplexity or decoding on a quantized KV cache" in warning
    assert "tensor fidelity" not in warning
    v = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert v["metric"] == "top1_agreement"


def test_a_sequence_first_token_classifier_runs_with_its_batch_axis(tmp_path, capsys):
    """``x [T, N, D]`` -> ``logits [T, N, C]`` (samples on axis 1: ``--batch-axis``): the
    analysis scored the class task on outputs it had not put sample-first, and the run
    stopped with an internal error (cannot reshape); now every figure is per token."""
    r = _rng(7)
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    sf (float[{T}, N, {D}] x) => (float[{T}, N, {C}] logits) {{
        m = MatMul (x, w)
        logits = Add (m, b)
    }}
    """
    onnx.save(_with_weights(text, {"w": r.normal(0, 0.5, (D, C)).astype(np.float32),
                                   "b": r.normal(0, 0.1, C).astype(np.float32)}),
              tmp_path / "sf.onnx")
    np.savez(tmp_path / "x.npz", x=r.normal(0, 1, (T, 32, D)).astype(np.float32))
    assert main(["run", str(tmp_path / "sf.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--batch-axis", "x=1,logits=1", "--target", "hailo8", "--repairs", "none",
                 "--layout", "logits=class", "--out", str(tmp_path / "W")]) == 0
    capsys.readouterr()
    fp32 = read_json(tmp_path / "W" / "evaluate.json", "evaluation")["results"]["fp32"]
    assert fp32["metrics"]["top1_agreement_clusters"] == 16
    assert fp32["metrics"]["top1_agreement_items"] == 16 * T
