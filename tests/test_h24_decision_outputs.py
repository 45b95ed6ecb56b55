"""A classifier that outputs its decision inside the graph (h24): ``TopK`` (float values and
int64 indices) and ``ArgMax`` (an int64 label) beside the logits. The int outputs are no
activations to quantize (a Q/DQ pair on int64 is a graph ONNX Runtime refuses)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto


def decision_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.6, (8, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([3], np.int64), "k")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("TopK", ["logits", "k"], ["top_v", "top_i"], axis=1, name="topk"),
             helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="argmax")]
    g = helper.make_graph(
        nodes, "decisions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 6]),
         helper.make_tensor_value_info("top_v", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("top_i", TensorProto.INT64, ["N", 3]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_int_outputs_are_no_group_outputs():
    groups = find_groups(load_proto(decision_model()))
    outs = {t for g in groups.groups for t in g.outputs}
    assert "top_v" in outs and "logits" in outs
    assert "top_i" not in outs  # TopK's int64 indices: not quantized


def _evaluated(tmp_path, capsys):
    """``evaluate --precision a8_w8`` of :func:`decision_model` on 48 samples: the result
    file (the console is left in ``capsys``)."""
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(decision_model(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (48, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s),
                 "--precision", "a8_w8", "--json", str(j)]) == 0, capsys.readouterr().err
    return j


def test_evaluate_runs_a_model_with_int_outputs(tmp_path, capsys):
    assert _evaluated(tmp_path, capsys).exists()


def _ort_outputs(path, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so).run(None, {"x": x})


def test_int_outputs_are_compared_exactly(tmp_path, capsys):
    """A label is equal to FP32's or not: no cosine, SQNR or 'decision at threshold 0' of
    class numbers; the figure is the share of samples ONNX Runtime gives equal on the
    exported Q/DQ graph."""
    import json

    m, x, s, j, q = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json", "q.onnx"))
    onnx.save(decision_model(), m)
    data = np.random.default_rng(1).normal(0, 1, (48, 8)).astype(np.float32)
    np.save(x, data)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s),
                 "--precision", "a8_w8", "--json", str(j)]) == 0
    out = capsys.readouterr().out
    assert main(["export-qdq", str(m), "--stats", str(s), "--precision", "a8_w8",
                 "--out", str(q)]) == 0
    result = json.loads(j.read_text())
    label, top_i = result["outputs"]["label"], result["outputs"]["top_i"]
    assert "sqnr_db" not in label and "decision_agreement" not in label
    assert "cosine_mean" not in top_i and "sqnr_db" not in top_i
    ref, test = _ort_outputs(m, data), _ort_outputs(q, data)
    assert label["exact_agreement"] == np.mean(ref[3] == test[3])
    assert top_i["exact_agreement"] == np.mean(np.all(ref[2] == test[2], axis=1))
    assert top_i["exact_agreement_items"] == 48
    assert "output 'label' is int64 (a label or an index): compared exactly" in out
    # the unprefixed SQNR is the float outputs' worst, never an index tensor's
    assert result["metrics"]["sqnr_db"] == min(result["outputs"][o]["sqnr_db"]
                                               for o in ("logits", "top_v"))


def test_analysis_scorer_leaves_int_outputs_out():
    from quantscope.analyze.scoring import outputs_scorer

    scorer = outputs_scorer()
    n = 5
    rows = scorer.reduce((np.ones((n, 6), np.float32), np.zeros(n, np.int64)), {})
    assert rows.shape == (n, 6)  # the label's column is no noise power


def _nms_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (8, 24)).astype(np.float32), "wb"),
             numpy_helper.from_array(rng.normal(0, 1, (8, 6)).astype(np.float32), "ws"),
             numpy_helper.from_array(np.array([1, 6, 4], np.int64), "sb"),
             numpy_helper.from_array(np.array([1, 1, 6], np.int64), "ss"),
             numpy_helper.from_array(np.array([4], np.int64), "k"),
             numpy_helper.from_array(np.array([0.5], np.float32), "iou")]
    nodes = [helper.make_node("MatMul", ["x", "wb"], ["b"], name="box_fc"),
             helper.make_node("Reshape", ["b", "sb"], ["boxes"], name="rb"),
             helper.make_node("MatMul", ["x", "ws"], ["s"], name="score_fc"),
             helper.make_node("Sigmoid", ["s"], ["s1"], name="sig"),
             helper.make_node("Reshape", ["s1", "ss"], ["scores"], name="rs"),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["sel"],
                              name="nms"),
             helper.make_node("Cast", ["sel"], ["kept"], to=TensorProto.FLOAT, name="cast")]
    g = helper.make_graph(nodes, "nms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("kept", TensorProto.FLOAT, ["K", 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_a_data_sized_output_is_refused_before_any_work(tmp_path, capsys):
    """A post-NMS output (its row count depends on the values) cannot be compared with
    FP32's position by position: one line naming it, the op and the tensors before it."""
    m, x, w = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "W"
    onnx.save(_nms_model(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (6, 8)).astype(np.float32))
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8", "--out", str(w)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "output 'kept' has a size that depends on the data" in err[0]
    assert "NonMaxSuppression 'nms'" in err[0] and "'boxes', 'scores'" in err[0]
    assert "'iou'" not in err[0]  # a constant is not a tensor to export
    assert not w.exists()


