"""A symbolic axis is positions, not channels (h70). An output whose graph tells no channel
axis (made by a Mul, a Tanh, an Add) was read on axis 1 by default; where the model
declares that axis symbolic (a TTS's ``f0 [1, F]``, a sequence model's ``y [N, T, C]``),
its indexes are frames or tokens. h47 read them as positions only where the length varies
by sample; on data of one length (sentences padded to one length, their padding frames
held near 0 by FP32) each padding position was a "channel" that read collapsed and raised
``NOT LIKE FP32``. Now the default rule reads the last axis of fixed length (``[N, T, C]``
-> C), else no per-channel figure, with a note; a graph's axis or a task's claim wins as
before."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope import stages
from quantscope.analyze.measure import output_symbolic_axes, scorer_for
from quantscope.emulate.class_axes import AxisRead, read_axis
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Feeds, Plan, Precision

T, C, PAD = 12, 4, 5  # frames, features, padding frames at the end of each sample


def _model(dims: list, op: str = "Mul") -> onnx.ModelProto:
    """``x dims`` -> ``y dims``: ``x * 1.5`` (a graph input has no channel axis, nor has the
    Mul) or ``Tanh(x)``."""
    inits = [numpy_helper.from_array(np.array(1.5, np.float32), "w")]
    node = (helper.make_node("Mul", ["x", "w"], ["y"], name="gain") if op == "Mul"
            else helper.make_node("Tanh", ["x"], ["y"], name="squash"))
    g = helper.make_graph([node], "frames",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
                          inits if op == "Mul" else [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _frames(shape: tuple[int, ...]) -> tuple[dict[str, np.ndarray], ...]:
    """Six batches of one length: speech-like frames up to 400, the last ``PAD`` frames of
    each padding FP32 holds near 0 (-0.7 .. -0.2: 0 on an 8-bit grid of 400 / 255)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(6):
        x = rng.uniform(5, 400, shape).astype(np.float32)
        x[0, 0] = -3.0 if i == 0 else x[0, 0]
        x[:, T - PAD:] = rng.uniform(-0.7, -0.2, x[:, T - PAD:].shape)
        out.append({"x": x})
    return tuple(out)


def _evaluate(proto: onnx.ModelProto, data: tuple) -> dict:
    model = load_proto(proto, "frames")
    ds = Dataset(name="frames", calibration=data, evaluation=data)
    stats = stages.calibrate_model(model, ds)
    return stages.evaluate_plan(model, ds, stats, Plan.uniform(Precision.A8_W8))


def test_padding_frames_of_a_symbolic_axis_are_no_collapsed_channels():
    """``y [1, F]`` (hibari's ``f0``), every sample 12 frames, the last 5 padding: no
    ``NOT LIKE FP32``, no per-frame "channel", one note naming the axis and the dim."""
    res = _evaluate(_model([1, "F"]), _frames((1, T)))
    notes = res["notes"]
    assert not any(n.startswith("NOT LIKE FP32") for n in notes), notes
    assert not any("of axis 1" in n for n in notes), notes
    y = res["outputs"]["y"] if "outputs" in res else res["metrics"]
    assert y.get("collapsed_channels", 0) == 0 and "channel_worst" not in y
    said = [n for n in notes if "symbolic in the model" in n]
    assert len(said) == 1, notes
    assert "output 'y': axis 1 is symbolic in the model ('F')" in said[0]
    assert "read as positions" in said[0] and "6 samples" in said[0]


def test_a_symbolic_length_before_fixed_features_reads_the_features():
    """``y [N, T, C]`` by a Tanh (no channel axis): the 4 features are the channels, not the
    12 frames: the worst channel is a feature's (the padding frames spread over all)."""
    data = _frames((2, T, C))
    res = _evaluate(_model(["N", "T", C], "Tanh"), data)
    y = res["outputs"]["y"] if "outputs" in res else res["metrics"]
    assert y["channel_axis"] == 2
    assert y["channel_axis_read"].startswith("axis 2, 4 channels: by default, the last axis "
                                             "of fixed length")
    assert "axis 1 is symbolic in the model ('T')" in y["channel_axis_read"]
    assert not any(n.startswith("NOT LIKE FP32") for n in res["notes"]), res["notes"]


def test_a_static_axis_one_is_still_read_as_channels():
    """The same loss on ``y [1, 12]`` (a fixed axis) is a channel's, as before."""
    res = _evaluate(_model([1, T]), _frames((1, T)))
    assert any(n.startswith("NOT LIKE FP32") for n in res["notes"])
    assert not any("symbolic in the model" in n for n in res["notes"])


def test_the_rule_reads_claims_and_the_graph_first_and_moves_with_the_sample_axis():
    open_t = {1: "T"}
    assert read_axis((4, 12, 3), 1, None, open_t).axis == 1  # the graph's axis wins
    assert read_axis((4, 12, 3), None, None, open_t).axis == 2
    assert read_axis((4, 12), None, None, open_t) == AxisRead(1, "", "T")
    assert read_axis((4, 12, 3), None, None, {1: "T", 2: "?"}) == AxisRead(1, "", "T")
    assert read_axis((4, 3, 12), None, None, {2: "T"}).axis == 1  # not the default's axis
    assert read_axis((4, 12), None, None, {1: "T", 2: "C"}).axis == 1  # another rank's
    # --batch-axis: y [T, N, C] with its samples on axis 1 is [N, T, C] sample-first
    model = load_proto(_model(["T", "N", C]), "frames")
    batch = Feeds({"x": np.zeros((T, 2, C), np.float32)}, {"x": 1}, (1,))
    assert output_symbolic_axes(model, [batch]) == {"y": {1: "T"}}
    assert output_symbolic_axes(model) == {"y": {1: "N"}}  # samples on axis 0: T is
    assert output_symbolic_axes(load_proto(_model([1, T]), "frames")) == {}


def test_the_analysis_worst_channel_is_not_a_padding_frame():
    """The analysis scorer reads the same axis (its worst channel the output's SQNR)."""
    model = load_proto(_model([1, "F"]), "frames")
    data = _frames((1, T))
    ds = Dataset(name="frames", calibration=data, evaluation=data)
    scorer = scorer_for(ds, model)
    ref = scorer.reduce([np.concatenate([d["x"] * 1.5 for d in data])], {})
    test = ref.copy()
    test[:, T - PAD:] = 0.0  # the padding frames rounded to 0
    out = scorer.score(ref, test)
    assert out["sqnr_db_channel_min"] == out["sqnr_db"]
