"""What the output says (h65): four places where the console, the verdict and the report
were silent or miscounted.

- The axis an output's per-channel figures read (``channel_axis_read``, h63) was in the
  JSON entry only: ``evaluate``'s output line, ``run``'s verdict (a worst-channel headline,
  an output scored for fidelity only) and the report's "Every output" fold gave a "worst
  channel" and "collapsed" count without saying whether the channels were classes or time
  steps. Now each says the entry's one line beside them, once per output.
- A ``where=`` gate that keeps no held-out point: the headline said ``— (n=6 held-out
  samples; ...)``; it says ``no figure (n=0 of 6 held-out samples judged; ...)``.
- ``--rewrites auto``'s line counted the fit samples (``n=6 fit samples``) where the figure
  was computed on the samples a gate judged, and claimed a measurement where nothing was
  tried.
- A detection's ``scores_from=`` output and a ``map`` with ``channel=K`` told no axis: the
  scores were read per anchor (their Concat's axis), a class the grid erases unseen.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from gate_fit_only_run import fit_only_run, ordered_pnet
from onnx import TensorProto, helper, numpy_helper
from test_class_axis_read import C, T, _logits, _model
from test_h60_points_photo_gate import _pnet_like
from test_repair_tokens import SEQ, SMALL
from test_repair_tokens import _encoder as token_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load, load_proto
from quantscope.report.summary import auto_rewrites, headline, sample_size
from quantscope.rewrites.auto import AutoChoice, Measured, choose_rewrites
from quantscope.tasks.shares import share_counts
from quantscope.units import counted

GATE = "boxes=points:scale=12,order=channels,where=prob:1>{}"


def _saved(folder: Path, head: str) -> tuple[Path, Path]:
    onnx.save(_model(head), folder / "m.onnx")
    np.savez(folder / "d.npz", x=_logits())
    return folder / "m.onnx", folder / "d.npz"


# ---- 1. the axis beside the per-channel figures ------------------------------------------

def test_evaluate_says_the_axis_beside_the_worst_channel_and_collapsed(tmp_path, capsys):
    """Declared ctc: the line had ``sqnr_db_channel_min 0.0 dB, collapsed_channels 1`` and
    no word of which axis; it says the classes, from the entry's line (not recomputed)."""
    m, d = _saved(tmp_path, "linear")
    args = [str(m), "--data", str(d)]
    assert main(["calibrate", *args, "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "s.npz"), "--precision",
                 "a8_w8", "--layout", "logits=ctc", "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    entry = json.loads((tmp_path / "e.json").read_text())["outputs"]["logits"]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  output logits: ")]
    assert f"collapsed_channels 1 (per channel on {entry['channel_axis_read']})" in line, line
    assert entry["channel_axis_read"] == (f"axis 2, {C} channels: the classes of the "
                                          "declared ctc layout")
    assert line.count("per channel on") == 1


def _run(model: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["run", str(model), "--data", str(data), "--target", "hailo8", "--out",
                 str(out), "--rewrites", "none", *extra])


def test_run_says_which_axis_the_worst_channel_headline_is_on(tmp_path, capsys):
    """Tensor data, ``Mul(x, 1)``: the headline is the worst channel's SQNR, read on axis 1
    by default ([N, T, C]: the time steps); the verdict gave the figure alone. Now a
    ``channels (plan, held out)`` line says the output, its worst channel and the axis,
    and the report's "Every output" fold says it once per output."""
    m, d = _saved(tmp_path, "scaled")
    assert _run(m, d, tmp_path / "R") == 0
    text = capsys.readouterr().out
    v = json.loads((tmp_path / "R" / "verdict.json").read_text())
    assert v["metric"] == "sqnr_db_channel_min"
    (said,) = v["channels_read"]
    assert said.startswith("output 'logits' worst channel ") and said.endswith(
        f": per channel on axis 1, {T} channels: by default (the graph tells no channel "
        "axis of this output)"), said
    assert f"  channels (plan, held out): {said}" in text.splitlines(), text
    page = (tmp_path / "R" / "report.html").read_text()
    fold = page[page.index("Every output ("):]
    fold = fold[:fold.index("</details>")]
    assert fold.count(f"output &#x27;logits&#x27;: per channel on axis 1, {T} channels: by "
                      "default") == 1, fold
    assert "worst-channel SQNR</th>" in fold and "collapsed channels</th>" in fold


def test_an_output_scored_for_fidelity_only_says_its_axis_on_its_warning(tmp_path, capsys):
    """The MatMul head is named as likely CTC and scored for fidelity only: its warning
    gives its worst channel at the plan and at a8_w8, now with the axis, and the output
    is not said a second time on a ``channels`` line."""
    m, d = _saved(tmp_path, "linear")
    assert _run(m, d, tmp_path / "R") == 0
    text = capsys.readouterr().out
    v = json.loads((tmp_path / "R" / "verdict.json").read_text())
    (line,) = v["unscored_figures"]
    assert line.endswith(f"at uniform a8_w8; per channel on axis 2, {C} channels: the "
                         "graph's channel axis of this output"), line
    assert f"  warning: {line}" in text.splitlines()
    assert v["channels_read"] == []


