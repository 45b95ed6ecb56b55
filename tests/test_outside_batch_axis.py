"""Inputs whose first axis is not the sample axis (issue: models beyond the zoo).

An LSTM whose state ``h, c [1, B, 8]`` carries the batch on axis 1, and a static streaming
export (``input [1, 64]``, ``state [2, 1, 16]``) that takes one sample per run: the sample
axis of each input is found from the model (or declared with ``--batch-axis``), every cut
of the data goes along it, and outputs batched on another axis are scored sample-first.
Real ORT sessions and real files throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from outside_models import feeds, lstm_state, mixed_scale_detector, static_streaming

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.types import QuantscopeError

N = 16


def _save(folder: Path, name: str, proto: onnx.ModelProto, data: dict[str, np.ndarray]
          ) -> tuple[str, str]:
    model, npz = folder / f"{name}.onnx", folder / f"{name}.npz"
    onnx.save(proto, model)
    np.savez(npz, **data)
    return str(model), str(npz)


def _unshared_state() -> onnx.ModelProto:
    """``lstm_state`` with the state's dims renamed (``h, c [L, M, 8]``): no symbolic dim
    tells that axis 1 of the state is the samples' axis, so only ``--batch-axis`` can."""
    proto = lstm_state()
    for vi in [*proto.graph.input, *proto.graph.output]:
        if vi.name in ("h", "c", "hn", "cn"):
            dims = vi.type.tensor_type.shape.dim
            dims[0].dim_param, dims[1].dim_param = "L", "M"
    return proto


# ---------------------------------------------------------------- the axis finder

def test_lstm_state_is_batched_on_the_shared_symbolic_dim():
    from quantscope.tasks.tensors import find_layout

    lay = find_layout(load_proto(lstm_state()), feeds("lstm_state", N))
    assert lay.axes == {"x": 0, "h": 1, "c": 1}
    assert lay.out_axes == (0, 1, 1)  # prob [B, 1], hn / cn [1, B, 8]
    assert lay.limit is None and not lay.plain
    assert "'h' on axis 1" in lay.describe()


def test_static_streaming_is_batched_where_the_data_fills_a_size_1_axis():
    from quantscope.tasks.tensors import find_layout

    lay = find_layout(load_proto(static_streaming()), feeds("static_streaming", N))
    assert lay.axes == {"input": 0, "state": 1}
    assert lay.out_axes == (0, 1)  # prob [1, 1], state_out [2, 1, 16]
    assert lay.limit == 1  # a static export: one sample per run


def test_sample_first_models_keep_the_plain_layout(tmp_path):
    from quantscope.tasks.tensors import find_layout, load_tensor_batches

    model = load_proto(mixed_scale_detector())
    assert find_layout(model, feeds("mixed_scale_detector", N)).plain
    _, npz = _save(tmp_path, "d", mixed_scale_detector(), feeds("mixed_scale_detector", 40))
    batches = load_tensor_batches(npz, model)
    assert [type(b) for b in batches] == [dict, dict]  # as before: plain dicts, axis 0
    assert [len(b["images"]) for b in batches] == [32, 8]


def test_declared_axis_wins_and_names_are_checked(tmp_path):
    from quantscope.tasks.tensors import find_layout, load_tensor_batches

    model = load_proto(_unshared_state())
    data = feeds("lstm_state", N)
    assert find_layout(model, data).axes == {"x": 0, "h": 0, "c": 0}
    lay = find_layout(model, data, {"h": 1, "c": -2, "hn": 1, "cn": 1})
    assert lay.axes == {"x": 0, "h": 1, "c": 1} and lay.out_axes == (0, 1, 1)
    _, npz = _save(tmp_path, "s", _unshared_state(), data)
    with pytest.raises(QuantscopeError, match="same sample count"):
        load_tensor_batches(npz, model)
    batches = load_tensor_batches(npz, model, batch_axes={"h": 1, "c": 1},
                                  batch_size=5)
    assert [b["h"].shape for b in batches] == [(1, 5, 8)] * 3 + [(1, 1, 8)]
    assert [b["x"].shape[0] for b in batches] == [5, 5, 5, 1]


# ---------------------------------------------------------------- cutting and joining