def test_integer_outputs_only_are_refused(tmp_path, capsys):
    model = decision_model()
    keep = [o for o in model.graph.output if o.name == "label"]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "s.npz"
    onnx.save(model, m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (8, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has only integer (label or index) outputs ('label')" in err[0], err
    assert "--layout OUT=class" in err[0] and not s.exists()


def test_the_verdict_names_an_int_output_read_as_it_is():
    from quantscope.report.summary import _compile_line

    v = {"compiler_files": {"repaired.onnx": "", "model.alls": "", "quantized.qdq.onnx": ""},
         "io": [], "io_float": [],
         "io_as_is": [{"role": "output", "tensor": "label", "dtype": "int64"}]}
    line = _compile_line(v, None)
    assert "device I/O (io_snippet.py): output label int64 as it is (not quantized)" in line


def test_a_lookup_by_a_label_is_quantized():
    """A Gather from a constant table by an ArgMax label (a class embedding, a colour
    map) made rows the emulation left float while its coverage said the lookup's output
    was quantized: the rows shared the int label's (absent) encoding."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 1, (8, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 1, (6, 4)).astype(np.float32), "table")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="am"),
             helper.make_node("Gather", ["table", "label"], ["emb"], axis=0, name="lookup")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 6]),
                           helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["N", 4])], inits)
    groups = find_groups(load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])))
    assert "emb" in {t for gr in groups.groups for t in gr.outputs}
    assert not any("label" in chain for chain in groups.shared)


def test_the_line_after_not_like_fp32_is_the_bad_outputs():
    """Several outputs each say a line (a label compared exactly, a one-value output's
    decisions) whether good or not: the line after 'NOT LIKE FP32', which run's verdict
    prints as where it went wrong, is the bad output's, not the first output's."""
    from quantscope.emulate.evaluate import output_fidelity
    from quantscope.types import Outputs

    label = np.arange(40) % 5
    top = np.stack([label, (label + 1) % 5], axis=1)
    bad_top = top.copy()
    bad_top[:10, 1] = 0
    ref = Outputs(names=("label", "top_i"), batches=((label, top),))
    test = Outputs(names=("label", "top_i"), batches=((label, bad_top),))
    notes = list(output_fidelity(ref, test).notes)
    at = next(i for i, n in enumerate(notes) if n.startswith("NOT LIKE FP32"))
    assert "'top_i'" in notes[at] and notes[at + 1].startswith("output 'top_i'"), notes


def test_logits_the_graph_picks_from_are_read_as_classes(tmp_path, capsys):
    """Logits beside the ArgMax/TopK the graph takes of them are class scores by the
    graph's own word: scored by top-1 agreement (which equals the label's exact agreement)
    without --layout, and a note says why."""
    import json

    j = _evaluated(tmp_path, capsys)
    out = capsys.readouterr().out
    assert "output 'logits' read as class scores (top-1 over 6 classes on axis 1) (the graph " \
           "picks classes from it: 'topk')" in out
    result = json.loads(j.read_text())
    assert result["metrics"]["top1_agreement"] == result["outputs"]["label"]["exact_agreement"]


def test_control_flow_is_refused_with_how_to_fold_it(tmp_path, capsys):
    """An If was refused as 'control flow or an already-quantized model: export a float
    model without it' (it is float; the fix is to fold the branch)."""
    then = helper.make_graph([helper.make_node("Relu", ["y0"], ["yt"], name="then_relu")], "then",
                             [], [helper.make_tensor_value_info("yt", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["y0"], ["ye"], name="else_neg")], "else",
                              [], [helper.make_tensor_value_info("ye", TensorProto.FLOAT, None)])
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 1, (8, 4)).astype(np.float32), "w")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"], name="fc"),
             helper.make_node("ReduceSum", ["x"], ["sx"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["sx", "zero"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="branch")]
    g = helper.make_graph(nodes, "ifm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, zero])
    m, x, w_dir = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "W"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (4, 8)).astype(np.float32))
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8", "--out", str(w_dir)]) == 2
    said = capsys.readouterr()
    # the one line, and nothing before it (the auto rewrites' line came first, as if the
    # run had started)
    assert said.out == "" and len(said.err.strip().splitlines()) == 1, said
    err = said.err.strip()
    assert err.startswith("quantscope: error: node 'branch' is control flow (If)"), err
    # its condition is the data's (sum(x) > 0): no fold keeps it (h27: the line said to fold)
    assert "is computed from the data (input 'x')" in err and "pick the branch on the host" in err
    assert not w_dir.exists()


def test_a_label_declared_as_a_task_is_refused(tmp_path, capsys):
    """--layout top_i=class took TopK's int64 indices as class scores (the argmax of three
    class numbers); a label or index is compared exactly, so a task on it is one line."""
    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "s.npz"
    onnx.save(decision_model(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (8, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", "top_i=class"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "output 'top_i' is int64 (a label or an index)" in err[0], err