# ---- 2. no held-out sample judged; the auto line's count -----------------------------------

@pytest.fixture(scope="module")
def pnet(tmp_path_factory):
    """P-Net-like, its samples ordered by their highest face score (the fit half first):
    ``(folder, the fit half's scores, the held-out half's)``."""
    folder = tmp_path_factory.mktemp("pnet65")
    return folder, *ordered_pnet(folder, "pnet.npz")


def test_no_held_out_sample_judged_is_said_so_not_n_of_all(tmp_path_factory):
    """The held-out half holds no face above the gate: the headline had said ``— (n=6
    held-out samples; ...)``. The run (``pnet``'s samples, gated between the held-out
    half's highest score and the fit half's, ``--goal 0.97``) is the one
    test_h62_no_figure.py reads too: made once (gate_fit_only_run)."""
    out, text = fit_only_run(tmp_path_factory)
    v = json.loads((out / "verdict.json").read_text())
    assert v["headline"]["judged"] == 0 and v["headline"]["n"] == 6, v["headline"]
    head = next(line for line in text.splitlines() if line.startswith("verdict:"))
    assert "NOT reached on the held-out data: no figure (n=0 of 6 held-out samples " \
           "judged; " in head, head


def test_a_share_of_nothing_counts_none():
    """No sample holds an item: 0 items in 0 samples (the samples' count had been read)."""
    got = share_counts("point_agreement", np.zeros(4), np.zeros(4))
    assert got == {"point_agreement_items": 0.0, "point_agreement_clusters": 0.0}
    assert counted("point_agreement", {"point_agreement": float("nan"), **got}) == \
        "— (none judged)"
    v = {"metric": "point_agreement", "held_out": {"samples": 18, "unit": "samples"},
         "quality": {"plan": {"point_agreement": float("nan"), **got}}, "legal": True}
    assert sample_size(v) == "n=0 of 18 held-out samples judged"
    assert headline(v)["judged"] == 0


def test_the_auto_line_counts_the_samples_the_figure_judged(tmp_path, capsys):
    """tokensplit binds on the small encoder and is measured; the measure judged 3 of the
    16 fit samples (a gate's): the record and its line say so, not ``n=16 fit samples``."""
    model = load_proto(token_encoder(), "enc")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (16, SEQ)).astype(np.int64),
             attention_mask=np.ones((16, SEQ), np.int64))
    fit = stages.at_length(stages.open_data(tmp_path / "x.npz", model, show=False), SEQ)
    choice, _ = choose_rewrites(model, SMALL, SEQ,
                                calibrate=lambda m: stages.calibrate_model(m, fit),
                                measure=lambda m, s: Measured(0.9, judged=3),
                                reload=lambda p: load_proto(p, "enc"),
                                metric="point_agreement", n=16, unit="fit samples",
                                progress=True)
    assert any(t.tried for t in choice.trials) and choice.judged == 3
    said = [ln for ln in capsys.readouterr().err.splitlines() if "tokensplit: dropped (" in ln]
    assert said and "90.0 %, n=3 of 16 judged)" in said[0], said  # it had said n=16
    record = json.loads(json.dumps(choice.to_dict()))
    assert AutoChoice.from_dict(record) == choice
    short = auto_rewrites(record)["short"]
    assert short.startswith("auto: kept 0 of 1 tried, point_agreement on n=3 of 16 fit "
                            "samples judged"), short
    nothing = {**record, "trials": [{**t, "tried": False} for t in record["trials"]]}
    assert auto_rewrites(nothing)["short"] == "auto: none tried, nothing measured"


def test_the_run_measure_gives_the_samples_a_gate_judged(pnet):
    """The run's measure on the fit half: the samples holding a point the gate keeps."""
    from quantscope.pipeline.auto import max_legal_measure
    from quantscope.targets import load_target
    from quantscope.tasks.layout_spec import parse_layout

    folder, fit_scores, held = pnet
    t = float((np.sort(fit_scores)[2] + np.sort(fit_scores)[3]) / 2)  # 3 of the first 6
    model = load(str(folder / "pnet.onnx"))
    data = stages.open_data(str(folder / "pnet.npz"), model, show=False,
                            layout=(parse_layout(GATE.format(f"{t:.6f}")),))
    stats = stages.calibrate_model(model, data, progress=False)
    got = max_legal_measure(data, load_target("hailo8"), "point_agreement", seq_len=None)(
        model, stats)
    passing = int(np.sum(np.concatenate([fit_scores, held]) > t))
    assert 0 < passing < 12 and got.judged == passing, (got.judged, passing)


# ---- 3. the axes of a detection's score output and of a map's channels -------------------

