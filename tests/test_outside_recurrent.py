"""Recurrent encoders (GRU, LSTM) outside the zoo: audio and sequence models.

A bidirectional GRU over ``x [T, N, F]`` whose outputs are its sequence ``Y [T, 2, N, H]``
and its final state ``Y_h [2, N, H]`` (the samples on axis 2 and 1). The per-channel
figures are per hidden unit (the last axis of every recurrent output), not per time step
or direction. Real ORT sessions on a real QDQ model; the CLI through ``main``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope import stages
from quantscope.cli import main
from quantscope.emulate.evaluate import run_model
from quantscope.model.axes import channel_axes
from quantscope.model.load import load_proto
from quantscope.numerics import channel_sqnr_db
from quantscope.types import Plan, Precision

T, F, H, N = 12, 8, 16, 32


def bigru(seed: int = 21) -> onnx.ModelProto:
    r = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("W", r.normal(0, 0.3, (2, 3 * H, F)).astype(np.float32)),
        ("R", r.normal(0, 0.3, (2, 3 * H, H)).astype(np.float32)),
        ("B", r.normal(0, 0.1, (2, 6 * H)).astype(np.float32)))]
    node = helper.make_node("GRU", ["x", "W", "R", "B"], ["Y", "Y_h"], hidden_size=H,
                            direction="bidirectional")
    graph = helper.make_graph(
        [node], "bigru", [helper.make_tensor_value_info("x", 1, [T, "N", F])],
        [helper.make_tensor_value_info("Y", 1, [T, 2, "N", H]),
         helper.make_tensor_value_info("Y_h", 1, [2, "N", H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_recurrent_outputs_are_per_hidden_unit():
    axes = channel_axes(load_proto(bigru(), "bigru"))
    assert axes["Y"] == 3 and axes["Y_h"] == 2


def test_gru_channel_figures_are_per_hidden_unit(tmp_path, capsys):
    """Each output's ``sqnr_db_channel_min`` is the worst hidden unit's SQNR, computed here
    with ORT on the QDQ model; before, it was the worst time step's (``Y``) or direction's
    (``Y_h``): the default rule's axis 1 of the sample-first tensor."""
    onnx.save(bigru(), tmp_path / "gru.onnx")
    x = np.random.default_rng(5).normal(0, 1, (T, N, F)).astype(np.float32)
    np.savez(tmp_path / "gru.npz", x=x)
    assert main(["calibrate", str(tmp_path / "gru.onnx"), "--data", str(tmp_path / "gru.npz"),
                 "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["evaluate", str(tmp_path / "gru.onnx"), "--data", str(tmp_path / "gru.npz"),
                 "--stats", str(tmp_path / "stats.npz"), "--precision", "a8_w8",
                 "--json", str(tmp_path / "ev.json")]) == 0
    outs = json.loads((tmp_path / "ev.json").read_text())["outputs"]

    model = stages.open_model(str(tmp_path / "gru.onnx"))
    stats = stages.read_stats(str(tmp_path / "stats.npz"))
    q = stages.qdq_for_plan(model, stats, Plan.uniform(Precision.A8_W8))[0]
    ref = run_model(model.proto, [{"x": x}]).batches[0]
    test = run_model(q, [{"x": x}]).batches[0]
    for name, r, t in zip(("Y", "Y_h"), ref, test, strict=True):
        hidden = channel_sqnr_db(r, t, r.ndim - 1)
        assert abs(outs[name]["sqnr_db_channel_min"] - hidden.min()) < 1e-3, name
        steps = channel_sqnr_db(r, t, 0)  # per time step (Y) / direction (Y_h): not these
        assert abs(outs[name]["sqnr_db_channel_min"] - steps.min()) > 0.1, name