def test_batches_cut_and_join_along_each_inputs_own_axis(tmp_path):
    from quantscope.analyze.rows import density_batches, proxy_batches
    from quantscope.pipeline.data import _split_tensors
    from quantscope.stages import open_data
    from quantscope.types import batch_rows, take_rows

    data = feeds("lstm_state", N)
    model, npz = _save(tmp_path, "lstm", lstm_state(), data)
    ds = open_data(npz, load_proto(lstm_state()))
    (batch,) = ds.calibration
    assert batch_rows(batch) == N and batch["h"].shape == (1, N, 8)
    assert [take_rows(batch, slice(i, i + 8))["h"].shape for i in (0, 8)] == [(1, 8, 8)] * 2
    split = _split_tensors(ds)
    (fit,), (held,) = split.fit.calibration, split.held_out.calibration
    np.testing.assert_array_equal(held["h"], data["h"][:, N // 2:])
    np.testing.assert_array_equal(fit["c"], data["c"][:, : N // 2])
    proxy = proxy_batches([fit, held], 0.5)
    assert [p["h"].shape for p in proxy] == [(1, N // 2, 8)]
    np.testing.assert_array_equal(proxy[0]["h"], data["h"][:, ::2])
    noise = [np.arange(N // 2, dtype=float), np.zeros(N // 2)]
    picked, _ = density_batches([fit, held], noise, 0.25)
    assert sum(batch_rows(b) for b in picked) == sum(b["x"].shape[0] for b in picked)
    assert all(b["h"].shape[1] == b["x"].shape[0] for b in picked)


def test_static_model_never_gets_more_samples_per_run_than_it_takes(tmp_path):
    from quantscope.analyze.rows import proxy_batches
    from quantscope.stages import open_data

    _, npz = _save(tmp_path, "st", static_streaming(), feeds("static_streaming", N))
    ds = open_data(npz, load_proto(static_streaming()))
    assert len(ds.calibration) == N
    assert {b["state"].shape for b in ds.calibration} == {(2, 1, 16)}
    assert {b["state"].shape for b in proxy_batches(ds.calibration, 1.0)} == {(2, 1, 16)}
    assert "'state' is batched on axis 1" in ds.notes[-1]


def test_outputs_batched_on_axis_1_are_scored_sample_first(tmp_path):
    from quantscope.emulate.evaluate import run_model
    from quantscope.stages import open_data

    data = feeds("lstm_state", N)
    _, npz = _save(tmp_path, "lstm", lstm_state(), data)
    model = load_proto(lstm_state())
    ds = open_data(npz, model)
    out = run_model(model.proto, ds.evaluation)
    hn = out.concat("hn")
    assert hn.shape == (N, 1, 8)
    import onnxruntime as ort

    sess = ort.InferenceSession(model.proto.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    want = sess.run(["hn"], data)[0]  # [1, N, 8]
    np.testing.assert_allclose(hn, np.moveaxis(want, 1, 0), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the commands, end to end

@pytest.mark.parametrize("name", ["lstm_state", "static_streaming"])
def test_calibrate_evaluate_analyze_run_on_the_fixture(tmp_path, capsys, name):
    build = {"lstm_state": lstm_state, "static_streaming": static_streaming}[name]
    model, npz = _save(tmp_path, name, build(), feeds(name, N))
    stats, res, ana = (str(tmp_path / f) for f in ("s.npz", "r.json", "a.json"))
    assert main(["calibrate", model, "--data", npz, "--out", stats]) == 0
    out = capsys.readouterr()
    assert f"{N} samples" in out.out and "batched on axis 1" in out.err
    assert main(["evaluate", model, "--data", npz, "--stats", stats, "--precision", "a8_w8",
                 "--json", res]) == 0
    result = json.loads(Path(res).read_text())
    outputs = result["outputs"]
    assert set(outputs) == set(build().graph.output[i].name
                               for i in range(len(build().graph.output)))
    assert all(np.isfinite(v["sqnr_db"]) and v["sqnr_db"] > 20 for v in outputs.values())
    assert main(["analyze", model, "--data", npz, "--stats", stats, "--target", "hailo8",
                 "--out", ana]) == 0
    base = json.loads(Path(ana).read_text())["baselines"]["a8_w8"]
    # every output scored per sample: none left out for its batch lying on axis 1
    assert len([k for k in base if k.startswith("sqnr_db:")]) == len(outputs)
    capsys.readouterr()
    folder = tmp_path / "run"
    assert main(["run", model, "--data", npz, "--target", "hailo8", "--repairs", "none",
                 "--out", str(folder)]) == 0
    verdict = json.loads((folder / "verdict.json").read_text())
    assert "the first 8 samples" in verdict["evaluation"]
    assert "n=8 held-out samples" in capsys.readouterr().out


def test_declared_batch_axis_runs_a_model_the_finder_cannot_read(tmp_path, capsys):
    model, npz = _save(tmp_path, "u", _unshared_state(), feeds("lstm_state", N))
    stats = str(tmp_path / "s.npz")
    assert main(["calibrate", model, "--data", npz, "--out", stats]) == 2
    err = capsys.readouterr().err
    assert "same sample count" in err and len(err.strip().splitlines()) == 1
    assert main(["calibrate", model, "--data", npz, "--batch-axis", "h=1,c=1",
                 "--out", stats]) == 0
    assert main(["evaluate", model, "--data", npz, "--stats", stats, "--precision", "a8_w8",
                 "--batch-axis", "h=1", "--batch-axis", "c=1,hn=1,cn=1"]) == 0
    assert "output hn:" in capsys.readouterr().out


def test_sample_count_message_names_the_axes_when_the_counts_really_differ(tmp_path, capsys):
    data = feeds("lstm_state", N)
    data["h"] = data["h"][:, :-1]  # one state fewer than inputs, on the sample axis
    model, npz = _save(tmp_path, "lstm", lstm_state(), data)
    assert main(["calibrate", model, "--data", npz, "--out", str(tmp_path / "s.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"is {N} in input 'x' but {N - 1} in input 'h' (axis 0 of 'x', axis 1 of 'h')" in err
    assert "--batch-axis" in err


# ---------------------------------------------------------------- bad --batch-axis values

BAD = [
    ("unknown-name", ["--batch-axis", "nope=1"], "'nope' is no input or output of the model "
     "(inputs: input, state; outputs: prob, state_out)"),
    ("axis-out-of-range", ["--batch-axis", "state=3"], "'state' has 3 axes"),
    ("axis-fixed-by-model", ["--batch-axis", "input=1"], "fixes that axis of 'input' at 64"),
    ("no-equals", ["--batch-axis", "state"], "'state' is no NAME=AXIS"),
    ("not-a-number", ["--batch-axis", "state=one"], "'state=one' is no NAME=AXIS"),
    ("two-axes", ["--batch-axis", "state=1", "--batch-axis", "state=0"],
     "gives 'state' two axes (1 and 0)"),
]


@pytest.mark.parametrize(("extra", "needle"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
@pytest.mark.parametrize("command", ["calibrate", "run"])
def test_bad_batch_axis_is_one_line_before_any_work(tmp_path, capsys, command, extra, needle):
    ws = tmp_path / "ws"
    ws.mkdir()
    model, npz = _save(ws, "st", static_streaming(), feeds("static_streaming", 4))
    before = {p.name: p.read_bytes() for p in ws.iterdir()}
    out = tmp_path / "out"
    argv = ([command, model, "--data", npz, *extra, "--out", str(out / "s.npz")]
            if command == "calibrate" else
            [command, model, "--data", npz, "--target", "hailo8", *extra, "--out", str(out)])
    if command == "calibrate":
        out.mkdir()
    code = main(argv)
    std = capsys.readouterr()
    lines = std.err.strip().splitlines()
    assert code == 2, std.err
    assert len(lines) == 1 and "Traceback" not in std.err, std.err
    assert lines[0].startswith("quantscope: error: ") and needle in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir()), "an output was written"
    assert {p.name: p.read_bytes() for p in ws.iterdir()} == before


# ---------------------------------------------------------------- repairs on such batches

def test_repairs_fit_on_as_many_samples_and_cut_along_each_axis(tmp_path, capsys):
    from quantscope.stages import held_out, open_data

    _, npz = _save(tmp_path, "st", static_streaming(), feeds("static_streaming", 64))
    ds = open_data(npz, load_proto(static_streaming()))
    fit, scored, _ = held_out(ds, 1)  # one batch of 32 samples, as for any other model
    assert len(fit) == 32 and len(scored.evaluation) == 32
    # AdaRound runs its layers 8 samples at a time: the LSTM state is cut along axis 1
    model, npz = _save(tmp_path, "lstm", lstm_state(), feeds("lstm_state", 40))
    stats = str(tmp_path / "s.npz")
    assert main(["calibrate", model, "--data", npz, "--out", stats]) == 0
    assert main(["repair", model, "--data", npz, "--stats", stats, "--precision", "a8_w8",
                 "--repairs", "bias,adaround", "--out-model", str(tmp_path / "r.onnx"),
                 "--out-stats", str(tmp_path / "r.npz"),
                 "--out-plan", str(tmp_path / "r.json")]) == 0
    assert "adaround" in capsys.readouterr().out


def _state_only_input() -> onnx.ModelProto:
    """``x [B, 16]`` alone in; ``hn [1, B, 8]`` out: the inputs are sample-first, an
    output is not."""
    proto = lstm_state()
    graph = proto.graph
    h = next(i for i in graph.input if i.name == "h")
    c = next(i for i in graph.input if i.name == "c")
    graph.input.remove(h)
    graph.input.remove(c)
    lstm = next(n for n in graph.node if n.op_type == "LSTM")
    del lstm.input[5:]
    return proto


def test_an_output_batched_on_axis_1_of_sample_first_inputs_is_scored_per_sample(tmp_path):
    from quantscope.emulate.evaluate import run_model
    from quantscope.stages import open_data

    data = {"x": feeds("lstm_state", N)["x"]}
    _, npz = _save(tmp_path, "x", _state_only_input(), data)
    model = load_proto(_state_only_input())
    ds = open_data(npz, model)
    out = run_model(model.proto, ds.evaluation)
    assert out.concat("hn").shape == (N, 1, 8) and out.concat("prob").shape == (N, 1)


def test_static_model_analysis_subsets_take_every_kth_sample(tmp_path):
    from quantscope.analyze.rows import proxy_batches
    from quantscope.stages import open_data

    _, npz = _save(tmp_path, "st", static_streaming(), feeds("static_streaming", N))
    ds = open_data(npz, load_proto(static_streaming()))
    proxy = proxy_batches(ds.calibration, 0.25)
    assert len(proxy) == N // 4
    np.testing.assert_array_equal(proxy[1]["state"], ds.calibration[4]["state"])


def test_host_step_fixes_the_state_batch_dim_to_one():
    """``h [1, B, 8]`` beside ``x [B, T, 16]``: B is the samples' dim in both, so the
    compiler's shape of h is 1x1x8; it was printed 1xSx8 (the length put in its place)."""
    from quantscope.report.summary import host_steps

    inputs = [{"name": "x", "dtype": 1, "dims": ["B", "T", 16]},
              {"name": "h", "dtype": 1, "dims": [1, "B", 8]}]
    steps = host_steps(inputs, [], text=False, seq_len=None)
    assert steps == ["fix the symbolic dims (B, T) for the compiler: x=1xTx16, h=1x1x8 "
                     "(T: the size you compile for; the size rules were not checked at it: "
                     "give --input-shape)"]


def test_host_step_gives_the_input_shape_the_run_checked_at():
    """``run --input-shape x=1x7x32`` checks at 7 tokens; the host step said x=1xSx32."""
    from quantscope.report.summary import host_steps

    inputs = [{"name": "x", "dtype": 1, "dims": ["B", "S", 32]}]
    steps = host_steps(inputs, [], text=False, seq_len=None, shapes={"x": [1, 7, 32]})
    assert steps == ["fix the symbolic dims (B, S) for the compiler: x=1x7x32 "
                     "(x as --input-shape, the shape checked)"]


def _static_batch_dynamic_size() -> onnx.ModelProto:
    """``input [1, 3, H, W]`` -> Conv -> Sigmoid ``output [1, 1, H, W]``: a static batch of
    one with a dynamic picture size (tf2onnx, IS-Net's export)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(
        np.random.default_rng(0).normal(size=(1, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["t"], pads=[1, 1, 1, 1]),
         helper.make_node("Sigmoid", ["t"], ["output"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, "H", "W"])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_static_batch_of_one_with_a_dynamic_size_is_batched_on_axis_0(tmp_path, capsys):
    """The data fills the static-1 axis 0 with 4 pictures: that is the sample axis, not the
    symbolic height (which was taken, and the data then refused: "axis 0 is 4, the model's
    1")."""
    from quantscope.tasks.tensors import find_layout

    data = {"input": np.random.default_rng(1).normal(size=(4, 3, 8, 8)).astype(np.float32)}
    lay = find_layout(load_proto(_static_batch_dynamic_size()), data)
    assert lay.axes == {"input": 0} and lay.out_axes == (0,) and lay.limit == 1
    model, npz = _save(tmp_path, "s", _static_batch_dynamic_size(), data)
    assert main(["calibrate", model, "--data", npz, "--out", str(tmp_path / "st.npz")]) == 0
    assert (tmp_path / "st.npz").exists()


def test_a_model_failing_on_the_datas_size_is_one_line_naming_the_node(tmp_path, capsys):
    """A graph that fixes a size inside (a Reshape to 3 x 64: an 8 x 8 picture) given 16 x 16
    pictures: ONNX Runtime's failure is the data's, one line naming the node and the shapes
    fed (was an internal error), and no stats file."""
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array([1, 3, 64], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["input"], ["r"]),
         helper.make_node("Reshape", ["r", "shape"], ["output"], name="fixed_reshape")], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 64])], [shape])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = {"input": np.ones((2, 3, 16, 16), np.float32)}
    model, npz = _save(tmp_path, "f", proto, data)
    assert main(["calibrate", model, "--data", npz, "--out", str(tmp_path / "st.npz")]) == 2
    text = capsys.readouterr().err
    err = [ln for ln in text.splitlines() if ln.startswith("quantscope:")]
    assert len(err) == 1 and "node 'fixed_reshape'" in err[0] and "[1, 3, 16, 16]" in err[0]
    assert "internal error" not in err[0] and not (tmp_path / "st.npz").exists()
    assert "ONNXRuntimeError" not in text and "symbolic dims" not in text  # nor H guessed