def _detector(tmp_path: Path, first: int = 5) -> tuple[Path, Path]:
    """Boxes ``[N, 8, 4]`` (0..640 px) and class scores ``[N, 8, 3]`` made by a Concat of
    two levels (``first`` and 8 - first anchors) on the anchors (the graph's axis of
    ``scores``: 1); class
    2 stays under 0.0015, under half an 8-bit step of the scores' 0..1 (every value
    quantizes to 0)."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["b", "one"], ["boxes"]),
         helper.make_node("Concat", ["s1", "s2"], ["scores"], axis=1)], "ssd",
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 8, 4]),
         helper.make_tensor_value_info("s1", TensorProto.FLOAT, ["N", first, 3]),
         helper.make_tensor_value_info("s2", TensorProto.FLOAT, ["N", 8 - first, 3])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 8, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 8, 3])],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, tmp_path / "ssd.onnx")
    r = np.random.default_rng(5)
    b = np.concatenate([r.uniform(40, 600, (24, 8, 2)), r.uniform(10, 40, (24, 8, 2))], -1)
    s = [np.concatenate([r.uniform(0, 1, (24, a, 2)), r.uniform(0, 0.0015, (24, a, 1))], -1)
         for a in (first, 8 - first)]
    np.savez(tmp_path / "ssd.npz", b=b.astype(np.float32), s1=s[0].astype(np.float32),
             s2=s[1].astype(np.float32))
    return tmp_path / "ssd.onnx", tmp_path / "ssd.npz"


def test_a_detections_score_output_is_read_on_its_classes_not_its_anchors(tmp_path, capsys):
    """Before: ``scores`` read on axis 1 (its 8 anchors, the Concat's axis), no channel
    collapsed though class 2 quantizes to 0 everywhere. Now its classes, and the class the
    grid erases is counted."""
    m, d = _detector(tmp_path)
    args = [str(m), "--data", str(d)]
    assert main(["calibrate", *args, "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "s.npz"), "--precision",
                 "a8_w8", "--layout", "boxes=detect:axis=2,scores_from=scores",
                 "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    entry = json.loads((tmp_path / "e.json").read_text())["outputs"]["scores"]
    assert entry["channel_axis"] == 2, entry
    assert entry["channel_axis_read"] == ("axis 2, 3 channels: the class scores of its "
                                          "detection layout (scores_from=)")
    assert entry["collapsed_channels"] == 1 and entry["channel_worst"] == 2, entry
    boxes = json.loads((tmp_path / "e.json").read_text())["outputs"]["boxes"]
    assert boxes["channel_axis_read"].endswith(  # its scores are not its rows (h70)
        "the rows (box values; its scores in another output, scores_from=) of its "
        "detection layout")
    assert "per channel on axis 2, 3 channels: the class scores" in out


def test_a_score_output_a_declared_layout_reads_gets_no_guessed_task_of_its_own(tmp_path,
                                                                                capsys):
    """The score levels' Concat whose first level has 4 anchors looks like a Concat of 4
    box rows and score rows: ``scores``, read by the declared layout's ``scores_from=``,
    was also read as a detection head of its own (its 8 anchors as 4 box rows and 4 score
    rows), a second F1 the headline took the worse of."""
    m, d = _detector(tmp_path, first=4)
    args = [str(m), "--data", str(d)]
    assert main(["calibrate", *args, "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "s.npz"), "--precision",
                 "a8_w8", "--layout", "boxes=detect:axis=2,scores_from=scores",
                 "--json", str(tmp_path / "e.json")]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "e.json").read_text())
    assert not any(k.endswith(":scores") for k in doc["metrics"]), list(doc["metrics"])
    assert not any("output 'scores' read as detections" in n for n in doc["notes"])
    assert doc["outputs"]["scores"]["channel_axis"] == 2


def test_a_map_with_a_channel_tells_the_axis_it_reads(tmp_path, capsys):
    """``prob=map:channel=1``: the entry said the graph's axis; it says the map's channels
    (the axis channel=1 indexes). Without ``channel=`` the map decides each value alone,
    and its maps are still its channels: the layout claims them (h73; it had told none,
    the graph's axis was read and said to be the graph's)."""
    folder = tmp_path
    onnx.save(_pnet_like(), folder / "pnet.onnx")
    x = np.random.default_rng(3).uniform(-1, 1, (8, 3, 16, 16)).astype(np.float32)
    np.savez(folder / "pnet.npz", input=x)
    args = [str(folder / "pnet.onnx"), "--data", str(folder / "pnet.npz")]
    assert main(["calibrate", *args, "--out", str(folder / "s.npz")]) == 0

    def read(layout: str) -> str:
        assert main(["evaluate", *args, "--stats", str(folder / "s.npz"), "--precision",
                     "a8_w8", "--layout", layout, "--json", str(folder / "e.json")]) == 0
        capsys.readouterr()
        return json.loads((folder / "e.json").read_text())["outputs"]["prob"][
            "channel_axis_read"]

    assert read("prob=map:channel=1") == ("axis 1, 2 channels: the channels of its map "
                                          "layout (channel=1 is one)")
    assert read("prob=map") == ("axis 1, 2 channels: the maps of its map layout (each "
                                "value decided alone, each map a channel)")