def test_batch_first_lstm_is_refused_in_one_line_naming_the_fix(tmp_path, capsys):
    """An LSTM with ``layout=1`` (``X [N, T, F]``): ONNX Runtime's CPU kernel refuses it
    when the session is made. Before, ``run`` printed ORT's log line and an error cut at
    200 characters mid-word (``... OpKernelInfo&) la)``) that named neither the node nor a
    fix; now one line names the node, why, and how to export it, and no folder is made."""
    r = np.random.default_rng(3)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("W", r.normal(0, 0.3, (1, 4 * H, F)).astype(np.float32)),
        ("R", r.normal(0, 0.3, (1, 4 * H, H)).astype(np.float32)))]
    node = helper.make_node("LSTM", ["x", "W", "R"], ["Y", "Y_h"], hidden_size=H, layout=1,
                            name="encoder")
    graph = helper.make_graph(
        [node], "lstm", [helper.make_tensor_value_info("x", 1, ["N", T, F])],
        [helper.make_tensor_value_info("Y_h", 1, ["N", 1, H])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    onnx.save(proto, tmp_path / "lstm.onnx")
    np.savez(tmp_path / "lstm.npz", x=r.normal(0, 1, (N, T, F)).astype(np.float32))
    code = main(["run", str(tmp_path / "lstm.onnx"), "--data", str(tmp_path / "lstm.npz"),
                 "--target", "hailo8", "--out", str(tmp_path / "W")])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("quantscope: error")]
    assert len(lines) == 1, err
    assert "LSTM 'encoder'" in lines[0] and "layout=1" in lines[0]
    assert "export with layout=0" in lines[0]
    assert not (tmp_path / "W").exists()


def test_analyze_says_the_gru_weights_stay_float(tmp_path, capsys):
    """``analyze`` measured the GRU's layers with its W/R/B float and said nothing of it
    (``evaluate`` and ``run`` did); its console and JSON notes now say which weights stay
    float at the low precision and why. A promotion that gains is written ``+1.5 dB``, not
    ``++1.5 dB``; one that loses is no offender (not listed since stop 59)."""
    from dataclasses import replace

    from quantscope.analyze.report import Offender, analysis_from_dict, summary_text

    onnx.save(bigru(), tmp_path / "gru.onnx")
    x = np.random.default_rng(6).normal(0, 1, (T, 16, F)).astype(np.float32)
    np.savez(tmp_path / "gru.npz", x=x)
    assert main(["calibrate", str(tmp_path / "gru.onnx"), "--data", str(tmp_path / "gru.npz"),
                 "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["analyze", str(tmp_path / "gru.onnx"), "--data", str(tmp_path / "gru.npz"),
                 "--stats", str(tmp_path / "stats.npz"), "--target", "hailo8",
                 "--out", str(tmp_path / "an.json")]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "an.json").read_text())
    (note,) = [n for n in doc["notes"] if n.startswith("left float")]
    assert "weight W (GRU), weight R (GRU), weight B (GRU)" in note
    assert "not quantized by the emulator" in note and f"note: {note}" in out

    a = analysis_from_dict(doc)
    text = summary_text(replace(a, offenders=(Offender("GRU_0", 1.5, ()),)))
    assert "GRU_0  (+1.5 dB)" in text
    text = summary_text(replace(a, offenders=(Offender("GRU_0", -1.5, ()),)))
    assert "GRU_0" not in text


def test_a_small_clipped_share_is_not_written_as_zero():
    """A bidirectional GRU's sequence output clipped 0.02 % of its held-out values and the
    verdict warned ``clips 0.0% of its held-out values``; the share is written to 0.01 %
    as ``evaluate``'s saturation line writes it (saturation lists shares from 0.01 %)."""
    from quantscope.pipeline.verdict import _saturated_outputs

    row = {"tensor": "Y", "below": 0.0002, "above": 0.0, "range_min": -0.94,
           "range_max": 0.96, "data_min": -0.97, "data_max": 0.96}
    (line,) = _saturated_outputs({"saturation": {"tensors": [row]}}, [{"tensor": "Y"}])
    assert line.startswith("output 'Y' clips 0.02% of its held-out values")


def _dynamic_time() -> onnx.ModelProto:
    """``bigru`` exported with a variable length: ``x [T, N, F]``, two symbolic dims."""
    proto = bigru()
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "T"
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "T"
    return proto


def test_the_samples_of_a_variable_length_gru_are_its_batch_dim():
    """``x [T, N, F]``: both dims symbolic. The first input's axis 0 was taken (the 12
    time steps as samples), and ``run`` then died with ``internal error: IndexError``; the
    GRU's X input says its samples are on axis 1 (layout 0), and the outputs keep N."""
    from quantscope.tasks.tensors import find_layout

    model = load_proto(_dynamic_time(), "gru")
    x = np.zeros((T, N, F), np.float32)
    layout = find_layout(model, {"x": x})
    assert layout.axes == {"x": 1} and layout.out_axes == (2, 1)


