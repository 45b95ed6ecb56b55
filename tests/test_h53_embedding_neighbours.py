"""An embedding among other outputs of tensor data (h53): ``--layout OUT=embedding``.

human's ``faceres`` gives a face descriptor ``[N, 1024]`` beside a gender Sigmoid and an
age Softmax; the Softmax was found by itself and was the headline, and the descriptor the
host matches faces by had no task kind: cosine and SQNR only. Declared ``embedding``, it
is judged by each sample's nearest other sample, the plan's against FP32's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantscope.cli import main
from quantscope.types import Outputs


def _circle(degrees: list[float], lengths: list[float] | None = None) -> np.ndarray:
    a = np.radians(np.asarray(degrees, np.float64))
    r = np.ones(len(a)) if lengths is None else np.asarray(lengths, np.float64)
    return np.stack([r * np.cos(a), r * np.sin(a)], axis=1)


# four pairs of samples: each one's nearest other is its pair's other one
FP32 = [0, 10, 90, 100, 180, 190, 270, 280]
# sample 1 turned from 10 to 85 degrees: its nearest is now sample 2 (90), sample 0's is
# sample 7 (280: 80 degrees away, sample 1 85), sample 2's is sample 1 (5 against 10):
# 3 of 8 neighbours change; sample 4 ten times longer, in the same direction
PLAN = [0, 85, 90, 100, 180, 190, 270, 280]
PLAN_LENGTHS = [1, 1, 1, 1, 10, 1, 1, 1]


def _outputs(rows: np.ndarray) -> Outputs:
    other = np.zeros((len(rows), 3), np.float32)
    return Outputs(names=("probs", "e"), batches=((other[:5], rows[:5]),
                                                  (other[5:], rows[5:])))


def test_the_samples_whose_nearest_other_changes_are_counted():
    from quantscope.tasks.neighbours import EmbeddingTask

    task = EmbeddingTask(name="embedding:e", output="e")
    m = task.metrics(_outputs(_circle(FP32)), _outputs(_circle(PLAN, PLAN_LENGTHS)))
    assert m.values["neighbour_agreement"] == pytest.approx(5 / 8)
    assert m.values["neighbour_agreement_items"] == 8
    assert 0.0 < m.values["neighbour_top5_overlap"] < 1.0
    assert m.values["embedding_cosine_min"] < 0.5  # sample 1 turned by 75 degrees
    assert any(n.startswith("NOT LIKE FP32: output 'e': 3 of 8 samples' nearest other")
               for n in m.notes), m.notes


def test_norm_none_reads_the_raw_distance_a_length_change_moves():
    """Sample 4, ten times longer, is no nearer any other by cosine; by Euclidean distance
    it leaves sample 5, whose nearest becomes sample 6: one more change."""
    from quantscope.tasks.neighbours import EmbeddingTask

    ref, test = _outputs(_circle(FP32)), _outputs(_circle(PLAN, PLAN_LENGTHS))
    raw = EmbeddingTask(name="embedding:e", output="e", norm="none").metrics(ref, test)
    assert raw.values["neighbour_agreement"] == pytest.approx(4 / 8)
    same = EmbeddingTask(name="embedding:e", output="e").metrics(ref, ref)
    assert same.values["neighbour_agreement"] == 1.0
    assert same.values["neighbour_top5_overlap"] == 1.0
    assert not any("NOT LIKE" in n for n in same.notes)


def test_fp32_embeddings_in_one_direction_are_said_to_say_little():
    from quantscope.tasks.neighbours import EmbeddingTask

    near = _circle([0, 1, 2, 3, 4, 5])  # mean pairwise cosine 0.999
    m = EmbeddingTask(name="embedding:e", output="e").metrics(_outputs(near), _outputs(near))
    assert m.values["pairwise_cosine_fp32"] > 0.98
    assert any("FP32 itself does not tell these samples apart" in n and "says little" in n
               for n in m.notes), m.notes
    wide = EmbeddingTask(name="embedding:e", output="e").metrics(
        _outputs(_circle(FP32)), _outputs(_circle(FP32)))
    assert not any("says little" in n for n in wide.notes)


def two_outputs() -> onnx.ModelProto:
    """``x [N, 4]`` -> an embedding ``e = x W`` ``[N, 3]`` and class scores
    ``probs = Softmax(x V)`` ``[N, 3]`` (found by themselves as a class output)."""
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.normal(size=(4, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(r.normal(size=(4, 3)).astype(np.float32), "V")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["e"], name="embed"),
             helper.make_node("MatMul", ["x", "V"], ["logits"], name="head"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "two_outputs",
                              [helper.make_tensor_value_info("x", 1, ["N", 4])],
                              [helper.make_tensor_value_info("probs", 1, ["N", 3]),
                               helper.make_tensor_value_info("e", 1, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _files(tmp_path: Path, n: int = 40) -> tuple[str, str, str]:
    onnx.save(two_outputs(), tmp_path / "m.onnx")
    x = np.random.default_rng(1).normal(size=(n, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    np.savez(tmp_path / "two.npz", x=x[:2])
    m, d, st = (str(tmp_path / f) for f in ("m.onnx", "d.npz", "s.npz"))
    assert main(["calibrate", m, "--data", d, "--out", st]) == 0
    return m, d, st


def test_declared_beside_a_class_output_it_is_the_headline(tmp_path, capsys):
    """The class output found by itself keeps its figures; the embedding, declared, is the
    headline (the first --layout's), its item count beside it."""
    m, d, st = _files(tmp_path)
    ev = str(tmp_path / "ev.json")
    assert main(["evaluate", m, "--data", d, "--stats", st, "--precision", "a8_w8",
                 "--layout", "e=embedding", "--json", ev]) == 0
    res = json.loads(Path(ev).read_text())
    v = res["metrics"]
    assert 0.0 <= v["neighbour_agreement:e"] <= 1.0
    assert v["neighbour_agreement_items:e"] == 40
    assert "top1_agreement:probs" in v and "embedding_sqnr_db:e" in v
    assert v["neighbour_agreement"] == v["neighbour_agreement:e"]  # the one embedding's
    assert any("judged by its neighbours" in n for n in res["notes"])
    # a class note says plans are searched for the headline: the embedding's
    assert not any("NOT LIKE FP32: output 'probs'" in n and "'e''s neighbour_agreement, the "
                   "first --layout's" not in n for n in res["notes"])


def test_the_headline_is_the_declared_embedding_and_run_plans_by_it(tmp_path, capsys):
    from quantscope.model.load import load
    from quantscope.tasks.layout import layout_tasks, parse_layout

    m, d, _ = _files(tmp_path)
    task, _ = layout_tasks(load(m), (parse_layout("e=embedding"),), d)
    assert task.headline == "neighbour_agreement"  # the class output found by itself: not
    assert main(["run", m, "--data", d, "--layout", "e=embedding", "--target", "qnn-htp-v73",
                 "--metric", "neighbour_agreement", "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    assert "n=20 held-out samples" in out and "NOT held out" not in out
    ev = json.loads((tmp_path / "W" / "evaluate.json").read_text())
    plan = ev["results"]["plan"]["metrics"]
    assert plan["neighbour_agreement_items:e"] == 20  # the held-out half's neighbours


def _refused(capsys, model: str, stats: str, data, layout: str, words: str) -> None:
    """``evaluate`` with ``--layout layout`` is refused in one line holding ``words``."""
    rc = main(["evaluate", model, "--data", str(data), "--stats", stats,
               "--precision", "a8_w8", "--layout", layout])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words in err[0], (layout, err)


def test_refusals_are_one_line(tmp_path, capsys):
    m, _, st = _files(tmp_path)
    capsys.readouterr()
    for layout, data, words in (
            ("e=embedding:norm=l1", "d.npz", "norm 'l1' is unknown: use l2 or none"),
            ("e=embedding:threshold=0.5", "d.npz", "'threshold' is no key of kind embedding"),
            ("e=embedding", "two.npz", "give at least 3 samples")):
        _refused(capsys, m, st, tmp_path / data, layout, words)


def test_an_undeclared_normalised_embedding_names_the_kind_that_needs_no_labels():
    """The note on an L2-normalised output named only the verify layout, which needs labels
    tensor data seldom has; it names the embedding layout too."""
    from quantscope.model.load import load_proto
    from quantscope.tasks.layout import layout_tasks

    graph = helper.make_graph(
        [helper.make_node("LpNormalization", ["x"], ["e"], name="norm", axis=1, p=2)], "l2",
        [helper.make_tensor_value_info("x", 1, ["N", 4])],
        [helper.make_tensor_value_info("e", 1, ["N", 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    task, notes = layout_tasks(load_proto(proto, "l2"), (), "x.npz")
    assert task is None
    assert any("L2-normalised" in n and "without labels --layout e=embedding" in n
               for n in notes), notes


def test_with_labels_a_swap_within_one_label_is_no_change():
    """faceres' 8-bit descriptor turned 8 face chips' nearest from one variant of the same
    face (its lighter copy) to another (its mirror): 8 neighbour changes, no identity
    changed. With labels, the headline is whether the nearest other's label is FP32's."""
    from quantscope.tasks.neighbours import embedding_task

    labels = np.array([0, 0, 1, 1, 2, 2, 3, 0])  # sample 0's new nearest (7) is of its label
    task = embedding_task("e", None, labels, "face")
    assert task.headline == "neighbour_label_agreement" and not task.row_local
    m = task.metrics(_outputs(_circle(FP32)), _outputs(_circle(PLAN, PLAN_LENGTHS)))
    assert m.values["neighbour_agreement"] == pytest.approx(5 / 8)
    assert m.values["neighbour_label_agreement"] == pytest.approx(6 / 8)
    assert m.values["neighbour_label_agreement_items"] == 8
    assert any(n.startswith("NOT LIKE FP32: output 'e': 2 of 8 samples' nearest other sample "
                            "is of another label than FP32's")
               for n in m.notes), m.notes


def test_labels_from_the_data_file_split_with_the_samples_in_run(tmp_path, capsys):
    m, _, _ = _files(tmp_path)
    x = np.load(tmp_path / "d.npz")["x"]
    np.savez(tmp_path / "l.npz", x=x, face=np.arange(40) // 2)
    assert main(["run", m, "--data", str(tmp_path / "l.npz"), "--layout",
                 "e=embedding:labels=face", "--target", "qnn-htp-v73",
                 "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    assert "n=20 held-out samples" in out and "NOT held out" not in out
    assert "array(s) no model input takes" not in out
    ev = json.loads((tmp_path / "W" / "evaluate.json").read_text())
    plan = ev["results"]["plan"]["metrics"]
    assert plan["neighbour_label_agreement_items:e"] == 20  # the held-out half's labels


def test_label_refusals_are_one_line(tmp_path, capsys):
    m, _, st = _files(tmp_path)
    x = np.load(tmp_path / "d.npz")["x"]
    np.savez(tmp_path / "short.npz", x=x, face=np.arange(39))
    capsys.readouterr()
    for layout, data, words in (
            ("e=embedding:labels=speaker", "d.npz", "has no array 'speaker'"),
            ("e=embedding:labels=face", "short.npz", "39 labels and the data 40 samples")):
        _refused(capsys, m, st, tmp_path / data, layout, words)


def test_run_warns_when_fp32_embeddings_point_one_way(tmp_path, capsys):
    """An embedding with a large shared offset (every sample's within a few degrees of the
    others'): FP32's neighbours are near ties, said in the verdict as a warning."""
    model = two_outputs()
    shift = numpy_helper.from_array(np.array([50.0, 50.0, 50.0], np.float32), "shift")
    model.graph.initializer.append(shift)
    model.graph.node[0].output[0] = "e0"
    model.graph.node.append(helper.make_node("Add", ["e0", "shift"], ["e"], name="offset"))
    onnx.save(model, tmp_path / "m.onnx")
    x = np.random.default_rng(1).normal(size=(40, 4)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz"),
                 "--layout", "e=embedding", "--target", "qnn-htp-v73",
                 "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    assert any(ln.strip().startswith("warning:") and "FP32 itself does not tell these "
               "samples apart" in ln for ln in out.splitlines()), out


def test_neighbours_a_chunk_of_rows_at_a_time_are_all_rows_at_once():
    from quantscope.tasks.neighbours import neighbours

    x = np.random.default_rng(5).normal(size=(50, 6))
    for l2 in (True, False):
        whole, top = neighbours(x, l2=l2, k=5, chunk=1000)
        parts, top_parts = neighbours(x, l2=l2, k=5, chunk=7)
        assert np.array_equal(whole, parts)
        assert np.array_equal(np.sort(top, axis=1), np.sort(top_parts, axis=1))
        d = ((x[:, None] - x[None]) ** 2).sum(-1) if not l2 else -(
            (x / np.linalg.norm(x, axis=1, keepdims=True)) @
            (x / np.linalg.norm(x, axis=1, keepdims=True)).T)
        np.fill_diagonal(d, np.inf)
        assert np.array_equal(whole, d.argmin(axis=1))


def test_the_analysis_ranks_by_neighbours_only_where_every_row_is_scored(tmp_path):
    """A sample's nearest other depends on which samples there are: the agreement on a
    sweep's 4 proxy rows is no estimate of it on all 40 (faceres: every disable-one figure
    0.75 or 0.5 on 4 rows against the all-row base 0.939, so every gain read 0). On row
    subsets the analysis ranks by the outputs' fidelity; with --proxy 1.0 by the figure."""
    m, d, st = _files(tmp_path)
    for proxy, by_task in (("0.125", False), ("1.0", True)):
        out = tmp_path / f"a{proxy}.json"
        assert main(["analyze", m, "--data", d, "--stats", st, "--target", "hailo8",
                     "--layout", "e=embedding", "--proxy", proxy, "--out", str(out)]) == 0
        a = json.loads(out.read_text())
        assert a["primary"] == "neighbour_agreement"
        rows = a["sensitivity"]
        assert all(("neighbour_agreement" in r["disable_one"]) == by_task for r in rows), proxy
        if by_task:
            assert all(r["disable_one"]["neighbour_agreement_items"] == 40 for r in rows)