def test_a_declared_time_axis_is_refused_naming_the_batch_axis(tmp_path, capsys):
    """``--batch-axis x=0`` on ``x [T, N, F]``: the outputs carry N, not T, so every cut
    of the samples cut the outputs along another dim (an IndexError deep in the analysis).
    Now one line says so and names the axis to declare; no folder is made."""
    onnx.save(_dynamic_time(), tmp_path / "gru.onnx")
    np.savez(tmp_path / "gru.npz", x=np.zeros((T, N, F), np.float32))
    code = main(["run", str(tmp_path / "gru.onnx"), "--data", str(tmp_path / "gru.npz"),
                 "--batch-axis", "x=0", "--target", "hailo8", "--out", str(tmp_path / "W")])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err and "internal error" not in err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("quantscope: error")]
    assert "dimension 'T'" in line and "--batch-axis x=1 (its dimension 'N'" in line
    assert not (tmp_path / "W").exists()


def test_the_data_note_names_an_output_batched_on_another_axis(tmp_path):
    """Inputs sample-first, an output ``Y_h [2, N, H]`` batched on axis 1: the data note
    read ``note: gru.npz: `` (nothing after the colon); it now names the output."""
    from quantscope.stages.open import open_data

    proto = bigru()
    del proto.graph.output[0]  # Y_h only
    x_in = proto.graph.input[0]
    x_in.name = "xs"
    dims = x_in.type.tensor_type.shape.dim
    dims[0].dim_param, dims[1].dim_value = "N", T  # xs [N, T, F] -> Transpose -> x
    proto.graph.node.insert(0, helper.make_node("Transpose", ["xs"], ["x"], perm=[1, 0, 2]))
    model = load_proto(proto, "gru")
    # not all zeros: an input of one value gets a note of its own (h45)
    xs = np.random.default_rng(0).normal(0, 1, (N, T, F)).astype(np.float32)
    np.savez(tmp_path / "x.npz", xs=xs)
    ds = open_data(str(tmp_path / "x.npz"), model, show=False)
    (note,) = [n for n in ds.notes if n.startswith(str(tmp_path / "x.npz"))]
    assert note.endswith(": output 'Y_h' is batched on axis 1"), note


def test_a_guess_between_two_symbolic_dims_is_said(tmp_path):
    """A time-major ``x [T, N, F]`` read by a MatMul into ``y [T, N, C]``: nothing in the
    graph tells T from N, and axis 0 was taken without a word; a note now says which was
    taken and how to declare another."""
    from quantscope.stages.open import open_data

    r = np.random.default_rng(4)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "tm",
        [helper.make_tensor_value_info("x", 1, ["T", "N", F])],
        [helper.make_tensor_value_info("y", 1, ["T", "N", 4])],
        [numpy_helper.from_array(r.normal(0, 1, (F, 4)).astype(np.float32), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    np.savez(tmp_path / "x.npz", x=np.zeros((T, N, F), np.float32))
    ds = open_data(str(tmp_path / "x.npz"), load_proto(proto, "tm"), show=False)
    (note,) = [n for n in ds.notes if "symbolic dims" in n]
    assert "input 'x' [T, N, 8] has 2 symbolic dims the graph does not tell apart (T, N)" in note
    assert "axis 0 ('T')" in note and "--batch-axis x=K" in note
    ds = open_data(str(tmp_path / "x.npz"), load_proto(proto, "tm"), show=False,
                   batch_axes={"x": 1})
    assert not [n for n in ds.notes if "symbolic dims" in n]
    gru = open_data(str(tmp_path / "x.npz"), load_proto(_dynamic_time(), "gru"), show=False)
    assert not [n for n in gru.notes if "symbolic dims" in n]  # the GRU tells
    named = load_proto(proto, "tm")
    named.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch_size"
    named.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch_size"
    ds = open_data(str(tmp_path / "x.npz"), load_proto(named.proto, "tm"), show=False)
    assert not [n for n in ds.notes if "symbolic dims" in n]  # named as the samples
